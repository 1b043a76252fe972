"""The plan of a whole fleet: every host's facts read at once, each host planned, totals and exit code.

`plan` shows this object and `apply` shows, confirms and then carries out the very same one, so the two can
never disagree about what a box needs. A host that could not be read or planned keeps its reason and never
hides the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import ProvisionError
from ..facts import Facts
from ..fleet.options import FleetOptions
from ..fleet.pool import HostOutcome, run_fleet
from ..fleet.session import AgentSession, read_facts
from ..fleet.targets import HostTarget
from ..plan.change import Change
from ..plan.host import facts_request, plan_host

if TYPE_CHECKING:
    from ..rig.rig import LoadedRig

HostStatus = Literal["ok", "unreachable", "failed"]


@dataclass(frozen=True)
class HostPlan:
    """One host's part of a plan: its Changes, or why there are none to show (unreachable, failed)."""

    host: str
    status: HostStatus
    changes: tuple[Change, ...] = ()
    error: str | None = None
    elapsed_s: float = 0.0

    def count(self, *actions: str) -> int:
        return sum(1 for c in self.changes if c.action in actions)


@dataclass(frozen=True)
class PlanTotals:
    to_change: int  # create + update
    checks_failed: int
    manual: int
    hosts_with_changes: int
    hosts: int
    unreachable: int
    failed: int


@dataclass(frozen=True)
class FleetPlan:
    hosts: tuple[HostPlan, ...]

    @property
    def totals(self) -> PlanTotals:
        return PlanTotals(
            to_change=sum(h.count("create", "update", "delete") for h in self.hosts),
            checks_failed=sum(h.count("verify-failed") for h in self.hosts),
            manual=sum(h.count("manual") for h in self.hosts),
            hosts_with_changes=sum(1 for h in self.hosts if h.changes),
            hosts=len(self.hosts),
            unreachable=sum(1 for h in self.hosts if h.status == "unreachable"),
            failed=sum(1 for h in self.hosts if h.status == "failed"),
        )

    @property
    def converged(self) -> bool:
        return all(h.status == "ok" and not h.changes for h in self.hosts)

    @property
    def exit_code(self) -> int:
        """Terraform's -detailed-exitcode: 0 nothing to do, 2 drift, failed checks or hosts not read."""
        return 0 if self.converged else 2


def gather_facts(
    loaded: LoadedRig, targets: list[HostTarget], options: FleetOptions
) -> dict[str, HostOutcome[Facts]]:
    """Facts of every target at once; the request per host is the one its plan needs."""

    def one(session: AgentSession) -> Facts:
        return read_facts(session, facts_request(loaded, loaded.host(session.target.name)))

    return run_fleet(targets, one, options)


def plan_fleet(
    loaded: LoadedRig,
    targets: list[HostTarget],
    options: FleetOptions,
    arrange: Callable[[list[Change]], list[Change]] = list,
) -> FleetPlan:
    """Facts from every host at once, then each host's plan (passed through `arrange`, e.g. a playbook's
    selection and order); a host that was not read or could not be planned keeps its reason."""
    hosts: list[HostPlan] = []
    for name, outcome in gather_facts(loaded, targets, options).items():
        if outcome.status != "ok" or outcome.value is None:
            status: HostStatus = "failed" if outcome.status == "ok" else outcome.status
            hosts.append(HostPlan(name, status, (), outcome.error, outcome.elapsed_s))
            continue
        try:
            changes = arrange(plan_host(loaded, loaded.host(name), outcome.value))
        except ProvisionError as exc:  # e.g. a visible-device UUID no GPU of this box has: this host only
            hosts.append(HostPlan(name, "failed", (), str(exc), outcome.elapsed_s))
            continue
        hosts.append(HostPlan(name, "ok", tuple(changes), None, outcome.elapsed_s))
    return FleetPlan(tuple(hosts))
