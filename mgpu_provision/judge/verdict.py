"""Every judgement of a box at once: what the node check runs over its own facts and the expectation file."""

from __future__ import annotations

from ..typing_lite import TYPE_CHECKING
from .containers import containers
from .driver import driver, fabricmanager, imex
from .files import files
from .health import health, kernel
from .inventory import inventory, pcie
from .records import Expectation, Finding
from .topology import topology

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Tuple

if TYPE_CHECKING:
    Judge = Callable[[Dict[str, Any], Expectation], List[Finding]]
# In the order plan lists its checks: what is wrong with the hardware before what software lacks.
JUDGES: Tuple[Judge, ...] = (
    inventory, topology, pcie, fabricmanager, imex, health, kernel, driver, containers, files
)  # fmt: skip


def judge_each(facts: Dict[str, Any], expect: Expectation) -> List[Tuple[str, List[Finding]]]:
    """(judge's name, its findings) for every judge in order, each finding with its GPU's UUID where it
    names a GPU the facts list: the node check reports which judge passed, per GPU too."""
    uuids = {gpu["index"]: gpu.get("uuid") for gpu in facts.get("gpus") or ()}
    return [
        (judge.__name__, [f._replace(uuid=uuids.get(f.gpu)) if f.gpu is not None else f for f in found])
        for judge, found in ((judge, judge(facts, expect)) for judge in JUDGES)
    ]


def judge_node(facts: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """Every finding about the box, each with its GPU's UUID where it names a GPU the facts list."""
    return [finding for _, found in judge_each(facts, expect) for finding in found]
