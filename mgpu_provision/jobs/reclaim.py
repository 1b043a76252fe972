"""Control side of `reclaim`: run the node agent's `reclaim` verb across the fleet and judge the outcome.

The node decides which processes to end (it alone sees /proc); this side turns the rig's policy into the
verb's arguments, checks the answer against the contract, verifies with a fresh `facts` call that ended
processes no longer hold GPU memory, and sums it all up per host with the exit code. The command
(`commands/reclaim.py`) shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .. import protocol
from ..errors import AgentError, ProvisionError
from ..facts import Fact, Facts, GpuProcess
from ..fleet.options import FleetOptions
from ..fleet.pool import HostOutcome, call_many, run_fleet
from ..fleet.session import AgentSession, read_facts, validated
from ..fleet.targets import HostTarget, describe
from ..records import Field, RecordError

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


def reclaim_on(session: AgentSession, args: dict[str, Any]) -> HostResult:
    """The per-host work: one `reclaim` call, and one `facts` call to verify when anything was ended."""
    result = parse_result(session.where, session.call("reclaim", args))
    if not any(p.action == "ended" for p in result.processes):
        return result
    return verify(result, read_facts(session, protocol.facts_request()))


def reclaim_fleet(
    targets: list[HostTarget], args: dict[str, Any], options: FleetOptions
) -> dict[str, HostOutcome[HostResult]]:
    """`reclaim_on` on every target. Under `--via clush` in two phases through the batch seam: the
    `reclaim` verb everywhere (one request for the whole fleet: one ClusterShell worker), then `facts` on
    the hosts that ended something; each host's outcome, error and verdict as the Fabric path gives them
    (which keeps one session a host for both calls)."""
    if options.via != "clush":
        return run_fleet(targets, lambda opened: reclaim_on(opened, args), options)
    replies = call_many(targets, "reclaim", {t.name: args for t in targets}, options)
    outcomes = {t.name: _read(replies[t.name], describe(t), parse_result) for t in targets}
    ended = {
        name: result
        for name, outcome in outcomes.items()
        if (result := outcome.value) is not None and any(p.action == "ended" for p in result.processes)
    }
    checking = [t for t in targets if t.name in ended]
    request = protocol.facts_request()
    facts = call_many(checking, "facts", {t.name: request for t in checking}, options)
    for target in checking:
        after = _read(facts[target.name], describe(target), _verified(ended[target.name]))
        after.elapsed_s += outcomes[target.name].elapsed_s
        outcomes[target.name] = after
    return outcomes


def _verified(result: HostResult) -> Callable[[str, dict[str, Any]], HostResult]:
    """Reads a `facts` reply taken after the kill into `result` as `verify` corrects it."""

    def read(where: str, answer: dict[str, Any]) -> HostResult:
        return verify(result, validated(answer, Facts, "facts", where, "facts"))

    return read


def _read(
    got: HostOutcome[dict[str, Any]], where: str, read: Callable[[str, dict[str, Any]], HostResult]
) -> HostOutcome[HostResult]:
    """One host's reply through `read`; a host without a reply keeps its reason, one whose reply does not
    read is `failed` with the AgentError naming the drift (as the Fabric path's session raises it)."""
    if got.status != "ok" or got.value is None:
        return HostOutcome(got.status, None, got.error, got.elapsed_s)
    try:
        return HostOutcome("ok", read(where, got.value), None, got.elapsed_s)
    except ProvisionError as exc:
        return HostOutcome("failed", None, str(exc), got.elapsed_s)


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
