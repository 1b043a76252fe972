"""Turn benchmark samples into the figures issue 9 asks for: medians, spread, ratios, and the targets.

Pure functions only, so the arithmetic and the table are tested without starting a single host.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
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
# Issue 41's targets: plan over Fabric, over ClusterShell flat and through 2 gateways (the tree).
TREE = "clush-tree"
ISSUE41_TOOLS = {TOOL: "plan (Fabric path)", "clush": "plan --via clush", TREE: "through 2 gateways"}
ISSUE41_SIZES = (1, 8, 64, 256)
MAX_OVER_FABRIC = 1.2  # at one host, wall and CPU
FABRIC_SIZE = 1
MIN_OVER_PYINFRA = 1.3
PYINFRA_SIZES = (1, 8)
MIN_OVER_ANSIBLE = 3.0  # at every size
TREE_SIZE = 256
MAX_TREE_CPU_PER_HOST_S = 0.005
MAX_TREE_OVER_FLOOR = 1.1
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
    # the nodes' logins in this run by who made them ("client", "gateway", "head" or the address: sshd logs)
    node_logins_from: tuple[tuple[str, int], ...] = ()
    gateway_logins: int = 0  # logins at the gateways (the tree's head's)
    gateway_cpu_s: float | None = None  # the gateways' CPU (ClusterShell's gateway and its OpenSSH clients)


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
    node_logins_from: tuple[tuple[str, int], ...] = ()  # per source, the most of any run
    gateway_logins: int = 0  # the most of any run
    gateway_cpu_s_per_host: float | None = None


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
                node_logins_from=_most_by_source(group),
                gateway_logins=max(s.gateway_logins for s in group),
                gateway_cpu_s_per_host=_per_host(_median_of(s.gateway_cpu_s for s in group), hosts),
            )
        )
    return rows


def _most_by_source(group: Sequence[Sample]) -> tuple[tuple[str, int], ...]:
    most: dict[str, int] = {}
    for sample in group:
        for source, count in sample.node_logins_from:
            most[source] = max(most.get(source, 0), count)
    return tuple(sorted(most.items()))


def _per_host(value: float | None, hosts: int) -> float | None:
    return value / hosts if value is not None else None


def _pick(rows: Sequence[Row], contender: str, hosts: int) -> Row | None:
    return next((r for r in rows if r.contender == contender and r.hosts == hosts), None)


def _median(rows: Sequence[Row], hosts: int, contender: str) -> float | None:
    row = _pick(rows, contender, hosts)
    return row.median_s if row else None


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


@dataclass(frozen=True)
class TargetLine:
    """One of issue 41's targets, judged for each way of running plan it concerns (None: not for that one)."""

    target: str
    cells: dict[str, Verdict | None]


def _over_fabric(rows: Sequence[Row], tool: str) -> Verdict:
    target = f"{FABRIC_SIZE} host within {MAX_OVER_FABRIC:g}x plain Fabric's wall and CPU"
    mine, theirs = _pick(rows, tool, FABRIC_SIZE), _pick(rows, FABRIC, FABRIC_SIZE)
    if mine is None or theirs is None:
        return Verdict(target, "not measured", None)
    wall, cpu = mine.median_s / theirs.median_s, mine.cpu_s_per_host / theirs.cpu_s_per_host
    shown = (
        f"{wall:.2f}x wall ({mine.median_s:.2f} / {theirs.median_s:.2f} s), {cpu:.2f}x CPU "
        f"({mine.cpu_s_per_host * FABRIC_SIZE:.2f} / {theirs.cpu_s_per_host * FABRIC_SIZE:.2f} s)"
    )
    return Verdict(target, shown, wall <= MAX_OVER_FABRIC and cpu <= MAX_OVER_FABRIC)


def _ahead_of(rows: Sequence[Row], tool: str, peer: str, sizes: Sequence[int], least: float) -> Verdict:
    """`tool` at least `least` times faster (wall) than `peer` at each size; unjudged if one is missing."""
    where = "every size" if not sizes else " and ".join(map(str, sizes)) + " hosts"
    target = f">= {least:g}x ahead of {peer} at {where}"
    sizes = sizes or sorted({r.hosts for r in rows if r.contender == tool})
    shown: list[str] = []
    judged: list[bool | None] = []
    for size in sizes:
        mine, theirs = _pick(rows, tool, size), _pick(rows, peer, size)
        if mine is None or theirs is None:
            shown.append(f"not measured at {size}")
            judged.append(None)
            continue
        ratio = theirs.median_s / mine.median_s
        shown.append(f"{ratio:.2f}x at {size}")
        judged.append(ratio >= least)
    met = False if False in judged else None if None in judged or not judged else True
    return Verdict(target, ", ".join(shown) or "not measured", met)


def _tree_cpu(rows: Sequence[Row]) -> Verdict:
    target = f"head CPU <= {MAX_TREE_CPU_PER_HOST_S * 1000:g} ms per host at {TREE_SIZE} hosts"
    row = _pick(rows, TREE, TREE_SIZE)
    if row is None:
        return Verdict(target, "not measured", None)
    shown = f"{row.cpu_s_per_host * 1000:.1f} ms ({row.cpu_s_per_host * row.hosts:.2f} s)"
    return Verdict(target, shown, row.cpu_s_per_host <= MAX_TREE_CPU_PER_HOST_S)


def _tree_wall(rows: Sequence[Row]) -> Verdict:
    target = f"wall within {MAX_TREE_OVER_FLOOR:g}x the flat floor at {TREE_SIZE} hosts"
    row = _pick(rows, TREE, TREE_SIZE)
    ratio = vs_floor(rows, row) if row else None
    if row is None or ratio is None:
        return Verdict(target, "not measured", None)
    shown = f"{ratio:.2f}x ({row.median_s:.2f} / {row.median_s / ratio:.2f} s)"
    return Verdict(target, shown, ratio <= MAX_TREE_OVER_FLOOR)


def _only_gateways(rows: Sequence[Row]) -> Verdict:
    """sshd's logs: every login at a node came from its gateway, none from the head or the flat client."""
    target = "the head logs in only at the gateways (sshd logs of every node and gateway)"
    tree = [r for r in rows if r.contender == TREE]
    if not tree:
        return Verdict(target, "not measured", None)
    others = sorted({s for r in tree for s, n in r.node_logins_from if s != "gateway" and n})
    head = sum(n for r in tree for s, n in r.node_logins_from if s == "head")
    most = max(r.gateway_logins for r in tree)
    where = "node logins also from " + ", ".join(others) if others else "every node login from its gateway"
    shown = f"head logins at the nodes: {head}; at the gateways: at most {most} a run; {where}"
    return Verdict(target, shown, not others and all(r.logins_per_host >= 1 for r in tree))


def _sizes_measured(rows: Sequence[Row], tool: str) -> Verdict:
    target = f"measured at {', '.join(map(str, ISSUE41_SIZES))} hosts beside {', '.join(PEERS)} and the floor"
    have = {(r.contender, r.hosts) for r in rows}
    gaps = []
    for size in ISSUE41_SIZES:
        missing = [name for name in (tool, *PEERS, FLOOR) if (name, size) not in have]
        if missing:
            gaps.append(f"{size}: {'not run' if tool in missing else ', '.join(missing) + ' missing'}")
    return Verdict(target, "; ".join(gaps) if gaps else "all", not gaps)


def issue41_targets(rows: Sequence[Row]) -> list[TargetLine]:
    """Issue 41's targets, each judged for the ways of running plan it is about."""
    flat = (TOOL, "clush")
    every = tuple(ISSUE41_TOOLS)

    def line(tools: Sequence[str], judge: Callable[[str], Verdict]) -> TargetLine:
        cells = {tool: judge(tool) if tool in tools else None for tool in every}
        return TargetLine(next(c.target for c in cells.values() if c is not None), cells)

    return [
        line((TREE,), lambda _: _tree_cpu(rows)),
        line((TREE,), lambda _: _tree_wall(rows)),
        line((TREE,), lambda _: _only_gateways(rows)),
        line(flat, lambda tool: _over_fabric(rows, tool)),
        line(flat, lambda tool: _ahead_of(rows, tool, "pyinfra", PYINFRA_SIZES, MIN_OVER_PYINFRA)),
        line(every, lambda tool: _ahead_of(rows, tool, PEER, (), MIN_OVER_ANSIBLE)),
        line(every, lambda tool: _sizes_measured(rows, tool)),
    ]


def _met(verdict: Verdict) -> str:
    return {True: "yes", False: "**no**", None: "–"}[verdict.met]


def _cell(verdict: Verdict | None) -> str:
    if verdict is None:
        return "–"
    return verdict.measured if verdict.met is None else f"{verdict.measured}: {_met(verdict)}"


def _issue41_lines(rows: Sequence[Row]) -> list[str]:
    lines = [
        "| issue 41's target | " + " | ".join(ISSUE41_TOOLS.values()) + " |",
        "|---|" + "---|" * len(ISSUE41_TOOLS),
    ]
    for found in issue41_targets(rows):
        cells = [_cell(c) for c in found.cells.values()]
        lines.append(f"| {found.target} | " + " | ".join(cells) + " |")
    return lines


def _tree_lines(rows: Sequence[Row]) -> list[str]:
    def cells(row: Row, floor: float | None) -> str:
        gateways = row.gateway_cpu_s_per_host
        sources = ", ".join(f"{source} {count}" for source, count in row.node_logins_from) or "none"
        return (
            f"| {row.hosts} | {row.median_s:.2f} | {f'{floor:.2f}' if floor else '–'} "
            f"| {_ratio(vs_floor(rows, row))} | {row.cpu_s_per_host * 1000:.1f} "
            f"| {f'{gateways * 1000:.1f}' if gateways is not None else '–'} | {row.peak_rss_mib:.0f} "
            f"| {sources} | {row.gateway_logins} |"
        )

    return _table_of(
        rows,
        TREE,
        f"`{TREE}`: plan from a head that reaches the racks only through their 2 gateways (ClusterShell's "
        "tree); head CPU is the tool and its OpenSSH clients to the gateways, the gateways' is their "
        "ClusterShell gateway and its OpenSSH clients to the nodes; logins are read in every sshd's log.",
        "| hosts | median s | flat floor s | × floor | head CPU ms/host | gateways' CPU ms/host "
        "| head peak RSS MiB | node logins by source (most in a run) | logins at the gateways (most a run) |"
        "\n|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        cells,
    )


def _table_of(
    rows: Sequence[Row], contender: str, intro: str, header: str, cells: Callable[[Row, float | None], str]
) -> list[str]:
    """A table of its own below the fleet's, for one contender's rows: what it shows, its header, a line
    per fleet size (`cells` of the row and its floor's median); nothing where it was not run."""
    mine = [r for r in rows if r.contender == contender]
    if not mine:
        return []
    return [
        "",
        intro,
        "",
        *header.split("\n"),
        *(cells(r, floor_median(rows, r.hosts, contender)) for r in mine),
    ]


def _ratio(value: float | None, suffix: str = "x") -> str:
    return f"{value:.2f}{suffix}" if value is not None else "–"


def _smoke_lines(rows: Sequence[Row]) -> list[str]:
    def cells(row: Row, floor: float | None) -> str:
        return (
            f"| {row.hosts} | {floor if floor is not None else float('nan'):.2f} | {row.median_s:.2f} "
            f"| {row.to_ranks_s or 0:.2f} | {row.torch_s or 0:.2f} | {row.startup_s or 0:.2f} "
            f"| {row.startup_best_s or 0:.2f} | {_ratio(vs_floor(rows, row))} |"
        )

    return _table_of(
        rows,
        "smoke",
        "`smoke` start-up: from the command's start until the last rank's process started, less the time in "
        "which some torch import (probe, torchrun, ranks) was in progress; its floor is one cold `ssh` per "
        "host running the agent's facts and then two bare `python3 -c pass` (a launcher and a rank).",
        "| hosts | floor s | smoke run s | to all ranks s | torch import s | start-up overhead s "
        "| best start-up s | overhead ÷ floor |\n|---:|---:|---:|---:|---:|---:|---:|---:|",
        cells,
    )


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


def markdown(
    rows: Sequence[Row], context: Sequence[str], singles: Singles | None = None, method: Sequence[str] = ()
) -> str:
    """The results page: context, issue 41's targets, the method, the fleet table, the tree's figures,
    smoke's start-up, one-process figures, issues 20's and 32's targets."""
    lines = [*context, "", *_issue41_lines(rows), ""]
    if method:
        lines += [*method, ""]
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
    lines += _tree_lines(rows)
    lines += _smoke_lines(rows)
    if singles is not None:
        lines += _singles_lines(singles)
    lines += ["", "| target (issues 20 and 32) | measured | met |", "|---|---|---|"]
    for verdict in verdicts(rows, singles):
        lines.append(f"| {verdict.target} | {verdict.measured} | {_met(verdict)} |")
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
        "issue41_targets": [
            {"target": t.target, **{tool: asdict(c) if c else None for tool, c in t.cells.items()}}
            for t in issue41_targets(rows)
        ],
        "samples": [asdict(s) for s in samples],
    }
