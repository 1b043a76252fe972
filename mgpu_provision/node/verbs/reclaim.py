"""Node side of `reclaim`: find processes holding GPU memory after a killed job and end those policy allows.

A job killed with Ctrl-C or by a scheduler often leaves workers behind that still hold GPU memory. This module
lists every GPU memory holder (MPS clients with their server) with what a person needs to judge it (owner,
command, start time, parent), decides from /proc alone whether it is left over from a job that is gone or
part of a live one, and ends the ones the policy selects (or exactly the pids named) through
`procs.end_processes`, each only while it still holds the GPU. Ending a live job is the one mistake it must
not make: when in doubt a process is kept, and its reason says how to end exactly it.

Everything that decides is a pure function over `ProcInfo` snapshots (testable on fake data); reading /proc
and sending signals is `procs.py`'s. It runs inside the agent zipapp: Python 3.8, standard library only.
"""

from __future__ import annotations

import os
import pwd
import re

from ...typing_lite import TYPE_CHECKING, NamedTuple
from ..core.errors import AgentFailure
from ..host.procs import (
    PROC_ROOT,
    ProcInfo,
    ancestors,
    boot_time,
    end_processes,
    owner_name,
    pid_namespace_problem,
    proc_lookup,
)
from ..nvidia.backend import Backend, GpuLost, NvmlUnavailable

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence

    from ..host.procs import Lookup

# Daemons that hold GPU memory by design, by program name; the kernel cuts `comm` to 15 characters. MPS:
# the control daemon starts one server per user and every client runs through it; IMEX shares memory
# across the nodes of an NVLink domain; Fabric Manager, DCGM's host engine, persistenced and X.
PROTECTED_PROGRAMS = (
    "Xorg",
    "X",
    "Xwayland",
    "nvidia-persistenced",
    "nv-fabricmanager",
    "nv-hostengine",
    "nvidia-cuda-mps-server",
    "nvidia-cuda-mps-control",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
MPS_SERVER = "nvidia-cuda-mps-server"
# Families known by prefix: sshd's per-session processes ("sshd: alice@pts/0", sshd-session), DCGM's tools.
PROTECTED_PREFIXES = ("sshd", "dcgm")
COMM_LEN = 15
# How torchrun shows up in a command line: the console script, or `python -m` of its modules (torchelastic is
# the pre-1.9 name of the same agent).
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch", "torchelastic")
# Processes that adopt orphans: init, and the subreapers (prctl PR_SET_CHILD_SUBREAPER) a GPU box runs:
# `systemd --user`, container shims and container inits. A worker whose parent is one of these was
# re-parented: whatever started it is gone. (An unknown subreaper reads as a live parent: kept.)
REAPERS = ("systemd", "init", "tini", "docker-init", "dumb-init", "catatonit", "containerd-shim", "conmon")
# The command line of a child of Python's multiprocessing: a spawn child runs `-c "from multiprocessing.spawn
# import spawn_main; spawn_main(...)" --multiprocessing-fork`, the forkserver (and every child it forks)
# `-c "from multiprocessing.forkserver import main; main(...)"` (CPython Lib/multiprocessing/spawn.py,
# forkserver.py). torch.multiprocessing.spawn uses the spawn context.
MP_FORK_FLAG = "--multiprocessing-fork"
MP_PROGRAMS = ("from multiprocessing.spawn import spawn_main", "from multiprocessing.forkserver import main")
# torch names each DataLoader worker `pt_data_worker` (torch/utils/data/_utils/worker.py), and the worker
# quits when its parent goes (ManagerWatchdog): it never outlives the training script by design either.
DATALOADER_COMM = "pt_data_worker"
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


def is_reaper(info: ProcInfo) -> bool:
    """Whether the process adopts orphans: what a process left by its parent is re-parented to."""
    return info.pid == 1 or info.comm in REAPERS


def worker_kind(info: ProcInfo) -> Optional[str]:
    """What marks the process as a worker that never outlives its parent by design, or None."""
    if info.comm == DATALOADER_COMM:
        return "a DataLoader worker"
    for arg in info.argv:
        if arg == MP_FORK_FLAG or arg.startswith(MP_PROGRAMS[0]):
            return "a multiprocessing spawn worker"
        if arg.startswith(MP_PROGRAMS[1]):
            return "a multiprocessing forkserver process"
    return None


def parent_gone(info: ProcInfo, lookup: Lookup, seen: Sequence[int] = ()) -> Optional[str]:
    """How its parent shows that whatever started the process is gone, or None while that parent runs.

    A forkserver's children have the forkserver for a parent: they are left behind when it is.
    """
    parent = lookup(info.ppid) if info.ppid > 0 else None
    if parent is None or not parent.alive:
        return "its parent pid %d exited" % info.ppid
    if is_reaper(parent):
        return "its parent is gone: re-parented to " + parent.label()
    if worker_kind(parent) is None or parent.pid in seen:
        return None
    why = parent_gone(parent, lookup, (*seen, info.pid))
    return None if why is None else "its parent %s is left behind too: %s" % (parent.label(), why)


def pid_hint(info: ProcInfo, why: str) -> str:
    """A kept process's reason, with the command that ends exactly that process should it be a leftover."""
    return "%s; `reclaim --pid %d` ends exactly it" % (why, info.pid)


def classify(info: ProcInfo, lookup: Lookup) -> Classification:
    """Whether a GPU memory holder is left over from a job that is gone, and why.

    Left over: a worker that never outlives its parent (multiprocessing's spawn and forkserver children,
    DataLoader workers, torchelastic workers) whose parent is gone (re-parented to init or a subreaper),
    a member of a process group whose leader is such a leftover, or a zombie whose threads still hold
    memory. Everything else is kept: a process leading its own group (nohup, setsid, a container's main
    process), a service's main process, a member whose group leader runs, and one whose group leader is
    gone but that nothing marks as a worker (a job a wrapper script put in the background, a fork-mode
    child): that looks the same as a live job, so the reason names `reclaim --pid` to end exactly it.
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
        # The elastic agent starts each worker in a session of its own, inside torchrun or inside any
        # program that runs the agent in-process (accelerate launch, deepspeed, elastic_launch): its parent.
        gone = parent_gone(info, lookup)
        if gone is None:
            agent = lookup(info.ppid)
            return Classification(
                "torchrun", "part of the live torchelastic job of its agent %s" % (agent or info).label()
            )
        return Classification(
            "orphaned", "a torchelastic worker (run %s) left behind: %s" % (info.torchrun_run, gone)
        )
    worker = worker_kind(info)
    if worker is not None:
        gone = parent_gone(info, lookup)
        if gone is None:
            parent = lookup(info.ppid)
            return Classification("attached", "%s of the live %s" % (worker, (parent or info).label()))
        return Classification("orphaned", "%s left behind: %s" % (worker, gone))
    if info.pgid == info.pid:
        return Classification("attached", OWN_GROUP)
    if not follow_leaders:
        return Classification("attached", "a member of a process group")
    for what, pid in (("process group", info.pgid), ("session", info.sid)):
        leader = lookup(pid) if pid > 0 else None
        if leader is None or not leader.alive:
            continue
        why = _classify(leader, lookup, follow_leaders=False)
        if why.kind == "orphaned":
            return Classification(
                "orphaned", "its %s leader %s is left over: %s" % (what, leader.label(), why.reason)
            )
        if what == "process group":
            return Classification("attached", "its process group leader %s is alive" % leader.label())
    if info.ignores_hup:
        return Classification("attached", "it ignores SIGHUP: started with nohup to outlive its shell")
    return Classification(
        "attached",
        pid_hint(
            info,
            "its process group leader pid %d is gone and nothing marks it as that job's worker "
            "(a backgrounded job? a fork-mode child?)" % info.pgid,
        ),
    )


def protected_program(info: ProcInfo) -> Optional[str]:
    """The daemon this process is (sshd, Xorg, nvidia-persistenced, the MPS server, ...), or None.

    The program name decides before `comm`: MPS's server and control daemon share their first 15 letters.
    """
    program = os.path.basename(info.argv[0].split(" ")[0]) if info.argv else ""
    named = [n for n in PROTECTED_PROGRAMS if program == n] + [
        n for n in PROTECTED_PROGRAMS if info.comm == n[:COMM_LEN]
    ]
    if named:
        return named[0]
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
    pids: Sequence[int] = (),
) -> Decision:
    """Whether policy selects the process, refusing when it selects one that must never be ended.

    With `pids` (`reclaim --pid`) exactly those are selected, whatever the classification says.
    """
    if policy == "never":
        return Decision("keep", "policy is never; " + why.reason)
    if owner is not None and info.uid != owner.uid:
        return Decision("keep", "owned by %s, not %s" % (owner_name(info.uid), owner.name))
    if pids:
        if info.pid not in pids:
            return Decision("keep", "not named by --pid; " + why.reason)
        selected = "named by --pid; " + why.reason
    else:
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


def gpu_holders(backend: Backend, gpus: Sequence[int]) -> List[Dict[str, Any]]:
    """GPU memory holders of an opened backend as {pid, gpu, used_mib, mps_client}: the compute processes
    and the clients of an MPS server, whom NVML lists apart (the server stands for them among the former)."""
    holders: List[Dict[str, Any]] = []
    for gpu in gpus:
        try:
            found = [(pid, used, False) for pid, used in backend.processes(gpu)]
            found += [(pid, used, True) for pid, used in backend.mps_processes(gpu)]
        except GpuLost:
            continue  # its memory is gone with it; the others are read
        # Rounded up: a process holding any memory at all must not look like one that holds none.
        holders += [
            {"pid": pid, "gpu": gpu, "used_mib": None if used is None else -(-used // MIB), "mps_client": mps}
            for pid, used, mps in found
        ]
    return holders


def mps_server_of(holder: Dict[str, Any], holders: Sequence[Dict[str, Any]], lookup: Lookup) -> Optional[int]:
    """The pid of the MPS server an MPS client runs through: the server on its GPU, its owner's if several
    (the control daemon starts one server per user); None for other holders or when none is seen."""
    if not holder.get("mps_client"):
        return None
    client = lookup(holder["pid"])
    servers = [
        info
        for h in holders
        if h["gpu"] == holder["gpu"] and not h.get("mps_client")
        for info in [lookup(h["pid"])]
        if info is not None and protected_program(info) == MPS_SERVER
    ]
    own = [s for s in servers if client is not None and s.uid == client.uid]
    return (own or servers)[0].pid if servers else None


def _holders(backend: Backend) -> List[Dict[str, Any]]:
    """GPU memory holders from the agent's NVML backend (real or simulated)."""
    try:
        backend.open()
    except NvmlUnavailable as exc:
        raise AgentFailure(
            "nvml", "cannot list the processes holding GPU memory ({}): {}".format(exc.status, exc.message)
        ) from None
    try:
        return gpu_holders(backend, range(backend.device_count()))
    finally:
        backend.close()


def _args(args: Dict[str, Any]) -> Dict[str, Any]:
    """The verb's options; types were checked and defaults filled in at the door (`protocol.VERB_ARGS`)."""
    policy = args["policy"]
    return {
        "policy": policy,
        "patterns": compile_patterns(policy, args["patterns"]),
        "grace_s": float(args["grace_s"]),
        "dry_run": bool(args["dry_run"]),
        "owner": _owner(args["user"]),
        "pids": frozenset(args["pids"]),
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
    holder: Dict[str, Any],
    info: ProcInfo,
    why: Classification,
    btime: float,
    hz: int,
    mps_server: Optional[int] = None,
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
        "mps_server": mps_server,
        "classification": why.kind,
    }


def run(args: Dict[str, Any], backend: Backend, root: str = PROC_ROOT) -> Dict[str, Any]:
    """The `reclaim` verb: list GPU memory holders, decide, and (unless dry_run) end the selected ones.

    Holders whose pid is dead are skipped: their memory is already free (on a simulated node the twin may
    still list them). Result: {"processes": [GpuProcess + classification, action, reason], "freed_mib": int,
    "not_holders": [pids named by `pids` that hold no GPU memory here]}, with action one of keep, refused,
    would-end (dry run), ended, failed.
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
    holders = _holders(backend)
    for holder in holders:
        info = lookup(holder["pid"])
        if info is None or not info.alive:
            continue
        why = classify(info, lookup)
        decision = decide(
            info,
            holder["used_mib"],
            why,
            opts["policy"],
            opts["patterns"],
            agent,
            opts["owner"],
            opts["pids"],
        )
        row = describe(holder, info, why, btime, hz, mps_server_of(holder, holders, lookup))
        row["action"], row["reason"] = decision
        if decision.action == "end":
            row["action"] = "would-end"
            targets[info.pid] = info
        rows.append(row)
    listed = {row["pid"] for row in rows}
    result: Dict[str, Any] = {"processes": rows, "freed_mib": 0, "not_holders": sorted(opts["pids"] - listed)}
    if opts["dry_run"] or not targets:
        return result
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
    return dict(result, freed_mib=freed)
