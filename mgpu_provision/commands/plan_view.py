"""A plan for people (rich) and for programs (JSON, the stable schema in docs/plan-json.md).

`plan` and `apply` both show plans through this module, so they print the same plan the same way; the wording
a person reads is tested as text.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.text import Text

from ..plan.change import Change
from ..plan.fleet import FleetPlan, HostPlan, PlanTotals
from .output import plural

PLAN_JSON_VERSION = 1
SYMBOL = {"create": "+", "update": "~", "delete": "-", "verify-failed": "!", "manual": "?"}
ACTION_STYLE = {
    "create": "green",
    "update": "yellow",
    "delete": "red",
    "verify-failed": "red",
    "manual": "magenta",
}
DIFF_STYLE = {"+": "green", "-": "red", "@": "cyan"}


def totals_line(totals: PlanTotals) -> str:
    """`Plan: 3 to change, 1 check failed, 1 manual, on 2 of 8 hosts (1 unreachable)`."""
    parts = [f"{totals.to_change} to change"]
    if totals.checks_failed:
        parts.append(plural(totals.checks_failed, "check failed", "checks failed"))
    if totals.manual:
        parts.append(f"{totals.manual} manual")
    hosts = plural(totals.hosts, "host", "hosts")
    line = f"Plan: {', '.join(parts)}, on {totals.hosts_with_changes} of {hosts}"
    unread = ((totals.unreachable, "unreachable"), (totals.failed, "failed"))
    missing = [f"{n} {what}" for n, what in unread if n]
    return f"{line} ({', '.join(missing)})" if missing else line


def summary_line(plan: FleetPlan) -> str:
    if plan.converged:
        hosts = len(plan.hosts)
        return f"No changes. {plural(hosts, 'host matches', 'hosts match')} the rig file."
    return totals_line(plan.totals)


def add_diff_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--diff",
        action="store_true",
        help="show the content of new files too (changed files always show their diff)",
    )


def change_lines(change: Change, new_content: bool = False) -> list[Text]:
    """The Change's line and, for a changed file, its diff; a new file's whole content only on request
    (it is all `+` lines, and four of them would fill a screen)."""
    style = ACTION_STYLE[change.action]
    head = Text.assemble(
        ("  " + SYMBOL[change.action] + " ", style),
        (change.resource, "bold"),
        f": {change.summary}",
        (" (reboot)" if change.reboot and change.resource != "reboot" else "", "dim"),
    )
    lines = [head]
    diff = change.diff if change.action != "create" or new_content else None
    for line in (diff or "").splitlines():
        lines.append(Text("      " + line, style=DIFF_STYLE.get(line[:1], "")))
    return lines


def host_lines(host: HostPlan, new_content: bool = False) -> list[Text]:
    name = (host.host, "bold cyan")
    if host.status != "ok":
        return [Text.assemble(name, (f": {host.status}", "bold red"), f": {host.error or 'no reason given'}")]
    if not host.changes:
        return [Text.assemble(name, (": no changes", "dim"))]
    lines = [Text.assemble(name)]
    for change in host.changes:
        lines += change_lines(change, new_content)
    return lines


def render_plan(plan: FleetPlan, console: Console, new_content: bool = False) -> None:
    """Per host its Changes (`+` create, `~` update, `-` delete, `!` failed check, `?` manual), then the
    totals line."""
    for host in plan.hosts:
        for line in host_lines(host, new_content):
            console.print(line, soft_wrap=True)  # long paths and diff lines stay whole when piped
    style = "green" if plan.converged else "bold"
    console.print(Text(summary_line(plan), style=style), soft_wrap=True)


# The keys of a change in `plan --json`, in order (docs/plan-json.md); `tags`, `phase` and `applies` follow.
CHANGE_KEYS = ("resource", "action", "summary", "current", "desired", "reboot", "diff")


def change_json(change: Change) -> dict[str, Any]:
    document: dict[str, Any] = {key: getattr(change, key) for key in CHANGE_KEYS}
    document.update(tags=[change.phase], phase=change.phase, applies=change.agent_step is not None)
    return document


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
