"""typing_lite's NamedTuple (issue 41) makes the records the shipped code declares as typing.NamedTuple
makes them: the agent imports it instead of `typing`, and the control side pickles, compares and prints
those records (the rig cache holds TopoMatrix, plan's findings are Finding)."""

from __future__ import annotations

import pickle
import typing

import pytest

from mgpu_provision.catalog.topology import TopoMatrix
from mgpu_provision.judge.records import Finding
from mgpu_provision.typing_lite import NamedTuple


class Lite(NamedTuple):
    """A record."""

    name: str
    count: int = 1
    tags: tuple[str, ...] = ()

    def twice(self) -> int:
        return 2 * self.count

    @property
    def label(self) -> str:
        return f"{self.name}x{self.count}"


class Typed(typing.NamedTuple):
    """A record."""

    name: str
    count: int = 1
    tags: tuple[str, ...] = ()


def test_fields_defaults_methods_and_docstring_are_those_of_typing_namedtuple() -> None:
    lite, typed = Lite("a"), Typed("a")
    assert isinstance(lite, tuple) and tuple(lite) == tuple(typed) == ("a", 1, ())
    assert Lite._fields == Typed._fields and Lite._field_defaults == Typed._field_defaults
    assert list(Lite.__annotations__) == list(Typed.__annotations__)
    assert repr(Lite("b", 3)) == "Lite(name='b', count=3, tags=())"
    assert Lite("b", 3).twice() == 6 and Lite("b", 3).label == "bx3"
    assert Lite.__doc__ == "A record." and Lite.__name__ == "Lite"
    assert Lite.__module__ == __name__ and Lite.__qualname__ == "Lite"
    assert Lite("a")._replace(count=2) == ("a", 2, ()) and Lite("a")._asdict()["count"] == 1
    with pytest.raises(AttributeError):
        Lite("a").count = 2  # type: ignore[misc]


def test_a_field_without_a_default_after_one_with_is_refused_as_typing_does() -> None:
    with pytest.raises(TypeError, match="without a default follows"):

        class Bad(NamedTuple):
            first: int = 0
            second: int  # type: ignore[misc]


def test_shipped_records_are_typing_lites_and_pickle_by_name() -> None:
    finding = Finding("sxid", "message", "SXid 1", "no fatal SXid", advice="reset")
    assert type(finding).__mro__[1] is tuple  # a collections.namedtuple, not typing's
    assert pickle.loads(pickle.dumps(finding)) == finding
    matrix = TopoMatrix(("GPU0",), {})
    assert pickle.loads(pickle.dumps(matrix)) == matrix
