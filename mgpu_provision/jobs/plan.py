"""The plan of a whole fleet: every host's facts read at once, each host planned, totals and exit code.

`plan` shows this object and `apply` shows, confirms and then carries out the very same one, so the two can
never disagree about what a box needs. A host that could not be read or planned keeps its reason and never
hides the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .. import protocol
from ..errors import AgentError, ProvisionError
from ..facts import Facts
from ..fleet.here import Here, address_is_here, control_machine
from ..fleet.options import FleetOptions
from ..fleet.pool import HostOutcome, call_many
from ..fleet.session import validated
from ..fleet.targets import HostTarget, describe
from ..plan.change import Change
from ..plan.host import facts_request, plan_host
from ..typing_lite import NamedTuple

if TYPE_CHECKING:
    from ..rig.rig import LoadedRig

HostStatus = Literal["ok", "unreachable", "failed"]
# What keeps a host from matching its rig file: every action but a warning.
ACTING = ("create", "update", "delete", "verify-failed", "manual")


@dataclass(frozen=True)
class HostPlan:
    """One host's part of a plan: its Changes, or why there are none to show (unreachable, failed).

    `simulated` is the node's word (None when it was not read); `control_machine` says why the host is
    the machine running this tool (fleet/here.py), where apply installs no driver and reboots nothing
    unless told to."""

    host: str
    status: HostStatus
    changes: tuple[Change, ...] = ()
    error: str | None = None
    elapsed_s: float = 0.0
    simulated: bool | None = None
    control_machine: str | None = None
    facts: Facts | None = field(default=None, compare=False, repr=False)  # what it was planned from

    def count(self, *actions: str) -> int:
        return sum(1 for c in self.changes if c.action in actions)


class PlanTotals(NamedTuple):
    """What the plan's summary line counts, over every host."""

    to_change: int  # create + update
    checks_failed: int
    warnings: int
    manual: int
    hosts_with_changes: int
    hosts: int
    unreachable: int
    failed: int


@dataclass(frozen=True)
class FleetPlan:
    """Every chosen host's plan, in the order of the targets."""

    hosts: tuple[HostPlan, ...]

    @property
    def totals(self) -> PlanTotals:
        return PlanTotals(
            to_change=sum(h.count("create", "update", "delete") for h in self.hosts),
            checks_failed=sum(h.count("verify-failed") for h in self.hosts),
            warnings=sum(h.count("warn") for h in self.hosts),
            manual=sum(h.count("manual") for h in self.hosts),
            hosts_with_changes=sum(1 for h in self.hosts if h.count(*ACTING)),
            hosts=len(self.hosts),
            unreachable=sum(1 for h in self.hosts if h.status == "unreachable"),
            failed=sum(1 for h in self.hosts if h.status == "failed"),
        )

    @property
    def converged(self) -> bool:
        """Nothing to change and no failed check: a warning is shown, and is no drift."""
        return all(h.status == "ok" and not h.count(*ACTING) for h in self.hosts)

    @property
    def exit_code(self) -> int:
        """Terraform's -detailed-exitcode: 0 nothing to do, 2 drift, failed checks or hosts not read."""
        return 0 if self.converged else 2


def held_on_control_machine(changes: list[Change]) -> list[Change]:
    """The changes never carried out on the machine running this tool unless allowed: a driver install
    and a reboot (either can take the operator's own desktop or session down)."""
    return [
        c
        for c in changes
        if c.agent_step is not None and (c.phase == "reboot" or c.agent_step.get("kind") == protocol.DRIVER)
    ]


def held_names(held: list[Change]) -> str:
    """`driver, reboot`: what `held_on_control_machine` kept back, each once."""
    return ", ".join(dict.fromkeys("reboot" if c.phase == "reboot" else c.resource for c in held))


def gather_facts(
    loaded: LoadedRig, targets: list[HostTarget], options: FleetOptions
) -> dict[str, HostOutcome[Facts]]:
    """Facts of every target at once, through the batch seam; the request per host is the one its plan
    needs (hosts of one rig type send the same one: one ClusterShell worker under --via clush)."""
    requests = {t.name: facts_request(loaded, loaded.host(t.name)) for t in targets}
    outcomes: dict[str, HostOutcome[Facts]] = {}
    replies = call_many(targets, "facts", requests, options)
    for target in targets:
        got = replies[target.name]
        if got.status != "ok" or got.value is None:
            outcomes[target.name] = HostOutcome(got.status, None, got.error, got.elapsed_s)
            continue
        try:
            facts = validated(got.value, Facts, "facts", describe(target), "facts")
        except AgentError as exc:
            outcomes[target.name] = HostOutcome("failed", None, str(exc), got.elapsed_s)
            continue
        outcomes[target.name] = HostOutcome("ok", facts, None, got.elapsed_s)
    return outcomes


def plan_fleet(
    loaded: LoadedRig,
    targets: list[HostTarget],
    options: FleetOptions,
    arrange: Callable[[list[Change]], list[Change]] = list,
) -> FleetPlan:
    """Facts from every host at once, then each host's plan (passed through `arrange`, e.g. a playbook's
    selection and order); a host that was not read or could not be planned keeps its reason."""
    hosts: list[HostPlan] = []
    here = Here.read()
    by_name = {t.name: t for t in targets}
    for name, outcome in gather_facts(loaded, targets, options).items():
        facts = outcome.value
        if outcome.status != "ok" or facts is None:
            status: HostStatus = "failed" if outcome.status == "ok" else outcome.status
            hosts.append(HostPlan(name, status, (), outcome.error, outcome.elapsed_s))
            continue
        simulated = facts.host.simulated
        mine = control_machine(by_name[name], facts, here, address_is_here)
        try:
            changes = arrange(plan_host(loaded, loaded.host(name), facts))
        except ProvisionError as exc:  # e.g. a visible-device UUID no GPU of this box has: this host only
            hosts.append(HostPlan(name, "failed", (), str(exc), outcome.elapsed_s, simulated, mine, facts))
            continue
        hosts.append(HostPlan(name, "ok", tuple(changes), None, outcome.elapsed_s, simulated, mine, facts))
    return FleetPlan(tuple(hosts))
