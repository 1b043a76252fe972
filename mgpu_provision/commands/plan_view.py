"""A plan for people (rich) and for programs (JSON, the stable schema in docs/plan-json.md).

`plan` and `apply` both show plans through this module, so they print the same plan the same way; the wording
a person reads is tested as text. One host shows its changes in full. A fleet shows each distinct change once
with the hosts it applies to (`on 62 hosts: gpu-[001-062]`), then per host only what no other host shares,
so that a hundred boxes with the same drift read like one; file diffs there only with `--diff`, each
distinct content once. `--json` keeps the per-host document.

Summaries, errors and diffs quote what a node holds: every line is built with `output.shown`, never as
markup. The text views import rich inside their functions, so that `--json` never loads it.
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from ..jobs.plan import FleetPlan, HostPlan, PlanTotals, held_names, held_on_control_machine
from ..plan.change import Change
from ..rig.nodesets import fold
from .output import plural, shown

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

PLAN_JSON_VERSION = 1
SYMBOL = {"create": "+", "update": "~", "delete": "-", "verify-failed": "!", "warn": "*", "manual": "?"}
ACTION_STYLE = {
    "create": "green",
    "update": "yellow",
    "delete": "red",
    "verify-failed": "red",
    "warn": "dark_orange",
    "manual": "magenta",
}
# Each change's severity in `plan --json` (judge.records.SEVERITIES for checks): a failed check fails the
# box, a warning (and a manual step, which DCGM warns for) does not, anything apply would change is drift.
SEVERITY = {"verify-failed": "fail", "warn": "warn", "manual": "warn"}
DIFF_STYLE = {"+": "green", "-": "red", "@": "cyan"}


def totals_line(totals: PlanTotals) -> str:
    """`Plan: 3 to change, 1 check failed, 1 manual, on 2 of 8 hosts (1 unreachable)`."""
    parts = [f"{totals.to_change} to change"]
    if totals.checks_failed:
        parts.append(plural(totals.checks_failed, "check failed", "checks failed"))
    if totals.warnings:
        parts.append(plural(totals.warnings, "warning", "warnings"))
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
        warned = plan.totals.warnings
        warnings = f" ({plural(warned, 'warning', 'warnings')})" if warned else ""
        return f"No changes. {plural(hosts, 'host matches', 'hosts match')} the rig file{warnings}."
    return totals_line(plan.totals)


def add_diff_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--diff",
        action="store_true",
        help="show file diffs: on one host, new files' content too (changed files always show their diff); "
        "on a fleet, every distinct diff once",
    )


def change_lines(change: Change, new_content: bool = False) -> list[Text]:
    """The Change's line and, for a changed file, its diff; a new file's whole content only on request
    (it is all `+` lines, and four of them would fill a screen)."""
    style = ACTION_STYLE[change.action]
    head = shown(
        ("  " + SYMBOL[change.action] + " ", style),
        (change.resource, "bold"),
        f": {change.summary}",
        (" (reboot)" if change.reboot and change.resource != "reboot" else "", "dim"),
    )
    lines = [head]
    diff = change.diff if change.action != "create" or new_content else None
    for line in (diff or "").split("\n"):  # only a newline ends a line of the file; CR is shown as \x0d
        if line:
            lines.append(shown("      " + line, style=DIFF_STYLE.get(line[:1], "")))
    return lines


def host_lines(host: HostPlan, new_content: bool = False) -> list[Text]:
    name = (host.host, "bold cyan")
    if host.status != "ok":
        return [shown(name, (f": {host.status}", "bold red"), f": {host.error or 'no reason given'}")]
    if not host.changes:
        return [shown(name, (": no changes", "dim"))]
    lines = [shown(name)]
    for change in host.changes:
        lines += change_lines(change, new_content)
    return lines


def render_plan(plan: FleetPlan, console: Console, new_content: bool = False) -> None:
    """Changes (`+` create, `~` update, `-` delete, `!` failed check, `*` warning, `?` manual), then the
    totals line: one
    host in full, a fleet grouped (see the module's docstring)."""
    from rich.text import Text

    lines = host_lines(plan.hosts[0], new_content) if len(plan.hosts) == 1 else fleet_lines(plan, new_content)
    for line in lines + kind_lines(plan):
        console.print(line, soft_wrap=True)  # long paths and diff lines stay whole when piped
    style = "green" if plan.converged else "bold"
    console.print(Text(summary_line(plan), style=style), soft_wrap=True)


# What a twin stands in for, said where the plan names the simulated hosts (ARCHITECTURE "Simulated nodes").
SIMULATION_BOUNDARY = (
    " (twin files stand in for the NVIDIA layer: NVML, the driver and its daemons; files, processes and "
    "torch are real; the node check's timer is not installed: run the check by hand)"
)


def kind_lines(plan: FleetPlan) -> list[Text]:
    """Which hosts are simulated (a twin file stands in for their NVIDIA layer) and which are real, and a
    warning for the machine running this tool, where apply holds back a driver install and a reboot."""
    lines = []
    for kind, value, style in (("simulated", True, "yellow"), ("real", False, "bold")):
        names = [h.host for h in plan.hosts if h.simulated is value]
        if names:
            boundary = SIMULATION_BOUNDARY if value else ""
            lines.append(shown((f"{kind}: ", style), fold(names), boundary))
    for host in plan.hosts:
        held = held_on_control_machine(list(host.changes))
        if host.control_machine and held:
            lines.append(
                shown(
                    ("  ! ", "red"),
                    (host.host, "bold cyan"),
                    f" is the machine running mgpu-provision ({host.control_machine}): apply will not "
                    f"carry out {held_names(held)} there without --allow-control-machine",
                )
            )
    return lines


def _key(change: Change) -> tuple[object, ...]:
    """What a person reads of a change: its line. Two new env files that differ only in the header comment
    naming their host read alike, so they are one line (their diffs, with --diff, each distinct one once)."""
    return (change.resource, change.action, change.summary, change.reboot)


# The distinct diffs of one shared change: each with a change that has it and the hosts it is for.
Variants = dict[str | None, tuple[Change, list[str]]]

# What stands for a host's own name in a diff that hosts share (a new env file's header names its host).
HOST_MARK = "<host>"


def _without_host(diff: str | None, host: str) -> str | None:
    """The diff with `host`'s name, where it stands as a whole name, replaced by HOST_MARK: two new files
    that differ only in the header line naming their host are one content."""
    if not diff:
        return diff
    return re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-]|\.\w)", HOST_MARK, diff)


def _diffs(variants: Variants) -> list[Text]:
    """The diff lines of a shared change: the one diff, or each distinct one under the hosts it is for."""
    if len(variants) == 1:
        ((change, _),) = variants.values()
        return change_lines(change, new_content=True)[1:]
    lines: list[Text] = []
    for change, hosts in variants.values():
        lines.append(shown((f"    on {fold(hosts)}:", "dim")))
        lines += change_lines(change, new_content=True)[1:]
    return lines


def _variant(change: Change, host: str) -> Change:
    """The change as hosts share it: its diff with the host's name as HOST_MARK."""
    diff = _without_host(change.diff, host)
    return change if diff == change.diff else change._replace(diff=diff)


def fleet_lines(plan: FleetPlan, diffs: bool = False) -> list[Text]:
    """Each change that two or more hosts share once, with their names; then each host with what is its
    own (or why it could not be read); then the hosts with nothing to do."""
    shared: dict[tuple[object, ...], tuple[Change, list[str], Variants]] = {}
    for host in plan.hosts:
        for change in host.changes:
            _, hosts, variants = shared.setdefault(_key(change), (change, [], {}))
            hosts.append(host.host)
            shared_change = _variant(change, host.host)
            variants.setdefault(shared_change.diff, (shared_change, []))[1].append(host.host)
    lines: list[Text] = []
    for change, hosts, variants in shared.values():
        if len(hosts) < 2:
            continue
        head = change_lines(change, new_content=True)[0]
        head.append(f"  on {plural(len(hosts), 'host', 'hosts')}: {fold(hosts)}", style="dim")
        lines += [head, *(_diffs(variants) if diffs else [])]
    idle = []
    for host in plan.hosts:
        own = [c for c in host.changes if len(shared[_key(c)][1]) == 1]
        if host.status != "ok":
            lines += host_lines(host)
        elif own:
            lines.append(shown((host.host, "bold cyan")))
            for change in own:
                head, *diff = change_lines(change, new_content=True)
                lines += [head, *(diff if diffs else [])]
        elif not host.changes:
            idle.append(host.host)
    if idle:
        count = plural(len(idle), "host", "hosts")
        lines.append(shown((f"no changes on {count}: ", "dim"), fold(idle)))
    return lines


# The keys of a change in `plan --json`, in order (docs/plan-json.md); `tags`, `phase` and `applies` follow.
CHANGE_KEYS = ("resource", "action", "summary", "current", "desired", "reboot", "diff")


def change_json(change: Change) -> dict[str, Any]:
    document: dict[str, Any] = {key: getattr(change, key) for key in CHANGE_KEYS}
    document.update(
        severity=SEVERITY.get(change.action, "drift"),
        tags=[change.phase],
        phase=change.phase,
        applies=change.agent_step is not None,
    )
    return document


def plan_json(plan: FleetPlan) -> dict[str, Any]:
    """The `plan --json` document; its keys are a public contract (docs/plan-json.md)."""
    totals = plan.totals
    return {
        "format_version": PLAN_JSON_VERSION,
        "hosts": {
            h.host: {
                "status": h.status,
                "error": h.error,
                "simulated": h.simulated,
                "control_machine": h.control_machine,
                "changes": [change_json(c) for c in h.changes],
            }
            for h in plan.hosts
        },
        "totals": {
            "to_change": totals.to_change,
            "checks_failed": totals.checks_failed,
            "warnings": totals.warnings,
            "manual": totals.manual,
            "hosts_with_changes": totals.hosts_with_changes,
            "hosts": totals.hosts,
            "unreachable": totals.unreachable,
            "failed": totals.failed,
        },
        "converged": plan.converged,
        "exit_code": plan.exit_code,
    }
