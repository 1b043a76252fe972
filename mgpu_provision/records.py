"""Plain records: typed, frozen values read without pydantic, for the data every run reads on its hot path.

Importing pydantic and building its models costs a small run more than everything else it does (issue 41:
~0.15 CPU-s of a local plan's ~0.45). Two kinds of data are read on every run and need none of its power:

- the agent's `facts` reply (`facts.py`): its classes are `Record`s, declared as pydantic models are (typed
  class attributes, `Field(default, description=...)`), and `model_validate` checks a reply against the
  annotations with a small reader: the types the contract uses (str, int, float, bool, None, list, tuple,
  dict, Literal, unions, nested records, Any), unknown keys ignored, ints taken where a float is declared,
  errors named by their path in pydantic's words (`gpus.0.index: Field required`);
- a valid rig file (`rig/plain.py`): pydantic validates it once, then its models become `Record`s holding
  the same values (`Record.from_values`), which the rig cache pickles and a later run unpickles without
  pydantic.

Both answer the part of pydantic's model API the code and its tests use on them (`model_validate`,
`model_dump`, `model_dump_json`, `model_copy`, `model_fields_set`), so a record and a model read alike.
Types are resolved on a class's first validation, not at import: a run that only unpickles records never
evaluates an annotation.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal, TypeVar, Union

R = TypeVar("R", bound="Record")
_MISSING: Any = object()
# Where a value is (field names and list indices) and what is wrong with it, as pydantic says it.
Problems = list[tuple[tuple[Any, ...], str]]
Reader = Callable[[Any, tuple[Any, ...], Problems], Any]


class FieldInfo:
    """A field's default (or default factory) and description, as `Field(...)` declares it."""

    __slots__ = ("default", "default_factory", "description")

    def __init__(
        self, default: Any, default_factory: Callable[[], Any] | None, description: str | None
    ) -> None:
        self.default, self.default_factory, self.description = default, default_factory, description

    def make_default(self) -> Any:
        return self.default_factory() if self.default_factory is not None else self.default


def Field(
    default: Any = _MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    description: str | None = None,
) -> Any:
    """A field with a default (none: required) or a default factory, and its description."""
    return FieldInfo(default, default_factory, description)


class RecordError(ValueError):
    """A value that does not fit a record's annotations: every problem, with its path (pydantic's shape)."""

    def __init__(self, problems: Problems) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, loc)) or 'value'}: {msg}" for loc, msg in problems))
        self.problems = problems

    def errors(self) -> list[dict[str, Any]]:
        """The problems as pydantic's `ValidationError.errors()` lists them (loc, msg)."""
        return [{"loc": loc, "msg": msg} for loc, msg in self.problems]


class Record:
    """A frozen value with named fields. Subclasses declare fields as typed class attributes; a record made
    by `from_values` (a rig model's values) has the fields it was given."""

    # The values live in the instance's dict (fields only), which fields set explicitly beside it.
    __slots__ = ("__dict__", "_fields_set")
    __record_fields__: ClassVar[dict[str, FieldInfo]] = {}
    __record_readers__: ClassVar[dict[str, Reader] | None] = None
    _fields_set: frozenset[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, FieldInfo] = {}
        for base in reversed(cls.__mro__[1:]):
            fields.update(getattr(base, "__record_fields__", {}))
        for name in inspect.get_annotations(cls):
            if name.startswith("_"):
                continue
            declared = cls.__dict__.get(name, _MISSING)
            info = declared if isinstance(declared, FieldInfo) else FieldInfo(declared, None, None)
            fields.pop(name, None)  # a redeclared field keeps its place from the base, as pydantic's does
            fields[name] = info
            if name in cls.__dict__:
                delattr(cls, name)  # the instance's value, never the declaration, answers `record.name`
        cls.__record_fields__ = fields
        cls.__record_readers__ = None

    def __init__(self, **values: Any) -> None:
        problems: Problems = []
        self._fill(values, (), problems)
        if problems:
            raise RecordError(problems)

    # --- reading -------------------------------------------------------------------------------------------

    @classmethod
    def model_validate(cls: type[R], value: Any) -> R:
        """`value` (a mapping, or already such a record) read against the annotations; RecordError else."""
        problems: Problems = []
        found = cls._read(value, (), problems)
        if problems:
            raise RecordError(problems)
        return found  # type: ignore[no-any-return]

    @classmethod
    def _read(cls, value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
        if isinstance(value, cls):
            return value
        if isinstance(value, Record):
            value = value.model_dump()
        if not isinstance(value, dict):
            problems.append((loc, "Input should be a valid dictionary or instance of " + cls.__name__))
            return None
        record = cls.__new__(cls)
        record._fill(value, loc, problems)
        return record

    def _fill(self, values: dict[str, Any], loc: tuple[Any, ...], problems: Problems) -> None:
        cls = type(self)
        readers = cls.__record_readers__
        if readers is None and values:  # made at the first value read: a default-only record needs none
            readers = cls._readers()
        state: dict[str, Any] = {}
        given = set()
        for name, info in cls.__record_fields__.items():
            if name in values:
                state[name] = readers[name](values[name], (*loc, name), problems)  # type: ignore[index]
                given.add(name)
            elif info.default is _MISSING and info.default_factory is None:
                problems.append(((*loc, name), "Field required"))
            else:
                state[name] = info.make_default()
        object.__setattr__(self, "__dict__", state)
        object.__setattr__(self, "_fields_set", frozenset(given))

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        found: dict[str, Reader] = {}
        for base in reversed(cls.__mro__):  # each field's annotation, in the module that declared it
            if issubclass(base, Record) and base is not Record:
                for name, hint in inspect.get_annotations(base).items():
                    if name in cls.__record_fields__:
                        found[name] = _reader_of(base.__module__, hint)
        readers = {name: found[name] for name in cls.__record_fields__}
        cls.__record_readers__ = readers
        return readers

    @classmethod
    def from_values(cls: type[R], values: dict[str, Any], fields_set: frozenset[str] = frozenset()) -> R:
        """A record holding `values` as they are (already validated elsewhere: a rig model's)."""
        record = cls.__new__(cls)
        object.__setattr__(record, "__dict__", dict(values))
        object.__setattr__(record, "_fields_set", frozenset(fields_set))
        return record

    # --- pydantic's model API, the part the code uses -------------------------------------------------------

    @property
    def model_fields_set(self) -> frozenset[str]:
        """The fields given explicitly (not left to their default)."""
        return self._fields_set

    def model_dump(self, mode: Literal["python", "json"] = "python") -> dict[str, Any]:
        return {name: _dump(value, mode) for name, value in self._values()}

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)

    def model_copy(self: R, update: dict[str, Any] | None = None) -> R:
        """A shallow copy with `update`'s values (not checked, as pydantic's model_copy does not)."""
        values = {name: value for name, value in self._values()}
        values.update(update or {})
        return type(self).from_values(values, self.model_fields_set | set(update or ()))

    def _values(self) -> Iterator[tuple[str, Any]]:
        # The instance's own dict also holds cached properties of a subclass: only fields are values.
        fields = type(self).__record_fields__ or self.__dict__
        return ((name, self.__dict__[name]) for name in fields if name in self.__dict__)

    # --- a frozen value ------------------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(f"{type(self).__name__} is frozen: {name} cannot be set")

    def __delattr__(self, name: str) -> None:
        raise TypeError(f"{type(self).__name__} is frozen: {name} cannot be deleted")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return dict(self._values()) == dict(other._values())

    def __hash__(self) -> int:
        return hash((type(self), tuple(value for _, value in self._values())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in self._values())})"

    def __getstate__(self) -> dict[str, Any]:
        return {"values": dict(self._values()), "set": self._fields_set}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "__dict__", dict(state["values"]))
        object.__setattr__(self, "_fields_set", state["set"])


def _dump(value: Any, mode: str) -> Any:
    if isinstance(value, Record):
        return value.model_dump(mode)  # type: ignore[arg-type]
    if isinstance(value, list):
        return [_dump(v, mode) for v in value]
    if isinstance(value, tuple):
        items = [_dump(v, mode) for v in value]
        return items if mode == "json" else tuple(items)
    if isinstance(value, dict):
        return {k: _dump(v, mode) for k, v in value.items()}
    return value


# --- the reader: one function per annotation, made once per field ------------------------------------


@functools.cache
def _reader_of(module: str, hint: Any) -> Reader:
    """The reader of an annotation as written in `module` (many are written many times: `str | None`)."""
    if isinstance(hint, str):
        hint = eval(hint, vars(sys.modules[module]))
    return _reader(hint)


def _reader(hint: Any) -> Reader:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return lambda value, loc, problems: value
    if hint is type(None):
        return _exact(type(None), "Input should be None")
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint._read
    if hint is bool:
        return _exact(bool, "Input should be a valid boolean")
    if hint is str:
        return _exact(str, "Input should be a valid string")
    if hint is int:
        return _int
    if hint is float:
        return _float
    if origin is Literal:
        return _literal(args)
    if origin in (Union, types.UnionType):
        return _union([_reader(arg) for arg in args], type(None) in args)
    if origin is list:
        return _list(_reader(args[0]))
    if origin is tuple:
        return _tuple([_reader(arg) for arg in args])
    if origin is dict:
        return _dict(_reader(args[0]), _reader(args[1]))
    raise TypeError(f"records cannot read {hint!r}")


def _exact(kind: type, message: str) -> Reader:
    def read(value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
        if type(value) is not kind and not (kind is str and isinstance(value, str)):
            problems.append((loc, message))
        return value

    return read


def _int(value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    problems.append((loc, "Input should be a valid integer"))
    return value


def _float(value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
    if type(value) in (int, float):
        return float(value)
    problems.append((loc, "Input should be a valid number"))
    return value


def _literal(choices: tuple[Any, ...]) -> Reader:
    words = [repr(choice) for choice in choices]
    message = "Input should be " + (
        f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]
    )

    def read(value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
        if not any(value == choice and type(value) is type(choice) for choice in choices):
            problems.append((loc, message))
        return value

    return read


def _union(readers: list[Reader], optional: bool) -> Reader:
    def read(value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
        if value is None and optional:
            return None
        first: Problems = []
        for reader in readers:
            found: Problems = []
            result = reader(value, loc, found)
            if not found:
                return result
            first = first or found
        problems.extend(first)
        return value

    return read


def _list(item: Reader) -> Reader:
    def read(value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
        if not isinstance(value, (list, tuple)):
            problems.append((loc, "Input should be a valid list"))
            return value
        return [item(v, (*loc, i), problems) for i, v in enumerate(value)]

    return read


def _tuple(items: list[Reader]) -> Reader:
    def read(value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            problems.append((loc, f"Input should be a valid tuple of {len(items)} items"))
            return value
        pairs = enumerate(zip(items, value, strict=True))
        return tuple(item(v, (*loc, i), problems) for i, (item, v) in pairs)

    return read


def _dict(key: Reader, item: Reader) -> Reader:
    def read(value: Any, loc: tuple[Any, ...], problems: Problems) -> Any:
        if not isinstance(value, dict):
            problems.append((loc, "Input should be a valid dictionary"))
            return value
        return {key(k, (*loc, k), problems): item(v, (*loc, k), problems) for k, v in value.items()}

    return read
