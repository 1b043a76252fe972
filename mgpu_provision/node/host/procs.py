"""Processes as /proc shows them, and the one way the agent ends processes it started or found left over.

Reclaim (GPU memory holders of killed jobs) and smoke (its own torchrun and workers) both end processes: each
target is named by its pid AND its start time, so a pid the kernel reused for another process is never
signalled; all get SIGTERM at once, SIGKILL after the grace period, then a check that each is really gone.
Reclaim also has each target checked just before each signal: a process that let go of the GPU meanwhile is
left alone.
It runs inside the agent zipapp: Python 3.8, standard library only.
"""

from __future__ import annotations

import os
import pwd
import signal
import time

from ...typing_lite import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional

PROC_ROOT = "/proc"
DEVICE_PREFIX = "/dev/nvidia"  # nvidiactl, nvidia0..N, nvidia-uvm: every CUDA process keeps them open
# The initial pid namespace has this fixed inode (PROC_PID_INIT_INO in the kernel's proc_ns.h).
INIT_PID_NAMESPACE = "pid:[4026531836]"
# What torchrun puts in the environment of every worker it starts (torch.distributed.elastic's agent).
TORCHRUN_RUN_ENV = b"TORCHELASTIC_RUN_ID="
SIGHUP_BIT = 1 << (signal.SIGHUP - 1)
POLL_S = 0.05
# After SIGKILL a process normally vanishes at once; a longer wait means it is stuck in the kernel (state D).
KILL_WAIT_S = 5.0


class ProcInfo(NamedTuple):
    """One process as /proc shows it at one moment."""

    pid: int
    ppid: int
    state: str  # the leader's state letter; Z with live threads = the main thread exited, others run on
    comm: str
    argv: List[str]
    uid: Optional[int]
    start_ticks: int  # clock ticks after boot: with the pid, it names one process even if the pid is reused
    sid: int
    unit: str  # last component of the cgroup path, e.g. "sshd.service" or "session-3.scope"
    alive: bool  # at least one thread has not exited (a plain zombie is dead: its memory is already freed)
    pgid: int
    ignores_hup: bool  # SIGHUP is ignored: nohup does that, and it lasts through exec and fork
    torchrun_run: Optional[str]  # TORCHELASTIC_RUN_ID from its environment: torchrun started it as a worker

    @property
    def command(self) -> str:
        return " ".join(self.argv) if self.argv else "[" + self.comm + "]"

    def label(self) -> str:
        return "pid %d (%s)" % (self.pid, self.comm)


if TYPE_CHECKING:
    Lookup = Callable[[int], Optional[ProcInfo]]


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None


def _thread_alive(stat: Optional[bytes]) -> bool:
    return stat is not None and _parse_stat(stat)[1] not in ("Z", "X")


def _parse_stat(stat: bytes) -> List[str]:
    """Fields of /proc/<pid>/stat from `comm` on; comm may itself hold spaces and parentheses."""
    head, _, tail = stat.decode("utf-8", "replace").rpartition(")")
    return [head.partition("(")[2], *tail.split()]


def read_proc(pid: int, root: str = PROC_ROOT) -> Optional[ProcInfo]:
    """Snapshot of one process, or None when there is no such process."""
    base = os.path.join(root, str(pid))
    stat = _read(os.path.join(base, "stat"))
    if stat is None:
        return None
    fields = _parse_stat(stat)
    comm, state, ppid, pgid, sid, start_ticks = (
        fields[0],
        fields[1],
        int(fields[2]),
        int(fields[3]),
        int(fields[4]),
        int(fields[20]),
    )
    alive = state not in ("Z", "X")
    if not alive:
        try:
            tids = os.listdir(os.path.join(base, "task"))
        except OSError:
            tids = []
        alive = any(_thread_alive(_read(os.path.join(base, "task", tid, "stat"))) for tid in tids)
    uid = None
    ignored = 0
    for line in (_read(os.path.join(base, "status")) or b"").decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
        elif line.startswith("SigIgn:"):
            ignored = int(line.split()[1], 16)
    cmdline = (_read(os.path.join(base, "cmdline")) or b"").decode("utf-8", "replace")
    cgroup = (_read(os.path.join(base, "cgroup")) or b"").decode("utf-8", "replace")
    unit = ""
    for line in cgroup.splitlines():
        # cgroup v2 ("0::/path") or v1's systemd hierarchy name the unit the process runs in.
        if line.startswith("0::") or ":name=systemd:" in line:
            unit = line.rpartition("/")[2]
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        state=state,
        comm=comm,
        argv=[a for a in cmdline.split("\0") if a],
        uid=uid,
        start_ticks=start_ticks,
        sid=sid,
        unit=unit,
        alive=alive,
        pgid=pgid,
        ignores_hup=bool(ignored & SIGHUP_BIT),
        torchrun_run=_torchrun_run(base),
    )


def _torchrun_run(base: str) -> Optional[str]:
    try:
        environ = _read(os.path.join(base, "environ")) or b""
    except PermissionError:
        # Another user's environment: without it a leftover worker looks like a job of its own and is kept.
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(TORCHRUN_RUN_ENV):
            return entry[len(TORCHRUN_RUN_ENV) :].decode("utf-8", "replace")
    return None


def proc_lookup(root: str = PROC_ROOT) -> Lookup:
    """A cached `read_proc`: one consistent-enough view of the process tree for one decision."""
    cache: Dict[int, Optional[ProcInfo]] = {}

    def lookup(pid: int) -> Optional[ProcInfo]:
        if pid not in cache:
            cache[pid] = read_proc(pid, root)
        return cache[pid]

    return lookup


def boot_time(root: str = PROC_ROOT) -> float:
    for line in (_read(os.path.join(root, "stat")) or b"").decode().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def owner_name(uid: Optional[int]) -> Optional[str]:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def pid_namespace_problem(root: str = PROC_ROOT) -> Optional[str]:
    """Why the agent is not in the initial pid namespace (the one NVML's pids belong to), or None."""
    try:
        namespace = os.readlink(os.path.join(root, "self", "ns", "pid"))
    except OSError as exc:
        return "cannot tell which pid namespace the agent runs in (%s)" % exc.strerror
    if namespace == INIT_PID_NAMESPACE:
        return None
    return "the agent runs in pid namespace %s, not the host's %s" % (namespace, INIT_PID_NAMESPACE)


def holds_device(pid: int, root: str = PROC_ROOT, prefix: str = DEVICE_PREFIX) -> Optional[bool]:
    """Whether the process has a file under `prefix` open; None when /proc does not let the agent look.

    A defunct leader's own fd table is gone while its other threads keep theirs, so threads are asked too.
    """
    base = os.path.join(root, str(pid))
    try:
        tids = os.listdir(os.path.join(base, "task"))
    except OSError:
        return False
    denied = False
    for folder in [os.path.join(base, "fd")] + [os.path.join(base, "task", tid, "fd") for tid in tids]:
        try:
            fds = os.listdir(folder)
        except PermissionError:
            denied = True
            continue
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(folder, fd)).startswith(prefix):
                    return True
            except OSError:
                continue
    return None if denied else False


def ancestors(info: ProcInfo, lookup: Lookup) -> List[ProcInfo]:
    """Parent, grandparent, ... up to (not including) pid 0; stops at a gone parent or a loop."""
    chain: List[ProcInfo] = []
    seen = {info.pid}
    pid = info.ppid
    while pid > 0 and pid not in seen:
        parent = lookup(pid)
        if parent is None:
            break
        chain.append(parent)
        seen.add(pid)
        pid = parent.ppid
    return chain


def same_process(target: ProcInfo, lookup_now: Lookup) -> bool:
    """The pid still names the process that was listed (same start time) and it has not exited."""
    now = lookup_now(target.pid)
    return now is not None and now.start_ticks == target.start_ticks and now.alive


# Whether a process still holds the GPU: True, False, or None when the agent may not look.
if TYPE_CHECKING:
    HoldsGpu = Callable[[int], Optional[bool]]


def _signal(target: ProcInfo, sig: int, root: str, holds_gpu: Optional[HoldsGpu]) -> Optional[str]:
    """Send `sig` if the pid still names the listed process (and, with `holds_gpu`, it still holds the GPU);
    the outcome when it is not sent, else None."""
    # Opened before the checks, a pidfd keeps naming the process checked even if it exits and its pid is
    # reused before the signal goes out (Linux 5.3 and Python 3.9 on; a plain kill() before that).
    handle = _pidfd(target.pid)
    try:
        now = read_proc(target.pid, root)
        if now is None or not now.alive:
            return "ended"
        if now.start_ticks != target.start_ticks:
            return "left alone: pid %d now names another process (pid reused)" % target.pid
        held = True if holds_gpu is None else holds_gpu(target.pid)
        if held is None:
            return "failed: cannot see the open files of pid %d (run the agent as root)" % target.pid
        if not held:
            return "left alone: it has no /dev/nvidia* file open any more"
        try:
            if handle is None:
                os.kill(target.pid, sig)
            else:
                signal.pidfd_send_signal(handle, sig)
        except ProcessLookupError:
            return "ended"
        except PermissionError:
            return "failed: not permitted to signal pid %d (run the agent as its owner or root)" % target.pid
        return None
    finally:
        if handle is not None:
            os.close(handle)


def _pidfd(pid: int) -> Optional[int]:
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def _wait_gone(pending: Dict[int, ProcInfo], deadline: float, root: str) -> None:
    while pending:
        lookup = proc_lookup(root)
        for pid in [p for p, t in pending.items() if not same_process(t, lookup)]:
            del pending[pid]
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(POLL_S)


def end_processes(
    targets: Iterable[ProcInfo],
    grace_s: float,
    root: str = PROC_ROOT,
    holds_gpu: Optional[HoldsGpu] = None,
) -> Dict[int, str]:
    """SIGTERM all, SIGKILL what is left after `grace_s`, verify each is gone. Returns pid -> outcome.

    With `holds_gpu`, a process is signalled only while it still holds the GPU (reclaim's leftovers; smoke
    ends its own processes whatever they hold).
    Outcomes start with "ended" when the listed process is gone, "left alone" or "failed" otherwise.
    All get SIGTERM first so that a fleet of leftovers costs one grace period, not one each.
    """
    outcomes: Dict[int, str] = {}
    pending: Dict[int, ProcInfo] = {}
    for target in targets:
        early = _signal(target, signal.SIGTERM, root, holds_gpu)
        if early is None:
            pending[target.pid] = target
        else:
            outcomes[target.pid] = "ended before it was signalled" if early == "ended" else early
    termed = list(pending)
    _wait_gone(pending, time.monotonic() + grace_s, root)
    outcomes.update((pid, "ended by SIGTERM") for pid in termed if pid not in pending)
    for target in list(pending.values()):
        early = _signal(target, signal.SIGKILL, root, holds_gpu)
        if early is not None:
            outcomes[target.pid] = "ended by SIGTERM" if early == "ended" else early
            del pending[target.pid]
    killed = list(pending)
    _wait_gone(pending, time.monotonic() + KILL_WAIT_S, root)
    for pid in killed:
        outcomes[pid] = (
            "failed: still running %gs after SIGKILL (stuck in the kernel?)" % KILL_WAIT_S
            if pid in pending
            else "ended by SIGKILL after the %gs grace period" % grace_s
        )
    return outcomes
