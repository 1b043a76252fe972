"""Figures of one process at a time: the agent's facts call on a node, what `plan` imports, `validate`.

These bound what the fleet figures can reach: the agent's CPU is paid once per host by every contender, the
imports and `validate` once per command. Each is the median of several runs (CPU of that one process and
its children from the kernel's rusage, wall clock), in the same run and on the same frozen code as the fleet.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hotspots import import_bill, import_lines

PLAN_IMPORT = "import mgpu_provision.commands.plan"
RUNS = 7


@dataclass(frozen=True)
class Timed:
    """Medians over `runs` runs of one command: wall and CPU seconds (user + system, with children), and the
    best wall (other work on a shared machine only ever adds to it, so the best is nearest the idle one)."""

    wall_s: float
    cpu_s: float
    runs: int
    best_wall_s: float = 0.0


def timed(prefix: Sequence[str], argv: Sequence[str], stdin: bytes = b"", runs: int = RUNS) -> Timed:
    """Run `prefix + argv` `runs` times; CPU from the kernel's rusage of the process and its children
    (microseconds, where GNU time prints hundredths), wall from this process's clock. The prefix (nsenter,
    env) execs into `argv` in the same process, so its own cost is a few exec calls. Any failed run raises
    RuntimeError with its output."""
    walls, cpus = [], []
    for _ in range(runs):
        with tempfile.TemporaryFile() as given, tempfile.TemporaryFile() as output:
            given.write(stdin)
            given.seek(0)
            started = time.perf_counter()
            process = subprocess.Popen([*prefix, *argv], stdin=given, stdout=output, stderr=output)
            _, status, usage = os.wait4(process.pid, 0)
            walls.append(time.perf_counter() - started)
            process.returncode = os.waitstatus_to_exitcode(status)
            if process.returncode != 0:
                output.seek(0)
                said = output.read().decode(errors="replace")[-1500:]
                raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}: {said}")
        cpus.append(usage.ru_utime + usage.ru_stime)
    return Timed(statistics.median(walls), statistics.median(cpus), runs, min(walls))


@dataclass(frozen=True)
class ImportCost:
    """What importing a module costs beyond a bare interpreter: by `-X importtime` (a wall clock inside the
    process), by wall clock, and by CPU (which other work on the machine does not inflate)."""

    importtime_ms: float  # median cumulative of the top-level imports that `python -c pass` does not make
    importtime_best_ms: float  # the least of those
    wall_ms: float  # median wall of `python -c IMPORT` less that of `python -c pass`
    cpu_ms: float  # median CPU of `python -c IMPORT` less that of `python -c pass`
    heaviest: list[tuple[str, float]]  # the costliest packages (cumulative ms of their first import)


def beyond_baseline(
    bill: Sequence[tuple[str, int]], baseline: Sequence[tuple[str, int]]
) -> list[tuple[str, int]]:
    """The top-level imports of `bill` that the bare interpreter's start-up does not make too."""
    known = {name for name, _ in baseline}
    return [(name, micros) for name, micros in bill if name not in known]


def _importtime_text(python: str, code: str) -> str:
    argv = [python, "-X", "importtime", "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stderr


def _importtime(python: str, code: str) -> list[tuple[str, int]]:
    return import_bill(_importtime_text(python, code))


def package_roots(importtime: str, shown: int = 6) -> list[tuple[str, int]]:
    """The packages whose first import cost most (cumulative microseconds), at whatever depth they were
    imported: `pydantic` under `mgpu_provision.facts` counts as pydantic's. Sub-packages of this project
    count under their own names (`mgpu_provision.facts`), its root package not at all: it holds them all."""
    roots = []
    for _, name, micros in import_lines(importtime):
        own = name.startswith("mgpu_provision.") and name.count(".") == 1
        if own or ("." not in name and name != "mgpu_provision"):
            roots.append((name, micros))
    return sorted(roots, key=lambda item: -item[1])[:shown]


def import_cost(python: str = sys.executable, statement: str = PLAN_IMPORT, runs: int = RUNS) -> ImportCost:
    """Median over `runs` of each measure; the first run of each is dropped as a bytecode-cache warm-up."""
    _importtime(python, statement)
    baseline = _importtime(python, "pass")
    texts = [_importtime_text(python, statement) for _ in range(runs)]
    totals = [sum(micros for _, micros in beyond_baseline(import_bill(t), baseline)) / 1000 for t in texts]
    middle = texts[totals.index(statistics.median_low(totals))]
    with_import = timed([], [python, "-c", statement], runs=runs)
    bare = timed([], [python, "-c", "pass"], runs=runs)
    return ImportCost(
        statistics.median(totals),
        min(totals),
        (with_import.wall_s - bare.wall_s) * 1000,
        (with_import.cpu_s - bare.cpu_s) * 1000,
        [(name, micros / 1000) for name, micros in package_roots(middle)],
    )


@dataclass(frozen=True)
class AgentCost:
    """The cached agent's facts call on a simulated node, next to a bare start of the node's python."""

    facts: Timed
    python_start: Timed


def agent_cost(
    namespace: Sequence[str], python: str, agent: str, request: bytes, runs: int = RUNS
) -> AgentCost:
    """Both run inside the host's namespaces (`namespace`: nsenter and the login's environment)."""
    return AgentCost(
        timed(namespace, [python, agent, "facts"], request, runs),
        timed(namespace, [python, "-c", "pass"], runs=runs),
    )


def validate_cost(mgpu_provision: str, rig: Path, runs: int = RUNS) -> Timed:
    timed([], [mgpu_provision, "validate", str(rig)], runs=1)  # warm-up: bytecode caches
    return timed([], [mgpu_provision, "validate", str(rig)], runs=runs)
