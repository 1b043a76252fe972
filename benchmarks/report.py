"""Turn benchmark samples into the figures issue 9 asks for: medians, spread, ratios, and the targets.

Pure functions only, so the arithmetic and the table are tested without starting a single host.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

FLOOR = "ssh"
FLOORS = (FLOOR, "ssh-64")  # all at once, or 64 at a time: the floor is the faster at each size
SMOKE_FLOOR = "smoke-floor"  # smoke's rows compare with this floor, measured on the same smoke fleet
PEER = "ansible"  # the "Ansible ÷ this" column: Ansible as people run an ad-hoc command
TOOL = "plan"
# Issue 20's targets.
MAX_PLAN_OVER_FLOOR = {1: 2.0, 8: 1.3, 64: 1.1, 128: 1.1, 256: 1.1}
CPU_SIZES = (64, 128)
MAX_CPU_PER_HOST_S = 0.010
MEMORY_SIZE = 256
MAX_PEAK_MIB = 100.0
MAX_VALIDATE_S = 0.15
MAX_IMPORT_MS = 150.0
MAX_AGENT_CPU_S = 0.050
FLOORED = ("apply", "smoke")  # measured against a named floor, with no figure to reach
# Issue 32's targets.
FABRIC = "fabric"  # plain Fabric: the floor of a tool built on the library plan uses
MAX_CPU_OVER_FABRIC = 2.0
PEERS = ("fabric", "pyinfra", "ansible")  # measured beside the floor and the tool at every size
# startup.py's figures that must halve against the baseline, judged on the best run of each copy.
HALVED = {
    "import_commands_plan_ms": ("importing what `plan` needs (`import mgpu_provision.commands.plan`)", "ms"),
    "plan_local_cpu_s": ("a local `plan --json`'s CPU", "s"),
    "validate_wall_s": ("`validate`'s wall time (an unchanged rig file)", "s"),
}


@dataclass(frozen=True)
class Sample:
    """One timed run of one contender on one fleet size."""

    contender: str
    hosts: int
    wall_s: float
    cpu_s: float
    peak_rss_kib: int
    logins_per_host: float
    commands_per_host: float
    startup_s: float | None = None  # smoke: command start -> all ranks started, less torch's import
    torch_s: float | None = None  # smoke: the torch import time taken out of startup_s
    # smoke: the clock's events, seconds after the command's start: (kind, pid, rank, begin, end)
    timeline: tuple[tuple[str, int, int | None, float, float], ...] = ()


@dataclass(frozen=True)
class Row:
    """All runs of one contender on one fleet size."""

    contender: str
    hosts: int
    runs: int
    median_s: float
    min_s: float
    max_s: float
    cpu_s_per_host: float
    peak_rss_mib: float
    logins_per_host: float
    commands_per_host: float
    startup_s: float | None = None
    torch_s: float | None = None
    startup_best_s: float | None = None  # the least disturbed run's start-up
    to_ranks_s: float | None = None  # median of start-up plus torch: command start -> all ranks started


def _median_of(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(samples: Iterable[Sample]) -> list[Row]:
    """One row per (hosts, contender), in order of fleet size, then of first appearance."""
    groups: dict[tuple[int, str], list[Sample]] = {}
    for sample in samples:
        groups.setdefault((sample.hosts, sample.contender), []).append(sample)
    rows = []
    for (hosts, contender), group in sorted(groups.items(), key=lambda item: item[0][0]):
        walls = [s.wall_s for s in group]
        rows.append(
            Row(
                contender=contender,
                hosts=hosts,
                runs=len(group),
                median_s=statistics.median(walls),
                min_s=min(walls),
                max_s=max(walls),
                cpu_s_per_host=statistics.median(s.cpu_s for s in group) / hosts,
                peak_rss_mib=max(s.peak_rss_kib for s in group) / 1024,
                logins_per_host=max(s.logins_per_host for s in group),
                commands_per_host=max(s.commands_per_host for s in group),
                startup_s=_median_of(s.startup_s for s in group),
                torch_s=_median_of(s.torch_s for s in group),
                startup_best_s=min((s.startup_s for s in group if s.startup_s is not None), default=None),
                to_ranks_s=_median_of(
                    s.startup_s + s.torch_s
                    for s in group
                    if s.startup_s is not None and s.torch_s is not None
                ),
            )
        )
    return rows


def _median(rows: Sequence[Row], hosts: int, contender: str) -> float | None:
    for row in rows:
        if row.hosts == hosts and row.contender == contender:
            return row.median_s
    return None


def floor_of(contender: str) -> str:
    return SMOKE_FLOOR if contender in ("smoke", SMOKE_FLOOR) else FLOOR


def floor_median(rows: Sequence[Row], hosts: int, contender: str) -> float | None:
    """The floor's median at this size: the faster plain-SSH mode measured (smoke: its own floor)."""
    if floor_of(contender) == SMOKE_FLOOR:
        return _median(rows, hosts, SMOKE_FLOOR)
    found = [m for m in (_median(rows, hosts, name) for name in FLOORS) if m is not None]
    return min(found) if found else None


def vs_floor(rows: Sequence[Row], row: Row) -> float | None:
    """How many times its floor's median this row's median is (1.0 = as fast as the floor); for smoke,
    its start-up (less torch's import) over the smoke floor's whole run."""
    floor = floor_median(rows, row.hosts, row.contender)
    mine = row.startup_s if row.contender == "smoke" else row.median_s
    return mine / floor if floor and mine is not None else None


def peer_over(rows: Sequence[Row], row: Row, peer: str = PEER) -> float | None:
    """How many times faster than Ansible this row is (Ansible's median over this row's)."""
    theirs = _median(rows, row.hosts, peer)
    return theirs / row.median_s if theirs and row.median_s else None


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str
    met: bool | None  # None: not measured in this run


@dataclass(frozen=True)
class Singles:
    """The one-process figures (single.py); None where not measured."""

    agent_facts_cpu_s: float | None = None  # median; CPU is what load does not inflate
    agent_facts_wall_s: float | None = None
    python_start_cpu_s: float | None = None  # the node's `python3 -S -I -c pass`: the agent's start-up share
    import_ms: float | None = None  # -X importtime, cumulative of `mgpu_provision.commands.plan` (median)
    import_best_ms: float | None = None  # the best run's (judged: load only ever adds)
    plan_run_imports_ms: float | None = None  # every top-level import of a local `plan --json` run (median)
    plan_run_imports_best_ms: float | None = None
    plan_loads: tuple[str, ...] = ()  # which heavy packages that run loaded
    validate_wall_s: float | None = None
    validate_best_wall_s: float | None = None  # judged, as for the imports
    validate_cpu_s: float | None = None
    plan_local_wall_s: float | None = None  # `plan --json` on the demo's local simulated box
    plan_local_best_wall_s: float | None = None
    plan_local_cpu_s: float | None = None
    # startup.py run in this run on the baseline and on the frozen package, alternating: figure -> (baseline
    # best, this best); and the baseline's name
    startup_pairs: tuple[tuple[str, float, float], ...] = ()
    baseline: str | None = None


def _judged(target: str, value: float | None, limit: float, shown: str) -> Verdict:
    if value is None:
        return Verdict(target, "not measured", None)
    return Verdict(target, shown, value <= limit)


def verdicts(rows: Sequence[Row], singles: Singles | None = None) -> list[Verdict]:
    """Issue 20's targets, judged on this run's rows and one-process figures."""
    one = singles or Singles()
    found: list[Verdict] = []
    plan_rows = {r.hosts: r for r in rows if r.contender == TOOL}
    for size, limit in MAX_PLAN_OVER_FLOOR.items():
        row = plan_rows.get(size)
        ratio = vs_floor(rows, row) if row else None
        shown = (
            f"{ratio:.2f}x ({row.median_s:.2f} s vs {row.median_s / ratio:.2f} s)" if row and ratio else ""
        )
        found.append(
            _judged(f"plan at {size} host(s) <= {limit:g}x the plain-SSH floor", ratio, limit, shown)
        )
    found.append(
        _judged(
            f"validate of an example <= {MAX_VALIDATE_S:g} s wall (best run)",
            one.validate_best_wall_s,
            MAX_VALIDATE_S,
            f"{one.validate_best_wall_s or 0:.3f} s (median {one.validate_wall_s or 0:.3f} s, CPU "
            f"{one.validate_cpu_s or 0:.3f} s)",
        )
    )
    found.append(
        _judged(
            f"importing what plan needs <= {MAX_IMPORT_MS:g} ms (-X importtime, best run)",
            one.import_best_ms,
            MAX_IMPORT_MS,
            f"{one.import_best_ms or 0:.0f} ms `import mgpu_provision.commands.plan` (median "
            f"{one.import_ms or 0:.0f} ms); a whole local `plan --json` run imports "
            f"{one.plan_run_imports_best_ms or 0:.0f} ms",
        )
    )
    for size in CPU_SIZES:
        row = plan_rows.get(size)
        cpu = row.cpu_s_per_host if row else None
        found.append(
            _judged(
                f"plan client CPU <= {MAX_CPU_PER_HOST_S * 1000:g} ms per host at {size} hosts",
                cpu,
                MAX_CPU_PER_HOST_S,
                f"{(cpu or 0) * 1000:.1f} ms",
            )
        )
    python_share = (
        f", of which a bare `python3 -S -I -c pass` is {one.python_start_cpu_s * 1000:.0f} ms"
        if one.python_start_cpu_s is not None
        else ""
    )
    found.append(
        _judged(
            f"agent facts <= {MAX_AGENT_CPU_S * 1000:g} ms CPU per call on a simulated node",
            one.agent_facts_cpu_s,
            MAX_AGENT_CPU_S,
            f"{(one.agent_facts_cpu_s or 0) * 1000:.0f} ms{python_share}",
        )
    )
    largest = plan_rows.get(MEMORY_SIZE)
    found.append(
        Verdict(
            f"{MEMORY_SIZE} hosts in the benchmark",
            f"{MEMORY_SIZE} hosts measured" if largest else "not measured",
            None if largest is None else True,
        )
    )
    found.append(
        _judged(
            f"plan peak RSS <= {MAX_PEAK_MIB:g} MiB at {MEMORY_SIZE} hosts",
            largest.peak_rss_mib if largest else None,
            MAX_PEAK_MIB,
            f"{largest.peak_rss_mib:.0f} MiB" if largest else "",
        )
    )
    found.append(_memory_growth(list(plan_rows.values())))
    for contender in FLOORED:
        found.append(_floored(rows, contender))
    return found + _issue32(rows, one)


def _issue32(rows: Sequence[Row], one: Singles) -> list[Verdict]:
    """Issue 32's targets: start-up halved against the baseline, CPU per host against plain Fabric's, every
    peer measured at every size."""
    found: list[Verdict] = []
    pairs = {name: (old, new) for name, old, new in one.startup_pairs}
    for name, (label, unit) in HALVED.items():
        target = f"{label} <= half of {one.baseline or 'the baseline'}'s (startup.py, same run, best of each)"
        if name not in pairs:
            found.append(Verdict(target, "not measured", None))
            continue
        old, new = pairs[name]
        shown = f"{new:.3g} {unit} against {old:.3g} {unit} ({new / old:.2f}x)"
        found.append(Verdict(target, shown, new <= old / 2))
    by = {(r.contender, r.hosts): r for r in rows}
    for size in CPU_SIZES:
        plan, fabric = by.get((TOOL, size)), by.get((FABRIC, size))
        target = f"plan client CPU per host <= {MAX_CPU_OVER_FABRIC:g}x plain Fabric's at {size} hosts"
        if plan is None or fabric is None:
            found.append(Verdict(target, "not measured", None))
            continue
        ratio = plan.cpu_s_per_host / fabric.cpu_s_per_host
        mine, theirs = plan.cpu_s_per_host * 1000, fabric.cpu_s_per_host * 1000
        shown = f"{mine:.1f} ms against {theirs:.1f} ms ({ratio:.2f}x)"
        found.append(Verdict(target, shown, ratio <= MAX_CPU_OVER_FABRIC))
    sizes = sorted({r.hosts for r in rows if r.contender == TOOL})
    target = f"{', '.join(PEERS)} measured beside the floor and plan at every size"
    if not sizes:
        return [*found, Verdict(target, "not measured", None)]
    missing = [f"{peer} at {size}" for peer in PEERS for size in sizes if (peer, size) not in by]
    shown = "missing: " + ", ".join(missing) if missing else f"all at {', '.join(map(str, sizes))} hosts"
    return [*found, Verdict(target, shown, not missing)]


def _floored(rows: Sequence[Row], contender: str) -> Verdict:
    """apply and smoke have no figure to reach: the target is to measure them beside a named floor."""
    target = {
        "apply": "apply on a converged fleet measured, floor named (the ssh floor: one facts call per host)",
        "smoke": "smoke start-up overhead measured, floor named (ssh floor + two bare python starts)",
    }[contender]
    measured = [
        f"{r.hosts}: {vs_floor(rows, r):.2f}x" for r in rows if r.contender == contender and vs_floor(rows, r)
    ]
    return Verdict(
        target,
        "; ".join(measured) + " of the floor" if measured else "not measured",
        True if measured else None,
    )


def _memory_growth(plan_rows: list[Row]) -> Verdict:
    """Sub-linear: the peak per host falls from the smallest to the largest fleet (peak grows less than the
    fleet); the MiB each host adds between the two largest fleets is shown beside it."""
    target = "plan peak RSS grows sub-linearly with the fleet"
    if len(plan_rows) < 2:
        return Verdict(target, "needs two fleet sizes", None)
    ordered = sorted(plan_rows, key=lambda r: r.hosts)
    small, large = ordered[0], ordered[-1]
    growth = large.peak_rss_mib / small.peak_rss_mib
    scale = large.hosts / small.hosts
    before = ordered[-2]
    marginal = (large.peak_rss_mib - before.peak_rss_mib) / (large.hosts - before.hosts)
    return Verdict(
        target,
        f"{small.peak_rss_mib:.0f} -> {large.peak_rss_mib:.0f} MiB ({growth:.2f}x) for {scale:g}x hosts; "
        f"{marginal * 1024:.0f} KiB per host from {before.hosts} to {large.hosts}",
        growth < scale,
    )


def _ratio(value: float | None, suffix: str = "x") -> str:
    return f"{value:.2f}{suffix}" if value is not None else "–"


def _smoke_lines(rows: Sequence[Row]) -> list[str]:
    smoke = [r for r in rows if r.contender == "smoke"]
    if not smoke:
        return []
    lines = [
        "",
        "`smoke` start-up: from the command's start until the last rank's process started, less the time in "
        "which some torch import (probe, torchrun, ranks) was in progress; its floor is one cold `ssh` per "
        "host running the agent's facts and then two bare `python3 -c pass` (a launcher and a rank).",
        "",
        "| hosts | floor s | smoke run s | to all ranks s | torch import s | start-up overhead s "
        "| best start-up s | overhead ÷ floor |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in smoke:
        floor = floor_median(rows, row.hosts, row.contender)
        lines.append(
            f"| {row.hosts} | {floor if floor is not None else float('nan'):.2f} | {row.median_s:.2f} "
            f"| {row.to_ranks_s or 0:.2f} | {row.torch_s or 0:.2f} | {row.startup_s or 0:.2f} "
            f"| {row.startup_best_s or 0:.2f} | {_ratio(vs_floor(rows, row))} |"
        )
    return lines


def _singles_lines(one: Singles) -> list[str]:
    def ms(value: float | None) -> str:
        return f"{value * 1000:.0f} ms" if value is not None else "not measured"

    agent = (
        "agent `facts` on a simulated test host (inside its namespaces, the fleet's request, "
        "`python3 -S -I` on the cached agent folder, as the tool runs it): "
        f"{ms(one.agent_facts_cpu_s)} CPU, {ms(one.agent_facts_wall_s)} wall; "
        f"a bare `python3 -S -I -c pass` there: {ms(one.python_start_cpu_s)} CPU"
    )
    loads = ", ".join(one.plan_loads) or "none"
    imports = (
        "`import mgpu_provision.commands.plan` (`-X importtime`, cumulative): "
        f"{one.import_ms or 0:.0f} ms median, {one.import_best_ms or 0:.0f} ms best; every top-level import "
        f"of a local `plan --json` run: {one.plan_run_imports_ms or 0:.0f} ms median, "
        f"{one.plan_run_imports_best_ms or 0:.0f} ms best; that run loads {loads} "
        "(of rich, fabric, paramiko, jinja2, pydantic, yaml)"
    )
    validate = (
        "`mgpu-provision validate examples/rtx3090-workstation.yaml`: "
        f"{ms(one.validate_wall_s)} wall median, {ms(one.validate_best_wall_s)} best, "
        f"{ms(one.validate_cpu_s)} CPU"
    )
    local = (
        "`mgpu-provision plan --json` on the demo's local simulated box (no SSH): "
        f"{ms(one.plan_local_wall_s)} wall median, {ms(one.plan_local_best_wall_s)} best, "
        f"{ms(one.plan_local_cpu_s)} CPU"
    )
    return [
        "",
        "One process at a time (median and best of several runs; CPU = user + system with children, from "
        "the kernel). Wall figures are judged on the best run: other work on the machine only ever adds.",
        "",
        *[f"- {line}" for line in (agent, imports, validate, local)],
    ]


def markdown(rows: Sequence[Row], context: Sequence[str], singles: Singles | None = None) -> str:
    """The results page: context, the fleet table, smoke's start-up, one-process figures, the targets."""
    lines = [*context, ""]
    lines.append(
        "| hosts | contender | median s | min–max s | × floor | Ansible ÷ this "
        "| client CPU s/host | peak RSS MiB | logins/host | SSH commands/host |"
    )
    lines.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        if row.contender in ("smoke", SMOKE_FLOOR):
            continue
        lines.append(
            f"| {row.hosts} | {row.contender} | {row.median_s:.2f} | {row.min_s:.2f}–{row.max_s:.2f} "
            f"| {_ratio(vs_floor(rows, row))} | {_ratio(peer_over(rows, row))} | {row.cpu_s_per_host:.3f} "
            f"| {row.peak_rss_mib:.0f} | {row.logins_per_host:g} | {row.commands_per_host:g} |"
        )
    lines += _smoke_lines(rows)
    if singles is not None:
        lines += _singles_lines(singles)
    lines += ["", "| target (issues 20 and 32) | measured | met |", "|---|---|---|"]
    for verdict in verdicts(rows, singles):
        met = {True: "yes", False: "**no**", None: "–"}[verdict.met]
        lines.append(f"| {verdict.target} | {verdict.measured} | {met} |")
    return "\n".join(lines) + "\n"


def as_json(
    samples: Sequence[Sample], rows: Sequence[Row], context: dict[str, object], singles: Singles | None = None
) -> dict[str, object]:
    return {
        "context": context,
        "rows": [
            {**asdict(row), "vs_floor": vs_floor(rows, row), "ansible_over_this": peer_over(rows, row)}
            for row in rows
        ],
        "singles": asdict(singles) if singles is not None else None,
        "targets": [asdict(v) for v in verdicts(rows, singles)],
        "samples": [asdict(s) for s in samples],
    }
