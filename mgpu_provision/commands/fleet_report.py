"""The fleet at a glance: `plan --report FILE.html`, a heat map of checks x hosts and each odd box drawn.

One self-contained HTML file (inline SVG and CSS, no JavaScript, no fetches), so it can be mailed or
attached to a ticket. Hosts are folded the way admins think of them: per rig group, hosts whose every check
reads the same are one row named as a node set (`gpu-[001-640]`, rig/nodesets.py's `fold`), so 2,000
healthy hosts are one row and only the odd ones get rows of their own. Each cell links to the section of
its row: the hosts, one box picture (`box_picture`) and the findings. A cell's state is the worst of its
changes: a failed check fails it, a warning (a judge finding of severity warn) or a manual step warns, an
apply change is drift; checks the rig skips are skipped, an unread host is unreachable, and a
simulated host's passing checks read `simulated` (ok on a twin says nothing of the hardware). With
`--smoke FILE` (a `smoke --json` report) each row shows its DDP groups' best all_reduce bus bandwidth.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from ..errors import ProvisionError
from ..jobs.plan import FleetPlan, HostPlan
from ..plan.change import Change
from ..plan.host import FILES
from ..rig.nodesets import fold as node_set
from ..rig.rig import LoadedRig
from .box_picture import Finding, box_svg, wanted_of, write_pictures
from .output import plural
from .svg import STATES, Svg, legend, text_width, write_atomic

# The heat map's columns and the plan resources (judge checks) each gathers; `other` takes the rest.
CHECKS: dict[str, tuple[str, ...]] = {
    "driver": ("driver", "mirror", "kernel", "torch"),
    "gpus": ("gpus", "pcie"),
    "topology": ("topology",),
    "xid": ("xid", "sxid"),
    "memory": ("ecc", "memory-repair"),
    "fabric": ("fabric", "fabricmanager", "imex", "nvlink-errors"),
    "health": ("throttle", "recovery-action"),
    "settings": ("persistence", "power", "compute-mode", "mig", "sli"),
    "env files": (),
    "slurm": ("slurmd",),
    "node check": (),
    "other": (),
}
# The managed-file resources (plan/host.FILES) by the column their files and units count in.
FILE_COLUMN = {"envfiles": "env files", "sli": "settings", "boot_unit": "settings", "slurm": "slurm",
               "node_check": "node check"}
COLUMN_OF = {resource: column for column, resources in CHECKS.items() for resource in resources}
RANK = {"ok": 0, "simulated": 0, "skipped": 0, "drift": 1, "warn": 2, "fail": 3, "unreachable": 4}
SMOKE_FORMAT = 1  # the `smoke --json` envelope's format_version this reads

CELL, ROW_H, NAME_W = 58, 26, 360


def change_state(change: Change) -> str:
    """A failed check fails; a warning (a finding of severity warn) or a manual step warns; the rest is
    what apply would change: drift."""
    if change.action == "verify-failed":
        return "fail"
    return "warn" if change.action in ("warn", "manual") else "drift"


def findings_of(host: HostPlan) -> list[Finding]:
    return [Finding(change_state(c), f"{c.resource}: {c.summary}", c.resource) for c in host.changes]


def _file_columns(loaded: LoadedRig, plan: HostPlan) -> dict[str, str]:
    """Each managed path and unit of the host, by the column it counts in (asked only of drifting hosts)."""
    host = loaded.host(plan.host)
    found: dict[str, str] = {}
    for files in FILES:
        column = FILE_COLUMN.get(files.paths.__module__.rsplit(".", 1)[-1], "other")
        found.update({f"file:{path}": column for path in files.paths(loaded, host)})
    return found


def column_of(change: Change, files: Mapping[str, str]) -> str:
    if change.resource in COLUMN_OF:
        return COLUMN_OF[change.resource]
    if change.resource in files:
        return files[change.resource]
    if change.resource.startswith("service:"):
        return "node check" if "check" in change.resource else "settings"
    return "other"


def host_cells(loaded: LoadedRig, plan: HostPlan) -> tuple[str, ...]:
    """The host's state in every column, in CHECKS order."""
    if plan.status != "ok":
        return ("unreachable" if plan.status == "unreachable" else "fail",) * len(CHECKS)
    rig = loaded.rig_of(loaded.host(plan.host))
    states = dict.fromkeys(CHECKS, "simulated" if plan.simulated else "ok")
    for column, resources in CHECKS.items():
        if resources and all(r in rig.health.skip for r in resources):
            states[column] = "skipped"
    if rig.slurm is None:
        states["slurm"] = "skipped"
    files = _file_columns(loaded, plan) if plan.changes else {}
    for change in plan.changes:
        column, state = column_of(change, files), change_state(change)
        if RANK[state] > RANK[states[column]]:
            states[column] = state
    return tuple(states.values())


@dataclass(frozen=True)
class Row:
    group: str
    cells: tuple[str, ...]
    hosts: tuple[HostPlan, ...]

    @property
    def anchor(self) -> str:
        return "host-" + self.hosts[0].host

    @property
    def label(self) -> str:
        names = node_set([h.host for h in self.hosts])
        if all(RANK[c] == 0 for c in self.cells):
            kind = "simulated" if "simulated" in self.cells else "ok"
            return f"{names} all {kind}"
        return names


def fold(loaded: LoadedRig, plan: FleetPlan) -> list[Row]:
    """Rows per rig group (in file order), hosts with the same cells in one row, unread hosts alone (their
    reasons differ)."""
    rows: dict[tuple[str, tuple[str, ...], str], list[HostPlan]] = {}
    for host in plan.hosts:
        group = loaded.host(host.host).rig
        cells = host_cells(loaded, host)
        alone = host.host if host.status != "ok" else ""
        rows.setdefault((group, cells, alone), []).append(host)
    order = {name: k for k, name in enumerate(loaded.spec.rigs)}
    folded = [Row(group, cells, tuple(hosts)) for (group, cells, _), hosts in rows.items()]

    def place(row: Row) -> tuple[int, bool, str]:  # a group's folded healthy row first, then the odd ones
        return order.get(row.group, len(order)), any(RANK[c] for c in row.cells), row.hosts[0].host

    return sorted(folded, key=place)


Bandwidth = dict[str, tuple[float | None, bool]]


def read_smoke(path: Path, report: Path | None) -> Bandwidth:
    """A `smoke --json` report as host -> (its DDP group's best busbw in GB/s, the group passed); read
    before the plan is made, so that a wrong file costs no fleet run."""
    if report is None:
        raise ProvisionError("--smoke FILE puts bandwidth into the report: give --report FILE.html too")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProvisionError(f"{path}: not a smoke --json report ({exc})") from exc
    if not isinstance(document, dict) or document.get("format_version") != SMOKE_FORMAT:
        got = document.get("format_version") if isinstance(document, dict) else None
        raise ProvisionError(
            f"{path}: smoke report of format {got!r}; this mgpu-provision reads format {SMOKE_FORMAT}: "
            "write it again with `mgpu-provision smoke RIG --json`"
        )
    found: Bandwidth = {}
    for group in document.get("groups") or []:
        best = max((float(b["busbw_gbps"]) for b in group.get("bandwidth") or []), default=None)
        for node in group.get("nodes") or []:
            found[node["host"]] = (best, bool(group.get("ok")))
    return found


def _smoke_text(row: Row, smoke: Bandwidth) -> tuple[str, str] | None:
    seen = [smoke[h.host] for h in row.hosts if h.host in smoke]
    if not seen:
        return None
    values = [v for v, _ in seen if v is not None]
    ok = all(passed for _, passed in seen)
    text = f"{min(values):g} GB/s" if values else "no busbw"
    if values and max(values) != min(values):
        text = f"{min(values):g}-{max(values):g} GB/s"
    return text, "ok" if ok else "fail"


def heat_map(rows: Sequence[Row], smoke: Bandwidth | None) -> Svg:
    columns = list(CHECKS)
    smoke_w = 130 if smoke else 0
    width = NAME_W + CELL * len(columns) + smoke_w + 20
    groups = sorted({r.group for r in rows}, key=[r.group for r in rows].index)
    height = 70 + ROW_H * len(rows) + 24 * len(groups) + 8
    svg = Svg(width, height, f"fleet: {sum(len(r.hosts) for r in rows)} hosts")
    svg.rect(0, 0, width, height, "#ffffff", "#ffffff", rx=0)
    legend(svg, 12, 16, tuple(STATES))
    for k, column in enumerate(columns):
        x = NAME_W + CELL * k + CELL / 2
        svg.text(x, 52, column, 11, bold=True, title=f"{column}: {', '.join(CHECKS[column]) or column}")
    if smoke:
        svg.text(NAME_W + CELL * len(columns) + smoke_w / 2, 52, "smoke busbw", 11, bold=True,
                 title="the DDP group's best all_reduce bus bandwidth (smoke --json)")
    y, group = 70.0, None
    for row in rows:
        if row.group != group:
            group = row.group
            svg.text(12, y + 10, f"rig {group}", 12, anchor="start", bold=True, fill="#37474f")
            y += 24
        label = row.label
        cut = int((NAME_W - 24) / text_width("x", 11))
        shown = label if len(label) <= cut else label[: cut - 1] + "\u2026"
        svg.open_link("#" + row.anchor)
        svg.text(20, y + ROW_H / 2, shown, 11, anchor="start", title=f"{len(row.hosts)} hosts: {label}")
        for k, state in enumerate(row.cells):
            look = STATES[state]
            x = NAME_W + CELL * k
            title = f"{label} \u00b7 {columns[k]}: {state}"
            svg.rect(x + 1, y + 1, CELL - 2, ROW_H - 2, look.fill, look.ink, title, rx=2, stroke_width=1)
            svg.text(x + CELL / 2, y + ROW_H / 2, look.letter, 12, fill=look.ink, bold=True, title=title)
        svg.close_link()
        if smoke:
            shown_smoke = _smoke_text(row, smoke)
            if shown_smoke is not None:
                text, state = shown_smoke
                svg.text(NAME_W + CELL * len(columns) + 10, y + ROW_H / 2, f"{STATES[state].letter} {text}",
                         11, anchor="start", fill=STATES[state].ink, title=f"smoke: {text}, {state}")
        y += ROW_H
    return svg


CSS = """
body { font-family: "DejaVu Sans", Verdana, sans-serif; margin: 16px; color: #212121; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 4px; }
p.summary { margin: 0 0 12px; color: #455a64; } section { border-top: 1px solid #cfd8dc; padding-top: 4px; }
ul.findings { font-size: 13px; } li.fail { color: #d32f2f; }
.hosts { font-family: monospace; font-size: 12px; }
svg a:hover rect { stroke-width: 3; }
"""


def _section(loaded: LoadedRig, row: Row) -> str:
    first = row.hosts[0]
    findings = findings_of(first)
    wanted = wanted_of(loaded, loaded.host(first.host))
    picture = box_svg(first.host, first.facts, wanted, findings, first.error, listed=False)
    names = node_set([h.host for h in row.hosts])
    also = f" (drawn: {escape(first.host)}, the others read the same)" if len(row.hosts) > 1 else ""
    items = "".join(f'<li class="{escape(f.state)}">{escape(STATES[f.state].letter)} {escape(f.text)}</li>'
                    for f in findings) or "<li>no changes</li>"
    if first.status != "ok":
        items = f'<li class="fail">{escape(first.status)}: {escape(first.error or "no reason given")}</li>'
    return (f'<section id="{escape(row.anchor)}"><h2>{escape(row.label)}</h2>'
            f'<p class="hosts">{plural(len(row.hosts), "host", "hosts")}: {escape(names)}{also}</p>'
            f'{picture.render(standalone=False)}<ul class="findings">{items}</ul></section>')


def report_html(loaded: LoadedRig, plan: FleetPlan,
                smoke: Bandwidth | None = None) -> str:
    rows = fold(loaded, plan)
    totals = plan.totals
    summary = (f"{plural(totals.hosts, 'host')} in {plural(len(rows), 'row')}; "
               f"{plural(totals.to_change, 'change')}, {plural(totals.checks_failed, 'failed check')}, "
               f"{totals.unreachable} unreachable")
    sections = "\n".join(_section(loaded, row) for row in rows)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>mgpu-provision plan: {escape(str(loaded.path.name))}</title><style>{CSS}</style></head>\n"
        f"<body><h1>Plan of {escape(str(loaded.path.name))}</h1><p class=\"summary\">{escape(summary)}</p>\n"
        f"{heat_map(rows, smoke).render(standalone=False)}\n{sections}\n</body></html>\n"
    )


def write_plan_pictures(loaded: LoadedRig, plan: FleetPlan, svg: Path | None = None,
                        report: Path | None = None, bandwidth: Bandwidth | None = None) -> None:
    """`plan --svg` and `plan --report`: each file written whole, before the plan is shown."""
    if svg is not None:
        pictures = {}
        for host in plan.hosts:
            findings = findings_of(host)
            wanted = wanted_of(loaded, loaded.host(host.host))
            pictures[host.host] = box_svg(host.host, host.facts, wanted, findings, host.error)
        write_pictures(svg, pictures)
    if report is not None:
        write_atomic(report, report_html(loaded, plan, bandwidth))
