"""Node side of `reclaim`: find processes holding GPU memory after a killed job and end those policy allows.

A job killed with Ctrl-C or by a scheduler often leaves workers behind that still hold GPU memory. This module
lists every GPU memory holder with what a person needs to judge it (owner, command, start time, parent),
decides from /proc alone whether it is left over from a job that is gone or part of a live one, and ends the
ones the policy selects through `procs.end_processes`, each only while it still holds the GPU. Ending a live
job is the one mistake it must not make: when in doubt a process is kept.

Everything that decides is a pure function over `ProcInfo` snapshots (testable on fake data); reading /proc
and sending signals is `procs.py`'s. It runs inside the agent zipapp: Python 3.8, standard library only.
"""

from __future__ import annotations

import os
import pwd
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

from ..core.errors import AgentFailure
from ..host.procs import (
    PROC_ROOT,
    Lookup,
    ProcInfo,
    ancestors,
    boot_time,
    end_processes,
    owner_name,
    pid_namespace_problem,
    proc_lookup,
)
from ..nvidia.backend import Backend, GpuLost, NvmlUnavailable

# Daemons that hold GPU memory by design, by program name; the kernel cuts `comm` to 15 characters.
PROTECTED_PROGRAMS = ("Xorg", "X", "Xwayland", "nvidia-persistenced", "nv-fabricmanager", "nv-hostengine")
# Families known by prefix: sshd's per-session processes ("sshd: alice@pts/0", sshd-session), DCGM's tools.
PROTECTED_PREFIXES = ("sshd", "dcgm")
COMM_LEN = 15
# How torchrun shows up in a command line: the console script, or `python -m` of its modules (torchelastic is
# the pre-1.9 name of the same agent).
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch", "torchelastic")
MIB = 1024 * 1024


class ReclaimArgsError(AgentFailure):
    """Arguments of the right types that do not fit together (patterns without their policy, a bad regex)."""

    def __init__(self, message: str) -> None:
        super().__init__("bad-request", message)


# ---------------------------------------- deciding


def is_torchrun_agent(info: ProcInfo) -> bool:
    """Whether the process is a torchrun / torch.distributed.run / torchelastic launcher."""
    argv = info.argv
    if any(os.path.basename(a) == "torchrun" for a in argv[:2]):
        return True
    return any(argv[i] == "-m" and argv[i + 1].startswith(TORCHRUN_MODULES) for i in range(len(argv) - 1))


def is_service(info: ProcInfo) -> bool:
    """A unit's main process: systemd starts it as a session leader in its own `.service` cgroup.

    Both are needed: torchrun starts its workers as session leaders too, and a service's orphaned
    grandchildren stay in the service's cgroup.
    """
    return info.sid == info.pid and info.unit.endswith(".service")


class Classification(NamedTuple):
    kind: str  # "orphaned", "torchrun" (part of a live torchrun job) or "attached" (part of a live job)
    reason: str


OWN_GROUP = "leads its own process group: a job in its own right (nohup, setsid, a container's main process)"


def classify(info: ProcInfo, lookup: Lookup) -> Classification:
    """Whether a GPU memory holder is left over from a job that is gone, and why.

    A job is a process group inside a session. A holder is left over when the leaders of both have exited,
    when it is a worker whose torchrun is gone, or when it is a zombie whose threads still hold memory; never
    when it leads its own process group (nohup'd and setsid'd jobs, a container's main process under tini or
    docker-init) or is a service's main process. Its parent does not matter: every job whose shell exited is
    re-parented to an init, live or not.
    """
    return _classify(info, lookup, follow_leaders=True)


def _classify(info: ProcInfo, lookup: Lookup, follow_leaders: bool) -> Classification:
    launcher = next((a for a in ancestors(info, lookup) if is_torchrun_agent(a)), None)
    if launcher is not None:
        return Classification("torchrun", "part of the live torchrun job of " + launcher.label())
    if is_service(info):
        return Classification("attached", "a service's main process (%s)" % info.unit)
    if info.state == "Z":
        return Classification("orphaned", "zombie: its main thread exited, other threads still hold the GPU")
    if info.torchrun_run is not None and info.sid == info.pid:
        # torchrun starts each worker in a session of its own; with torchrun gone nobody runs that job.
        return Classification(
            "orphaned", "a torchrun worker whose torchrun is gone (run %s)" % info.torchrun_run
        )
    if info.pgid == info.pid:
        return Classification("attached", OWN_GROUP)
    if not follow_leaders:
        return Classification("attached", "a member of a process group")
    for what, pid in (("process group", info.pgid), ("session", info.sid)):
        leader = lookup(pid) if pid > 0 else None
        if leader is not None and leader.alive:
            why = _classify(leader, lookup, follow_leaders=False)
            if why.kind == "orphaned":
                return Classification(
                    "orphaned", "its %s leader %s is left over: %s" % (what, leader.label(), why.reason)
                )
            return Classification("attached", "its %s leader %s is alive" % (what, leader.label()))
    if info.ignores_hup:
        return Classification("attached", "it ignores SIGHUP: started with nohup to outlive its shell")
    leaders = "pid %d" % info.pgid if info.pgid == info.sid else "pids %d, %d" % (info.pgid, info.sid)
    return Classification(
        "orphaned",
        "its process group and session leaders (%s) are gone: the job that started it has ended" % leaders,
    )


def protected_program(info: ProcInfo) -> Optional[str]:
    """The daemon this process is (sshd, Xorg, nvidia-persistenced, ...), or None."""
    program = os.path.basename(info.argv[0].split(" ")[0]) if info.argv else ""
    for name in PROTECTED_PROGRAMS:
        if program == name or info.comm == name[:COMM_LEN]:
            return name
    for prefix in PROTECTED_PREFIXES:
        if info.comm.startswith(prefix) or program.startswith(prefix):
            return prefix
    return None


def protected_reason(info: ProcInfo, used_mib: Optional[int], agent_chain: Dict[int, str]) -> Optional[str]:
    """Why this process must never be ended, or None when it may be."""
    if info.pid == 1:
        return "init"
    daemon = protected_program(info)
    if daemon is not None:
        return daemon
    if info.pid in agent_chain:
        return agent_chain[info.pid]
    if used_mib == 0:
        return "it holds no GPU memory"
    return None


def agent_chain(lookup: Lookup, self_pid: int) -> Dict[int, str]:
    """The agent and every process above it: ending one of them would cut the agent's own connection."""
    me = lookup(self_pid)
    chain = {self_pid: "the agent itself"}
    if me is not None:
        chain.update((a.pid, "an ancestor of the agent") for a in ancestors(me, lookup))
    return chain


def compile_patterns(policy: str, patterns: Sequence[str]) -> List["re.Pattern[str]"]:
    if patterns and policy != "orphans+patterns":
        raise ReclaimArgsError("patterns are only used with policy orphans+patterns, not %r" % policy)
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ReclaimArgsError(
                "pattern %r is not a valid regular expression: %s" % (pattern, exc)
            ) from exc
    return compiled


class Owner(NamedTuple):
    """The one user whose processes reclaim may end (`--user`)."""

    uid: int
    name: str


class Decision(NamedTuple):
    action: str  # "keep", "refused" or "end"
    reason: str


def decide(
    info: ProcInfo,
    used_mib: Optional[int],
    why: Classification,
    policy: str,
    patterns: Sequence["re.Pattern[str]"],
    agent: Dict[int, str],
    owner: Optional[Owner] = None,
) -> Decision:
    """Whether policy selects the process, refusing when it selects one that must never be ended."""
    if policy == "never":
        return Decision("keep", "policy is never; " + why.reason)
    if owner is not None and info.uid != owner.uid:
        return Decision("keep", "owned by %s, not %s" % (owner_name(info.uid), owner.name))
    matched = next((p.pattern for p in patterns if p.search(info.command)), None)
    if why.kind == "orphaned":
        selected = "orphaned: " + why.reason
    elif matched is not None:
        selected = "command matches %r" % matched
    else:
        return Decision("keep", why.reason)
    protected = protected_reason(info, used_mib, agent)
    if protected is not None:
        return Decision("refused", "refusing to end pid %d (%s)" % (info.pid, protected))
    return Decision("end", selected)


# ---------------------------------------- the verb


def _holders(backend: Backend) -> List[Dict[str, Any]]:
    """GPU memory holders from the agent's NVML backend (real or simulated), as {pid, gpu, used_mib}."""
    try:
        backend.open()
    except NvmlUnavailable as exc:
        raise AgentFailure(
            exc.status, "cannot list the processes holding GPU memory: " + exc.message
        ) from None
    try:
        holders = []
        for gpu in range(backend.device_count()):
            try:
                found = backend.processes(gpu)
            except GpuLost:
                continue  # its memory is gone with it; reclaim the others
            # Rounded up: a process holding any memory at all must not look like one that holds none.
            holders += [
                {"pid": pid, "gpu": gpu, "used_mib": None if used is None else -(-used // MIB)}
                for pid, used in found
            ]
        return holders
    finally:
        backend.close()


def _args(args: Dict[str, Any]) -> Dict[str, Any]:
    """The verb's options with defaults; types were checked at the door (`protocol.VERB_ARGS`)."""
    policy = args.get("policy", "orphans")
    return {
        "policy": policy,
        "patterns": compile_patterns(policy, args.get("patterns") or []),
        "grace_s": float(args.get("grace_s", 10.0)),
        "dry_run": bool(args.get("dry_run", True)),
        "owner": _owner(args.get("user")),
    }


def _owner(user: Optional[str]) -> Optional[Owner]:
    if user is None:
        return None
    try:
        return Owner(pwd.getpwnam(user).pw_uid, user)
    except KeyError:
        raise ReclaimArgsError("user %r does not exist on this node" % user) from None


def action_of(outcome: str) -> str:
    """A row's action after an attempt to end it: a process left alone (not the listed one any more, or
    no longer holding the GPU) leaves nothing to do."""
    if outcome.startswith("ended"):
        return "ended"
    return "keep" if outcome.startswith("left alone") else "failed"


def describe(
    holder: Dict[str, Any], info: ProcInfo, why: Classification, btime: float, hz: int
) -> Dict[str, Any]:
    """A holder as the facts contract's GpuProcess (plus `classification`)."""
    return {
        "pid": info.pid,
        "gpu": holder["gpu"],
        "used_mib": holder["used_mib"],
        "command": info.command,
        "ppid": info.ppid,
        "owner": owner_name(info.uid),
        "start_time": round(btime + info.start_ticks / float(hz), 2),
        "state": info.state,
        "orphaned": why.kind == "orphaned",
        "torchrun_job": why.kind == "torchrun",
        "alive": info.alive,
        "classification": why.kind,
    }


def run(args: Dict[str, Any], backend: Backend, root: str = PROC_ROOT) -> Dict[str, Any]:
    """The `reclaim` verb: list GPU memory holders, decide, and (unless dry_run) end the selected ones.

    Holders whose pid is dead are skipped: their memory is already free (on a simulated node the twin may
    still list them). Result: {"processes": [GpuProcess + classification, action, reason], "freed_mib": int},
    with action one of keep, refused, would-end (dry run), ended, failed.
    """
    opts = _args(args)
    if backend.reports_host_pids:
        problem = pid_namespace_problem(root)
        if problem is not None:
            raise AgentFailure(
                "pid-namespace",
                "refusing to reclaim: %s. NVML reports host pids, which name other processes here or none; "
                "run the agent on the host (or in a container started with --pid=host)" % problem,
            )
    lookup = proc_lookup(root)
    agent = agent_chain(lookup, os.getpid())
    btime, hz = boot_time(root), os.sysconf("SC_CLK_TCK")
    rows: List[Dict[str, Any]] = []
    targets: Dict[int, ProcInfo] = {}
    for holder in _holders(backend):
        info = lookup(holder["pid"])
        if info is None or not info.alive:
            continue
        why = classify(info, lookup)
        decision = decide(
            info, holder["used_mib"], why, opts["policy"], opts["patterns"], agent, opts["owner"]
        )
        row = describe(holder, info, why, btime, hz)
        row["action"], row["reason"] = decision
        if decision.action == "end":
            row["action"] = "would-end"
            targets[info.pid] = info
        rows.append(row)
    if opts["dry_run"] or not targets:
        return {"processes": rows, "freed_mib": 0}
    outcomes = end_processes(targets.values(), opts["grace_s"], root, backend.holds_gpu)
    freed = 0
    for row in rows:
        if row["pid"] not in outcomes:
            continue
        outcome = outcomes[row["pid"]]
        row["action"] = action_of(outcome)
        row["reason"] = "%s; %s" % (row["reason"], outcome)
        row["alive"] = not outcome.startswith("ended")
        if not row["alive"]:
            freed += row["used_mib"] or 0
    return {"processes": rows, "freed_mib": freed}
