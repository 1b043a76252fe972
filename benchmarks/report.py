"""Turn benchmark samples into the figures issue 9 asks for: medians, spread, ratios, and the targets.

Pure functions only, so the arithmetic and the table are tested without starting a single host.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

FLOOR = "ssh"
PEER = "ansible"  # the "Ansible ÷ this" column: Ansible as people run an ad-hoc command
PEERS = (PEER, "ansible-raw")  # the speed target is judged against each Ansible mode measured
TOOL = "plan"
# Issue 9's targets.
MAX_PLAN_OVER_FLOOR = 1.5
MIN_PEER_OVER_TOOL = 6.0
PEER_TARGET_SIZES = (32, 64)
MEMORY_SIZE = 64
MAX_PEAK_MIB = 150.0


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
            )
        )
    return rows


def _median(rows: Sequence[Row], hosts: int, contender: str) -> float | None:
    for row in rows:
        if row.hosts == hosts and row.contender == contender:
            return row.median_s
    return None


def vs_floor(rows: Sequence[Row], row: Row) -> float | None:
    """How many times the plain-SSH floor's median this row's median is (1.0 = as fast as the floor)."""
    floor = _median(rows, row.hosts, FLOOR)
    return row.median_s / floor if floor else None


def peer_over(rows: Sequence[Row], row: Row, peer: str = PEER) -> float | None:
    """How many times faster than Ansible this row is (Ansible's median over this row's)."""
    theirs = _median(rows, row.hosts, peer)
    return theirs / row.median_s if theirs and row.median_s else None


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str
    met: bool | None  # None: not measured in this run


def verdicts(rows: Sequence[Row]) -> list[Verdict]:
    """Issue 9's targets, judged on this run's rows."""
    found: list[Verdict] = []
    plan_rows = {r.hosts: r for r in rows if r.contender == TOOL}
    at64 = plan_rows.get(MEMORY_SIZE)
    ratio = vs_floor(rows, at64) if at64 else None
    found.append(
        Verdict(
            f"plan on {MEMORY_SIZE} hosts <= {MAX_PLAN_OVER_FLOOR}x the plain-SSH floor",
            f"{ratio:.2f}x" if ratio is not None else "not measured",
            None if ratio is None else ratio <= MAX_PLAN_OVER_FLOOR,
        )
    )
    for peer in PEERS:
        for size in PEER_TARGET_SIZES:
            row = plan_rows.get(size)
            speedup = peer_over(rows, row, peer) if row else None
            found.append(
                Verdict(
                    f"plan >= {MIN_PEER_OVER_TOOL:g}x faster than {peer} at {size} hosts",
                    f"{speedup:.1f}x" if speedup is not None else "not measured",
                    None if speedup is None else speedup >= MIN_PEER_OVER_TOOL,
                )
            )
    found.append(
        Verdict(
            f"plan peak memory < {MAX_PEAK_MIB:g} MiB at {MEMORY_SIZE} hosts",
            f"{at64.peak_rss_mib:.0f} MiB" if at64 else "not measured",
            None if at64 is None else at64.peak_rss_mib < MAX_PEAK_MIB,
        )
    )
    found.append(_memory_growth(list(plan_rows.values())))
    return found


def _memory_growth(plan_rows: list[Row]) -> Verdict:
    """Memory must grow less than linearly: from the smallest to the largest fleet, MiB per host falls."""
    target = "plan peak memory grows less than linearly with the fleet"
    if len(plan_rows) < 2:
        return Verdict(target, "needs two fleet sizes", None)
    small, large = min(plan_rows, key=lambda r: r.hosts), max(plan_rows, key=lambda r: r.hosts)
    growth = large.peak_rss_mib / small.peak_rss_mib
    scale = large.hosts / small.hosts
    return Verdict(
        target,
        f"{small.peak_rss_mib:.0f} -> {large.peak_rss_mib:.0f} MiB ({growth:.2f}x) for {scale:g}x hosts",
        growth < scale,
    )


def _ratio(value: float | None, suffix: str = "x") -> str:
    return f"{value:.2f}{suffix}" if value is not None else "–"


def markdown(rows: Sequence[Row], context: Sequence[str]) -> str:
    """The results page: context lines, the table, the targets."""
    lines = [*context, ""]
    lines.append(
        "| hosts | contender | median s | min–max s | × ssh floor | Ansible ÷ this "
        "| client CPU s/host | peak RSS MiB | logins/host | SSH commands/host |"
    )
    lines.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        lines.append(
            f"| {row.hosts} | {row.contender} | {row.median_s:.2f} | {row.min_s:.2f}–{row.max_s:.2f} "
            f"| {_ratio(vs_floor(rows, row))} | {_ratio(peer_over(rows, row))} | {row.cpu_s_per_host:.3f} "
            f"| {row.peak_rss_mib:.0f} | {row.logins_per_host:g} | {row.commands_per_host:g} |"
        )
    lines += ["", "| target (issue 9) | measured | met |", "|---|---|---|"]
    for verdict in verdicts(rows):
        met = {True: "yes", False: "**no**", None: "–"}[verdict.met]
        lines.append(f"| {verdict.target} | {verdict.measured} | {met} |")
    return "\n".join(lines) + "\n"


def as_json(samples: Sequence[Sample], rows: Sequence[Row], context: dict[str, object]) -> dict[str, object]:
    return {
        "context": context,
        "rows": [
            {**asdict(row), "vs_floor": vs_floor(rows, row), "ansible_over_this": peer_over(rows, row)}
            for row in rows
        ],
        "targets": [asdict(v) for v in verdicts(rows)],
        "samples": [asdict(s) for s in samples],
    }
