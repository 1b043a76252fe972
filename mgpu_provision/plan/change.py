"""The unit every resource diff yields (`Change`) and the one input every diff reads (`HostContext`).

They live apart from `plan.py` so that resource modules (including env files, written elsewhere) can import
`Change` while `plan.py` imports them: `plan.py` re-exports `Change`, which is its documented home.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..facts import Facts
from ..node.topology import TopoMatrix
from ..spec.models import Host, Rig

Action = Literal["create", "update", "verify-failed", "manual"]


@dataclass(frozen=True)
class Change:
    """One difference between the rig file and a box, and (when apply can make it) the agent step for it."""

    resource: str
    action: Action
    summary: str
    current: str | None
    desired: str | None
    reboot: bool = False
    diff: str | None = None
    step: dict[str, Any] | None = None
    tags: tuple[str, ...] = ()


def check_failed(
    resource: str, summary: str, current: str | None = None, desired: str | None = None
) -> Change:
    """A failed check: something apply cannot fix (hardware, cabling, services outside its reach)."""
    return Change(resource, "verify-failed", summary, current, desired, tags=("checks",))


@dataclass(frozen=True)
class HostContext:
    """What one host's diffs read: its rig type, its facts, and the rig-file values resolved for it."""

    host: Host
    rig: Rig
    facts: Facts
    visible_count: int
    expected_topology: TopoMatrix | None = None  # parsed from the rig's captured topology_file

    @property
    def nvml_ok(self) -> bool:
        return self.facts.driver.nvml == "ok"
