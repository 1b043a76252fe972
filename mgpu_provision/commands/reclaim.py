"""`mgpu-provision reclaim RIG`: find and end processes that hold GPU memory after killed jobs, fleet-wide.

A dry run by default: it shows, per node, every process holding GPU memory and what the rig's reclaim policy
would do with it. `--yes` ends the selected ones (SIGTERM, SIGKILL after the grace period) and verifies with
fresh facts that their memory is free. Exit 0: nothing to do or all ended; 2: something left, refused or
failed, or a host unreachable; 1: an error. Command lines, owners and reasons are the node's words (any
user names their processes): the views print them through `output.shown`. rich is imported by the views
only: `--json` never loads it.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import protocol
from ..fleet.pool import run_fleet
from ..fleet.session import AgentSession
from ..jobs.reclaim import HostReclaim, HostResult, agent_args, collect, exit_code, reclaim_on
from . import options
from .output import JSON_FORMAT_VERSION, make_console, shown

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def as_json(hosts: list[HostReclaim], dry_run: bool, user: str | None = None) -> dict[str, Any]:
    """Stable keys for scripts: per host status, error, processes and freed MiB; the total; the exit code."""
    return {
        "format_version": JSON_FORMAT_VERSION,  # the envelope every --json shares (docs/json.md)
        "dry_run": dry_run,
        "user": user,
        "hosts": {
            h.name: {
                "status": h.status,
                "error": h.error,
                "freed_mib": h.freed_mib,
                "processes": [p.model_dump(mode="json") for p in h.processes],
            }
            for h in hosts
        },
        "freed_mib": sum(h.freed_mib for h in hosts),
        "exit_code": exit_code(hosts),
    }


ACTION_STYLE = {"keep": "dim", "refused": "yellow", "would-end": "cyan", "ended": "green", "failed": "red"}


def _started(epoch: float | None) -> str:
    return "?" if epoch is None else datetime.fromtimestamp(epoch).strftime("%m-%d %H:%M:%S")


# In the order `_table` fills each row.
COLUMNS = ("pid", "ppid", "gpu", "MiB", "owner", "started", "command", "action", "why")
NUMERIC = ("pid", "ppid", "gpu", "MiB")


def _table(host: HostReclaim) -> Table:
    from rich.table import Table

    table = Table(title=shown(host.name), title_justify="left", expand=False)
    for column in COLUMNS:
        table.add_column(column, overflow="fold", justify="right" if column in NUMERIC else "left")
    for p in host.processes:
        cells = (
            str(p.pid),
            "?" if p.ppid is None else str(p.ppid),
            str(p.gpu),
            "?" if p.used_mib is None else str(p.used_mib),
            p.owner or "?",
            _started(p.start_time),
            (p.command or "")[:60],
        )
        table.add_row(*map(shown, cells), shown(p.action, style=ACTION_STYLE[p.action]), shown(p.reason))
    return table


def summary(hosts: list[HostReclaim], dry_run: bool) -> str:
    reached = [h for h in hosts if h.status == "ok"]
    if dry_run:
        count = sum(h.count("would-end") for h in reached)
        mib = sum(p.used_mib or 0 for h in reached for p in h.processes if p.action == "would-end")
        line = f"Would end {count} process{'es' if count != 1 else ''} holding {mib} MiB"
        line += " (dry run: --yes ends them)" if count else ""
    else:
        count = sum(h.count("ended") for h in reached)
        line = (
            f"Ended {count} process{'es' if count != 1 else ''}, freed {sum(h.freed_mib for h in hosts)} MiB"
        )
    problems = [f"{n} {what}" for what in ("refused", "failed") if (n := sum(h.count(what) for h in reached))]
    unreachable = len(hosts) - len(reached)
    if unreachable:
        problems.append(f"{unreachable} host{'s' if unreachable != 1 else ''} failed or unreachable")
    return f"{line} on {len(reached)} of {len(hosts)} hosts" + (
        f"; {', '.join(problems)}" if problems else ""
    )


def render_human(hosts: list[HostReclaim], dry_run: bool, console: Console) -> None:
    for host in hosts:
        if host.status != "ok":
            console.print(shown((f"{host.name}: {host.status}", "red"), f": {host.error}"))
        elif not host.processes:
            console.print(shown(f"{host.name}: no process holds GPU memory"))
        else:
            console.print(_table(host))
    console.print(shown(summary(hosts, dry_run)))


def run(args: argparse.Namespace) -> int:
    fleet = options.prepare(args)
    dry_run = not args.yes
    request = agent_args(fleet.loaded.spec.reclaim, dry_run, args.user)

    def one(session: AgentSession) -> HostResult:
        return reclaim_on(session, request)

    hosts = collect(run_fleet(fleet.targets, one, fleet.options))
    if args.json:
        print(json.dumps(as_json(hosts, dry_run, args.user), indent=2))
    else:
        render_human(hosts, dry_run, make_console())
    return exit_code(hosts)


def _user(text: str) -> str:
    if not protocol.user_name().ok(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a user name")
    return text


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "reclaim",
        help="find and end processes holding GPU memory after killed jobs (dry run unless --yes)",
        description=(
            "Find and end processes that still hold GPU memory after their job died.\n\n"
            "Lists every process holding GPU memory on the chosen hosts, with its owner, whether it is left\n"
            "over from a job that is gone or part of a live one, and what the rig's reclaim policy (never,\n"
            "orphans, orphans+patterns) does with it. Left over means: the leaders of its process group and\n"
            "session have both exited, or torchrun started it and is gone; a process leading its own\n"
            "process group (nohup, setsid, a container's main process) is a live job and is kept.\n"
            "Without --yes nothing is ended; with it each process is checked to still hold /dev/nvidia*\n"
            "right before each\n"
            "signal. Exit 0 when there is nothing to do or everything selected was ended, 2 when something\n"
            "is left, refused or failed or a host is unreachable, 1 on errors."
        ),
        epilog="examples:\n  mgpu-provision reclaim rig.yaml            # dry run: what would be ended\n"
        "  mgpu-provision reclaim rig.yaml --yes --limit gpu-b\n"
        "  mgpu-provision reclaim rig.yaml --user alice   # only alice's processes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    parser.add_argument(
        "--yes", action="store_true", help="end the selected processes (SIGTERM, then SIGKILL after grace_s)"
    )
    parser.add_argument(
        "--user",
        type=_user,
        metavar="NAME",
        help="only NAME's processes may be ended (default: anyone's); the owner column shows whose each is",
    )
    parser.set_defaults(func=run)
