"""Time one benchmark run: wall clock, CPU and peak memory of the client processes that did the work.

Every contender is a set of client processes started at the same instant (one `mgpu-provision` or one
`ansible`, or one `ssh` per host for the floor). Each runs under GNU time, which forks it from its own
small process and reports its CPU and peak RSS together with those of the children it reaped (Ansible's
workers and their `ssh` clients). Reading the child's rusage here instead would be wrong: Linux carries a
process's peak RSS across exec, so anything started from this Python process would inherit its size.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
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
    prefix that enters the network namespace it runs in (outside GNU time: not the client's CPU)."""

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


def parse_time_report(text: str) -> tuple[float, int]:
    """(CPU seconds, peak RSS KiB) from GNU time's report; raises ValueError when it is not there."""
    lines = text.strip().splitlines()
    if not lines:
        raise ValueError("GNU time wrote no report")
    _, user, system, rss = lines[-1].split()
    return float(user) + float(system), int(rss)


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
        running: dict[int, tuple[int, int]] = {}  # pidfd -> (index, pid)
        poller = select.poll()

        def start(index: int) -> None:
            spawn, (stdin, stdout, stderr), report = spawns[index], files[index], reports[index]
            argv = [*spawn.netns, GNU_TIME, "-f", _FORMAT, "-o", report.name, *spawn.argv]
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
            statuses[index] = os.waitpid(pid, 0)[1]

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
        for status, (_, stdout, stderr), report in zip(statuses, files, reports, strict=True):
            cpu, rss = parse_time_report(report.read())
            finished.append(
                Finished(os.waitstatus_to_exitcode(status), _read(stdout), _read(stderr), cpu, rss)
            )
        return Usage(wall, tuple(finished), started_at)


def _read(handle: IO[bytes]) -> str:
    handle.seek(0)
    return handle.read().decode(errors="replace")
