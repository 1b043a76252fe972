"""The unit every resource diff yields (`Change`) and the one input every diff reads (`HostContext`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from ..catalog.topology import TopoMatrix
from ..facts import Facts
from ..judge.records import WARN, Expectation, Finding
from ..typing_lite import NamedTuple
from .expectation import for_rig

if TYPE_CHECKING:
    from ..rig import LoadedRig
    from ..rig.models import Host, Rig

# "warn": a check that found something to say but nothing that fails the box (judge.records.SEVERITIES).
Action = Literal["create", "update", "delete", "verify-failed", "warn", "manual"]
# The playbook step a Change belongs to (`--tags`, `--skip-tags`): what kind of work carrying it out is.
Phase = Literal["checks", "env", "sli", "persistence", "driver", "containers", "reboot"]
# containers after the driver: a CDI spec names the driver's libraries and nodes.
PHASES: tuple[Phase, ...] = ("checks", "env", "sli", "persistence", "driver", "containers", "reboot")


class Change(NamedTuple):
    """One difference between the rig file and a box, and (when apply can make it) the agent step for it."""

    resource: str
    action: Action
    summary: str
    current: str | None
    desired: str | None
    reboot: bool = False  # carrying it out takes effect only after a reboot
    diff: str | None = None  # unified diff of a file's content
    agent_step: dict[str, Any] | None = None  # the instruction for the agent (protocol.py); None: not applied
    phase: Phase = "checks"


def check_failed(
    resource: str, summary: str, current: str | None = None, desired: str | None = None
) -> Change:
    """A failed check: something apply cannot fix (hardware, cabling, services outside its reach)."""
    return Change(resource, "verify-failed", summary, current, desired)


def failed_checks(findings: Iterable[Finding]) -> list[Change]:
    """The judge's findings as failed checks, in its order; a warning as a warning; those of kind "manual"
    (a person acts, e.g. the driver's drain-P2P recovery action) as manual steps."""
    return [
        Change(f.check, "manual", f.summary, f.current, f.desired)
        if f.kind == "manual"
        else Change(f.check, "warn", f.summary, f.current, f.desired)
        if f.severity == WARN
        else check_failed(f.check, f.summary, f.current, f.desired)
        for f in findings
    ]


@dataclass(frozen=True)
class HostContext:
    """What one host's diffs read: the loaded rig file, the host, its facts, and the rig-file values
    resolved for it (`plan/host.host_context` builds the one a plan uses)."""

    loaded: LoadedRig
    host: Host
    facts: Facts
    driver_repo: dict[str, str] | None = None  # driver.repo as the agent takes it (the key's text read)
    # The managed files the node check holds the node to (path -> sha256), from the registry's checked ones.
    checked_files: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def rig(self) -> Rig:
        return self.loaded.rig_of(self.host)

    @cached_property
    def visible_count(self) -> int:
        """How many GPUs the rig's `visible_devices` leave a job (all of the rig's without it)."""
        visible = self.loaded.visible_indices(self.host, [gpu.uuid for gpu in self.facts.gpus])
        return self.rig.gpus.count if visible is None else len(visible)

    @cached_property
    def expected_topology(self) -> TopoMatrix | None:
        """The rig's captured topology_file, parsed."""
        return self.loaded.topologies.get(self.host.rig)

    @cached_property
    def expect(self) -> Expectation:
        """What the judge holds this host to (managed files are diffed by plan itself, not by digest)."""
        return for_rig(self.loaded, self.host)

    @cached_property
    def node_expectation(self) -> Expectation:
        """What the node holds itself to once apply has run: `expect` with the managed files' digests."""
        return for_rig(self.loaded, self.host, self.checked_files)

    @cached_property
    def facts_json(self) -> dict[str, Any]:
        """The facts as the agent reported them: what the judge reads."""
        return self.facts.model_dump()

    @property
    def nvml_ok(self) -> bool:
        return self.facts.driver.nvml == "ok"
