"""`apply --drain slurm`: take each batch out of Slurm before changing it, and put it back afterwards.

A driver upgrade under a running job kills the job; a gres.conf change restarts slurmd under it. So each
`--serial` batch is drained first (`scontrol update ... state=drain reason="mgpu: apply"`, run on the node by
the `slurm-node` verb: the nodes have slurm.conf and munge's key, the control machine need not), and changed
only once every node of it is DRAINED (its running jobs ended). A batch that is not drained within
`--drain-timeout` is skipped whole and its drains lifted: half a batch changed is not what `--serial` asked.
After the change and the check, only a drain this rollout set is resumed, and only on a box that converged;
an admin's drain (or the health check's) is never overwritten and never lifted. The decisions are pure
functions here; apply.py's rollout runs them between its batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..fleet.replies import SlurmNodeReply
from ..fleet.session import AgentSession
from ..fleet.targets import HostTarget
from ..plan.resources.slurm import APPLY_REASON
from .steps import Steps, Wait, on_session, read

DRAIN_KINDS = ("slurm",)  # what --drain accepts: the scheduler whose nodes are drained
# Slurm's node state flags under which a drained node still runs (or is cleaning up after) a job.
_BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


@dataclass(frozen=True)
class DrainSettings:
    timeout_s: float = 3600.0  # --drain-timeout: how long the running jobs of a batch may take to end
    poll_s: float = 1.0


@dataclass(frozen=True)
class Drained:
    """One host's drain: its Slurm name, whether this run set the drain, and whether it is DRAINED."""

    host: str
    node: str
    ours: bool
    ready: bool
    state: str
    reason: str
    waited_s: float


def is_drained(line: dict[str, str]) -> bool:
    """DRAINED, not DRAINING: the drain flag set and no job left on the node (`IDLE+DRAIN`, `DOWN+DRAIN`)."""
    flags = set(line.get("State", "").split("+"))
    return "DRAIN" in flags and not flags & _BUSY


def is_ours(line: dict[str, str], reason: str = APPLY_REASON) -> bool:
    return "DRAIN" in line.get("State", "") and line.get("Reason", "").startswith(reason)


def not_drained_words(stuck: list[Drained], timeout_s: float) -> str:
    """`na still MIXED+DRAIN after 2s (its jobs are running)`: why a batch was skipped, one clause a node."""
    return "; ".join(f"{d.node} still {d.state} after {timeout_s:g}s (its jobs are running)" for d in stuck)


def _ask(target: HostTarget, action: str, reason: str) -> Steps[SlurmNodeReply]:
    args = {"action": action, "reason": reason}
    reply = yield from read(target, "slurm-node", args, SlurmNodeReply, target.command_timeout_s)
    return reply


def drain_steps(
    target: HostTarget,
    settings: DrainSettings,
    progress: Callable[[str], None],
    reason: str = APPLY_REASON,
) -> Steps[Drained]:
    """Drain the node (unless someone drained it already) and wait until it is DRAINED or the time is up.
    `reason` is the run's own (recover drains with its own), so only that run lifts it."""
    started = time.monotonic()
    reply = yield from _ask(target, "drain", reason)
    if reply.changed:
        progress(f"{target.name}: drained in Slurm as {reply.node} ({reason}), waiting for its jobs to end")
    while not is_drained(reply.line) and time.monotonic() - started < settings.timeout_s:
        yield Wait(settings.poll_s)
        reply = yield from _ask(target, "show", reason)
    return Drained(
        target.name,
        reply.node,
        is_ours(reply.line, reason),
        is_drained(reply.line),
        reply.line.get("State", ""),
        reply.line.get("Reason", ""),
        time.monotonic() - started,
    )


def drain_host(
    session: AgentSession,
    settings: DrainSettings,
    progress: Callable[[str], None],
    reason: str = APPLY_REASON,
) -> Drained:
    """`drain_steps` on one session (recover's drain)."""
    return on_session(session, drain_steps(session.target, settings, progress, reason))


def resume_steps(target: HostTarget, reason: str = APPLY_REASON) -> Steps[SlurmNodeReply]:
    """Lift the drain if its reason is this rollout's (the node checks the reason itself)."""
    return (yield from _ask(target, "resume", reason))


def resume_host(session: AgentSession, reason: str = APPLY_REASON) -> SlurmNodeReply:
    return on_session(session, resume_steps(session.target, reason))
