"""Control side of `reclaim`: run the node agent's `reclaim` verb across the fleet and judge the outcome.

The node decides which processes to end (it alone sees /proc); this side turns the rig's policy into the
verb's arguments, checks the answer against the contract, verifies with a fresh `facts` call that ended
processes no longer hold GPU memory, and sums it all up per host with the exit code. The command
(`commands/reclaim.py`) shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .. import protocol
from ..errors import AgentError
from ..facts import Fact, Facts, GpuProcess
from ..fleet.options import FleetOptions
from ..fleet.pool import HostOutcome
from ..fleet.session import AgentSession
from ..fleet.targets import HostTarget, describe
from ..records import Field, RecordError
from .steps import Call, Steps, on_session, per_host, read

if TYPE_CHECKING:
    from ..rig.models import Reclaim

Action = Literal["keep", "refused", "would-end", "ended", "failed"]
LEFT: frozenset[str] = frozenset({"refused", "would-end", "failed"})  # what keeps the exit code at 2


class ReclaimedProcess(GpuProcess):
    """One GPU memory holder as the `reclaim` verb reports it: the facts fields plus the verdict."""

    classification: Literal["orphaned", "torchrun", "attached"]
    action: Action
    reason: str


class HostResult(Fact):
    """The `reclaim` verb's result for one node."""

    processes: list[ReclaimedProcess]
    freed_mib: int
    not_holders: list[int] = Field(
        default_factory=list, description="pids named by --pid that hold no GPU memory"
    )


@dataclass
class HostReclaim:
    """What happened on one host: `result` is None when the host failed or could not be reached."""

    name: str
    status: Literal["ok", "failed", "unreachable"]
    error: str | None = None
    processes: list[ReclaimedProcess] = field(default_factory=list)
    freed_mib: int = 0
    not_holders: list[int] = field(default_factory=list)

    def count(self, action: Action) -> int:
        return sum(1 for p in unique_pids(self.processes) if p.action == action)


def unique_pids(processes: list[ReclaimedProcess]) -> list[ReclaimedProcess]:
    """One row per process: a process holding memory on several GPUs is listed once per GPU."""
    seen: dict[int, ReclaimedProcess] = {}
    for p in processes:
        seen.setdefault(p.pid, p)
    return list(seen.values())


def agent_args(
    policy: Reclaim, dry_run: bool, user: str | None = None, pids: Sequence[int] = ()
) -> dict[str, Any]:
    """The `reclaim` verb's arguments for the rig's policy (validated with the rig file: rig/rules.py),
    limited to one user's processes when `user` is given, to exactly `pids` when any are."""
    return protocol.reclaim_request(policy.policy, policy.patterns, policy.grace_s, dry_run, user, pids)


def parse_result(where: str, result: dict[str, Any]) -> HostResult:
    try:
        parsed: HostResult = HostResult.model_validate(result)
    except RecordError as exc:
        raise AgentError(f"agent reclaim on {where} answered outside the contract: {exc}") from exc
    return parsed


def still_held(ended: ReclaimedProcess, facts: Facts) -> bool:
    """Whether facts still show the ended process holding GPU memory (same pid and start time, alive).

    A zombie does not count: it has exited and released its memory; only its pid waits to be reaped.
    """
    return any(
        p.pid == ended.pid
        and p.alive
        and p.state != "Z"
        and (p.start_time is None or ended.start_time is None or abs(p.start_time - ended.start_time) < 1.0)
        for p in facts.processes
    )


def verify(result: HostResult, facts: Facts) -> HostResult:
    """Facts taken after the kill have the last word: an ended process still holding memory failed."""
    failed = {p.pid for p in result.processes if p.action == "ended" and still_held(p, facts)}
    if not failed:
        return result
    processes = [
        p.model_copy(
            update={"action": "failed", "reason": p.reason + "; facts still show it holding GPU memory"}
        )
        if p.pid in failed
        else p
        for p in result.processes
    ]
    freed = sum(p.used_mib or 0 for p in processes if p.action == "ended")
    return HostResult(processes=processes, freed_mib=freed, not_holders=result.not_holders)


def reclaim_steps(target: HostTarget, args: dict[str, Any]) -> Steps[HostResult]:
    """The per-host work: one `reclaim` call, and one `facts` call to verify when anything was ended."""
    answer = yield Call("reclaim", args)
    result = parse_result(describe(target), answer)
    if not any(p.action == "ended" for p in result.processes):
        return result
    facts = yield from read(target, "facts", protocol.facts_request(), Facts, what="facts")
    return verify(result, facts)


def reclaim_on(session: AgentSession, args: dict[str, Any]) -> HostResult:
    """`reclaim_steps` on one session."""
    return on_session(session, reclaim_steps(session.target, args))


def reclaim_fleet(
    targets: list[HostTarget], args: dict[str, Any], options: FleetOptions
) -> dict[str, HostOutcome[HostResult]]:
    """`reclaim_steps` on every target, on the engine `options.via` picks (jobs/steps.py): under
    `--via clush` the `reclaim` verb everywhere in one round (one request for the whole fleet: one
    ClusterShell worker), then `facts` on the hosts that ended something."""
    return per_host(targets, options, lambda target: reclaim_steps(target, args))


def collect(outcomes: dict[str, HostOutcome[HostResult]]) -> list[HostReclaim]:
    hosts = []
    for name, outcome in outcomes.items():
        value = outcome.value
        if outcome.status == "ok" and value is not None:
            hosts.append(HostReclaim(name, "ok", None, value.processes, value.freed_mib, value.not_holders))
        else:
            hosts.append(HostReclaim(name, outcome.status, outcome.error or "no result"))
    return hosts


def exit_code(hosts: list[HostReclaim]) -> int:
    """0: nothing to do, or everything selected was ended; 2: something is left, failed or unreachable, or
    a pid named by --pid holds no GPU memory."""
    for host in hosts:
        if host.status != "ok" or host.not_holders or any(p.action in LEFT for p in host.processes):
            return 2
    return 0
