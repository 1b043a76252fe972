"""When did a smoke run's ranks start, and how much of the wait was torch's import: smoke's start-up overhead.

`smoke`'s start-up is the time from the command's start until every rank of the DDP job runs; torch's own
import (by the node's torch probe, by torchrun, by the ranks) is not the tool's to cut, so the overhead is
that time less the moments when some torch import was in progress. The package cannot tell when a rank's
process started, so the benchmark puts this `sitecustomize` in front of the smoke python's PYTHONPATH (the
rig file's `env`, as a site would set it): every Python process of the run appends one line when it starts
and one when its `import torch` is done. Lines are short single `write`s to an O_APPEND file, so processes
on all hosts share it without locks; this machine's clock is every host's clock (loopback test hosts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# What the hook writes, one line per event: "start <pid> <RANK or -> <t>" when a process starts and
# "torch <pid> <RANK or -> <begin> <end>" when its torch import finished (time.time(), seconds).
_HOOK = '''"""Benchmark hook (benchmarks/smoke_clock.py): when this process started and imported torch."""
import os
import sys
import time

_CLOCK = {clock!r}
_STARTED = time.time()


def _note(*fields):
    who = [fields[0], str(os.getpid()), os.environ.get("RANK", "-")]
    line = " ".join(who + [repr(f) for f in fields[1:]])
    fd = os.open(_CLOCK, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)


class _TorchTimer:
    """Finds nothing itself; on the first `import torch` it wraps the real loader to time the import."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module):
                begin = time.time()
                try:
                    load(module)
                finally:
                    _note("torch", begin, time.time())

            spec.loader.exec_module = exec_module
        return spec


_note("start", _STARTED)
sys.meta_path.insert(0, _TorchTimer())
'''


def hook_source(clock: Path) -> str:
    """The `sitecustomize.py` that appends this run's events to `clock`."""
    return _HOOK.format(clock=str(clock))


@dataclass(frozen=True)
class Event:
    kind: str  # "start" or "torch"
    pid: int
    rank: int | None  # RANK from torchrun; None for the probe and torchrun itself
    begin: float
    end: float  # == begin for "start"


def parse_clock(text: str) -> list[Event]:
    """The hook's lines; a line cut short (a process killed mid-write) is skipped."""
    events = []
    for line in text.splitlines():
        fields = line.split()
        try:
            if fields[0] == "start" and len(fields) == 4:
                begin = end = float(fields[3])
            elif fields[0] == "torch" and len(fields) == 5:
                begin, end = float(fields[3]), float(fields[4])
            else:
                continue
            events.append(
                Event(fields[0], int(fields[1]), None if fields[2] == "-" else int(fields[2]), begin, end)
            )
        except (IndexError, ValueError):
            continue
    return events


def covered(intervals: Iterable[tuple[float, float]], start: float, stop: float) -> float:
    """Seconds of [start, stop] inside at least one interval (overlapping imports count once)."""
    total, reached = 0.0, start
    for begin, end in sorted(intervals):
        begin, end = max(begin, reached), min(end, stop)
        if end > begin:
            total += end - begin
            reached = end
    return total


@dataclass(frozen=True)
class StartUp:
    to_ranks_s: float  # command start -> the last rank's process started
    torch_s: float  # of that, time during which some torch import was in progress
    ranks: int

    @property
    def overhead_s(self) -> float:
        return self.to_ranks_s - self.torch_s


def start_up(events: Sequence[Event], command_start: float, ranks: int) -> StartUp:
    """Smoke's start-up from one run's events; ValueError when not every rank left a start line."""
    starts = {e.rank: e.begin for e in events if e.kind == "start" and e.rank is not None}
    if len(starts) != ranks:
        raise ValueError(f"the clock saw {len(starts)} of {ranks} ranks start")
    last = max(starts.values())
    torch = covered(((e.begin, e.end) for e in events if e.kind == "torch"), command_start, last)
    return StartUp(last - command_start, torch, ranks)
