"""Where `mgpu-provision plan` spends its time on the benchmark fleet: a sampled profile and the import bill.

`fleet.py --profile` runs this once on the largest (converged) fleet after the timed runs, so the hot spots
behind the table come from the same hosts. py-spy (installed in .bench-venv, never in the project's venv)
samples every thread without pausing the program (`--nonblocking`: pausing 60+ threads for every sample
stretches whatever runs alone, and made the single-threaded planning look like a third of the run when it
takes 1%); `-X importtime` prices the start-up imports, which every invocation pays.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from contenders import Fleet, Tool

RATE_HZ = 200
SHOWN = 25


@dataclass(frozen=True)
class Profile:
    samples: int
    inclusive: Counter[str]  # function -> samples with it anywhere on the stack
    own: Counter[str]  # function -> samples with it on top of the stack


def _function(frame: str) -> str:
    """`name (path:line)` -> `name (path)`: lines differ within one function, the function is the unit."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def collapse(raw: str) -> Profile:
    """Sum py-spy's raw (collapsed-stack) output per function."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_function(f) for f in stack.split(";") if f]
        samples += int(count)
        for function in set(frames):
            inclusive[function] += int(count)
        if frames:
            own[frames[-1]] += int(count)
    return Profile(samples, inclusive, own)


def import_lines(importtime: str) -> list[tuple[int, str, int]]:
    """(indent, module, cumulative microseconds) per line of `python -X importtime`'s stderr; other lines
    on stderr are skipped. One space of indent: imported by the program itself; deeper ones are imports of
    imports."""
    found = []
    for line in importtime.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) != 3 or not fields[1].strip().isdigit():
            continue
        module = fields[2].rstrip()
        found.append((len(module) - len(module.lstrip()), module.strip(), int(fields[1])))
    return found


def import_bill(importtime: str) -> list[tuple[str, int]]:
    """Top-level imports and their cumulative microseconds, costliest first."""
    bill = [(module, micros) for indent, module, micros in import_lines(importtime) if indent == 1]
    return sorted(bill, key=lambda item: -item[1])


def _readable(counts: Counter[str]) -> list[tuple[str, int]]:
    return [(f, c) for f, c in counts.most_common() if "(<frozen " not in f]


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:5.1f}%" if total else "  –"


def summary(profile: Profile, bill: list[tuple[str, int]], hosts: int) -> str:
    lines = [
        f"# Where `mgpu-provision plan --json` spends its time on {hosts} converged hosts",
        "",
        f"py-spy --nonblocking at {RATE_HZ} Hz, all threads, {profile.samples} samples (a thread waiting for "
        "the CPU on a busy machine is sampled too, so shares matter more than seconds).",
        "",
        "## Start-up imports (`-X importtime`, cumulative ms)",
        "",
        *[f"- {module}: {micros / 1000:.0f} ms" for module, micros in bill[:12]],
        f"- total of top-level imports: {sum(m for _, m in bill) / 1000:.0f} ms",
        "",
        "## Inclusive (function anywhere on the stack; the import machinery's own frames left out)",
        "",
        "```",
        *[f"{_share(c, profile.samples)}  {f}" for f, c in _readable(profile.inclusive)[:SHOWN]],
        "```",
        "",
        "## Own (function on top of the stack)",
        "",
        "```",
        *[f"{_share(c, profile.samples)}  {f}" for f, c in profile.own.most_common(SHOWN)],
        "```",
    ]
    return "\n".join(lines) + "\n"


def profile_plan(fleet: Fleet, py_spy: str, out: Path) -> Path:
    """Profile one `plan` run on `fleet` and its imports; write `plan-profile.md` into `out`."""
    (spawn,) = Tool("plan").spawns(fleet)
    argv = [*spawn.netns, *spawn.argv]  # in the flat client's namespace, where the hosts are reached
    raw = fleet.workdir / "plan.pyspy.txt"
    record = [
        py_spy,
        "record",
        "--nonblocking",
        "--rate",
        str(RATE_HZ),
        "--format",
        "raw",
        "--output",
        str(raw),
    ]
    subprocess.run(
        [*spawn.netns, *record, "--", *spawn.argv],
        capture_output=True,
        check=True,
    )
    imports = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    )
    page = out / "plan-profile.md"
    page.write_text(summary(collapse(raw.read_text()), import_bill(imports.stderr), len(fleet.hosts)))
    return page
