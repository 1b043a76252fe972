"""Time one benchmark run: wall clock, CPU and peak memory of the client processes that did the work.

Every contender is a set of client processes started at the same instant (one `mgpu-provision` or one
`ansible`, or one `ssh` per host for the floor). Each runs under GNU time, which forks it from its own
small process and reports the peak RSS of the client and of the children it reaped (Ansible's workers and
their `ssh` clients). Reading the peak from this process's own wait would be wrong: Linux carries a
process's peak RSS across exec, so anything started from this Python process would inherit its size.

CPU is not GNU time's figure, which it prints in 10 ms steps (0.20 against 0.17 s says little about a 1.2×
target). It is the rusage this process's `wait4` returns for the spawned chain (the namespace prefix, GNU
time and the client with every child it reaped), in microseconds, less that chain's own cost: the median
CPU of the same chain running `true`, measured once per prefix in the same run, minus `true`'s own.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import resource
import select
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

GNU_TIME = "/usr/bin/time"
# elapsed, user CPU, system CPU (seconds), peak RSS (KiB); GNU time writes it as the file's last line.
_FORMAT = "%e %U %S %M"


@dataclass(frozen=True)
class Spawn:
    """One client process to start: its argv, what it reads on stdin, extra environment, and the command
    prefix that enters the network namespace it runs in (its CPU is taken out of the client's)."""

    argv: tuple[str, ...]
    stdin: bytes = b""
    env: Mapping[str, str] | None = None
    netns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Finished:
    """What one client process left behind."""

    returncode: int
    stdout: str
    stderr: str
    cpu_s: float
    peak_rss_kib: int


@dataclass(frozen=True)
class Usage:
    """One run of a contender: all its processes, started together."""

    wall_s: float
    processes: tuple[Finished, ...]
    started_at: float = 0.0  # time.time() when the first process was started

    @property
    def cpu_s(self) -> float:
        return sum(p.cpu_s for p in self.processes)

    @property
    def peak_rss_kib(self) -> int:
        """Largest resident set of any one process (with its reaped children)."""
        return max(p.peak_rss_kib for p in self.processes)


def parse_time_report(text: str) -> int:
    """The peak RSS (KiB) in GNU time's report; raises ValueError when there is no report."""
    lines = text.strip().splitlines()
    if not lines:
        raise ValueError("GNU time wrote no report")
    return int(lines[-1].split()[-1])


def _timed(spawn: Spawn, report: str) -> list[str]:
    return [*spawn.netns, GNU_TIME, "-f", _FORMAT, "-o", report, *spawn.argv]


def _cpu_s(usage: resource.struct_rusage) -> float:
    return float(usage.ru_utime + usage.ru_stime)


def _spawned_cpu_s(argv: list[str]) -> float:
    pid = os.posix_spawnp(argv[0], argv, os.environ)
    return _cpu_s(os.wait4(pid, 0)[2])


@functools.cache
def wrapper_cpu_s(netns: tuple[str, ...], rounds: int = 15) -> float:
    """What the chain around a client costs in CPU (the prefix entering `netns`, GNU time): the median of
    `rounds` chains running `true`, less the median of `true` alone."""
    chained = _timed(Spawn(("true",), netns=netns), os.devnull)
    around = statistics.median(_spawned_cpu_s(chained) for _ in range(rounds))
    alone = statistics.median(_spawned_cpu_s(["true"]) for _ in range(rounds))
    return max(0.0, around - alone)


def run_together(spawns: Sequence[Spawn], at_once: int | None = None) -> Usage:
    """Start every process at once (or `at_once` at a time, the next as soon as one ends), wait for all;
    stdin and output go through files, never pipes.

    Files instead of pipes: no reader threads competing for the CPU, and no deadlock when a client prints
    more than a pipe holds. Each process is waited for through its pidfd, never with a wait for any child:
    this process has other children (the test hosts) that must not be reaped here.
    """
    limit = len(spawns) if at_once is None else max(1, at_once)
    with contextlib.ExitStack() as stack:
        files = [tuple(stack.enter_context(tempfile.TemporaryFile()) for _ in range(3)) for _ in spawns]
        reports = [stack.enter_context(tempfile.NamedTemporaryFile("r")) for _ in spawns]
        for spawn, (stdin, _, _) in zip(spawns, files, strict=True):
            stdin.write(spawn.stdin)
            stdin.seek(0)
        statuses: list[int] = [0] * len(spawns)
        cpu: list[float] = [0.0] * len(spawns)
        wrapper = [wrapper_cpu_s(spawn.netns) for spawn in spawns]  # before the clock starts
        running: dict[int, tuple[int, int]] = {}  # pidfd -> (index, pid)
        poller = select.poll()

        def start(index: int) -> None:
            spawn, (stdin, stdout, stderr), report = spawns[index], files[index], reports[index]
            argv = _timed(spawn, report.name)
            actions = [
                (os.POSIX_SPAWN_DUP2, stdin.fileno(), 0),
                (os.POSIX_SPAWN_DUP2, stdout.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, stderr.fileno(), 2),
            ]
            env = {**os.environ, **(spawn.env or {})}
            pid = os.posix_spawnp(argv[0], argv, env, file_actions=actions)
            fd = os.pidfd_open(pid)
            running[fd] = (index, pid)
            poller.register(fd, select.POLLIN)

        def reap(fd: int) -> None:
            index, pid = running.pop(fd)
            poller.unregister(fd)
            os.close(fd)
            _, statuses[index], usage = os.wait4(pid, 0)
            cpu[index] = max(0.0, _cpu_s(usage) - wrapper[index])

        queue = iter(range(len(spawns)))
        started_at = time.time()
        started = time.perf_counter()
        try:
            for index in itertools.islice(queue, limit):
                start(index)
            while running:
                for fd, _ in poller.poll():
                    reap(fd)
                    following = next(queue, None)
                    if following is not None:
                        start(following)
        finally:
            # Reap what started even when a later spawn failed: no zombie is left behind.
            for fd in list(running):
                reap(fd)
        wall = time.perf_counter() - started
        finished = []
        for status, used, (_, stdout, stderr), report in zip(statuses, cpu, files, reports, strict=True):
            rss = parse_time_report(report.read())
            finished.append(
                Finished(os.waitstatus_to_exitcode(status), _read(stdout), _read(stderr), used, rss)
            )
        return Usage(wall, tuple(finished), started_at)


def _read(handle: IO[bytes]) -> str:
    handle.seek(0)
    return handle.read().decode(errors="replace")
