"""Shared pieces of the fuzz tests: example budgets (fast by default, long with MGPU_SLOW=1) and generators.

A fuzz test runs a hypothesis-driven check inside itself so that it can count the examples it really ran
and time the slowest one; both figures go into RELIABILITY.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.support.hosts import REPO
from tests.support.trial import SLOW, Trial

EXAMPLES = REPO / "examples"
TOPOLOGIES = REPO / "tests" / "fixtures" / "topologies"
# Every input must be answered within this many seconds (a parser that backtracks or expands aliases
# without bound would blow it).
PER_INPUT_LIMIT_S = 2.0


def budget(fast: int, slow: int = 5_000) -> settings:
    """Hypothesis settings for `fast` examples in the default run, `slow` with MGPU_SLOW=1."""
    return settings(
        max_examples=slow if SLOW else fast,
        deadline=None,  # timing is checked by `timed`, on the slowest input, with a message
        database=None,  # results must not depend on what an earlier run stored
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def timed(trial: Trial, check: Callable[..., None]) -> Callable[..., None]:
    """Wrap a per-example check so that it counts examples and records the slowest one."""

    def run(*args: Any) -> None:
        started = time.perf_counter()
        check(*args)
        elapsed = time.perf_counter() - started
        trial.count("examples")
        trial.figures["slowest_s"] = round(max(trial.figures.get("slowest_s", 0.0), elapsed), 3)
        assert elapsed < PER_INPUT_LIMIT_S, f"one input took {elapsed:.2f}s (limit {PER_INPUT_LIMIT_S}s)"

    return run


def json_values(text: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Any]:
    """Any JSON value, nested a few levels."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | (text if text is not None else st.text())
    )
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(text if text is not None else st.text(), inner, max_size=4)
        ),
        max_leaves=12,
    )


@st.composite
def mutated_bytes(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """One of `seeds` with a few bytes flipped, inserted, deleted or a slice duplicated."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 8))):
        where = draw(st.integers(0, max(len(data) - 1, 0)))
        how = draw(st.sampled_from(["flip", "insert", "delete", "duplicate", "truncate"]))
        if how == "flip" and data:
            data[where] ^= 1 << draw(st.integers(0, 7))
        elif how == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=8))
        elif how == "delete":
            del data[where : where + draw(st.integers(1, 16))]
        elif how == "duplicate":
            data[where:where] = data[where : where + draw(st.integers(1, 64))]
        else:
            del data[where:]
    return bytes(data)


def seed_files(folder: Path, pattern: str) -> list[bytes]:
    found = sorted(folder.glob(pattern))
    assert found, f"no seed files {pattern} in {folder}"
    return [path.read_bytes() for path in found]
