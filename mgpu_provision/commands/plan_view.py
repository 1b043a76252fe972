"""Output of plans for people (rich) and for programs (JSON, the stable schema in docs/plan-json.md).

Kept apart from the plan logic so that `plan` and `apply` print the same plan the same way, and so that the
wording a person reads can be tested as text. `host_table` and `make_console` are general helpers for the
per-host recaps other commands print.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..plan.host import Change, FleetPlan, HostPlan, PlanTotals

PLAN_JSON_VERSION = 1
SYMBOL = {"create": "+", "update": "~", "verify-failed": "!", "manual": "?"}
ACTION_STYLE = {"create": "green", "update": "yellow", "verify-failed": "red", "manual": "magenta"}
STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "red", "skipped": "dim"}
DIFF_STYLE = {"+": "green", "-": "red", "@": "cyan"}


def make_console(file: TextIO | None = None, width: int | None = None) -> Console:
    """A console for command output: no guessing of highlights in host names or versions."""
    return Console(file=file or sys.stdout, highlight=False, width=width)


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def totals_line(totals: PlanTotals) -> str:
    """`Plan: 3 to change, 1 check failed, 1 manual, on 2 of 8 hosts (1 unreachable)`."""
    parts = [f"{totals.to_change} to change"]
    if totals.checks_failed:
        parts.append(_plural(totals.checks_failed, "check failed", "checks failed"))
    if totals.manual:
        parts.append(f"{totals.manual} manual")
    hosts = _plural(totals.hosts, "host", "hosts")
    line = f"Plan: {', '.join(parts)}, on {totals.hosts_with_changes} of {hosts}"
    unread = ((totals.unreachable, "unreachable"), (totals.failed, "failed"))
    missing = [f"{n} {what}" for n, what in unread if n]
    return f"{line} ({', '.join(missing)})" if missing else line


def summary_line(plan: FleetPlan) -> str:
    if plan.converged:
        hosts = len(plan.hosts)
        return f"No changes. {_plural(hosts, 'host matches', 'hosts match')} the rig file."
    return totals_line(plan.totals)


def change_lines(change: Change) -> list[Text]:
    style = ACTION_STYLE[change.action]
    head = Text.assemble(
        ("  " + SYMBOL[change.action] + " ", style),
        (change.resource, "bold"),
        f": {change.summary}",
        (" (reboot)" if change.reboot and change.resource != "reboot" else "", "dim"),
    )
    lines = [head]
    for line in (change.diff or "").splitlines():
        lines.append(Text("      " + line, style=DIFF_STYLE.get(line[:1], "")))
    return lines


def host_lines(host: HostPlan) -> list[Text]:
    name = (host.host, "bold cyan")
    if host.status != "ok":
        return [Text.assemble(name, (f": {host.status}", "bold red"), f": {host.error or 'no reason given'}")]
    if not host.changes:
        return [Text.assemble(name, (": no changes", "dim"))]
    lines = [Text.assemble(name)]
    for change in host.changes:
        lines += change_lines(change)
    return lines


def render_plan(plan: FleetPlan, console: Console) -> None:
    """Per host its Changes (`+` create, `~` update, `!` failed check, `?` manual), then the totals line."""
    for host in plan.hosts:
        for line in host_lines(host):
            console.print(line, soft_wrap=True)  # long paths and diff lines stay whole when piped
    style = "green" if plan.converged else "bold"
    console.print(Text(summary_line(plan), style=style), soft_wrap=True)


def change_json(change: Change) -> dict[str, Any]:
    return {
        "resource": change.resource,
        "action": change.action,
        "summary": change.summary,
        "current": change.current,
        "desired": change.desired,
        "reboot": change.reboot,
        "diff": change.diff,
        "tags": [change.phase],
        "phase": change.phase,
        "applies": change.agent_step is not None,
    }


def plan_json(plan: FleetPlan) -> dict[str, Any]:
    """The `plan --json` document; its keys are a public contract (docs/plan-json.md)."""
    totals = plan.totals
    return {
        "format_version": PLAN_JSON_VERSION,
        "hosts": {
            h.host: {"status": h.status, "error": h.error, "changes": [change_json(c) for c in h.changes]}
            for h in plan.hosts
        },
        "totals": {
            "to_change": totals.to_change,
            "checks_failed": totals.checks_failed,
            "manual": totals.manual,
            "hosts_with_changes": totals.hosts_with_changes,
            "hosts": totals.hosts,
            "unreachable": totals.unreachable,
            "failed": totals.failed,
        },
        "converged": plan.converged,
        "exit_code": plan.exit_code,
    }


def host_table(rows: Mapping[str, Mapping[str, object]], columns: Sequence[str]) -> Table:
    """A recap table, one row per host: `columns` read from each host's mapping ('' when absent); a column
    named `status` is coloured (ok green, changed yellow, failed/unreachable red, skipped dim)."""
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("host", style="cyan")
    for column in columns:
        table.add_column(column, justify="left" if column in ("status", "error") else "right")
    for name, row in rows.items():
        cells: list[Text] = []
        for column in columns:
            value = "" if row.get(column) is None else str(row.get(column))
            style = STATUS_STYLE.get(value, "") if column == "status" else ""
            cells.append(Text(value, style=style))
        table.add_row(name, *cells)
    return table
