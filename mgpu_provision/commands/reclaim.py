"""`mgpu-provision reclaim RIG`: find and end processes that hold GPU memory after killed jobs, fleet-wide.

A dry run by default: it shows, per node, every process holding GPU memory and what the rig's reclaim policy
would do with it (a table that fits the terminal; one line per process when piped). `--yes` ends the selected
ones, or exactly those `--pid` names (SIGTERM, SIGKILL after the grace period), and verifies with fresh facts
that their memory is free. Exit 0: nothing to do or all ended; 2: something left, refused or
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
from ..errors import ProvisionError
from ..jobs.reclaim import (
    HostReclaim,
    ReclaimedProcess,
    agent_args,
    collect,
    exit_code,
    reclaim_fleet,
)
from ..typing_lite import NamedTuple
from . import options
from .output import JSON_FORMAT_VERSION, make_console, plain_table, shown

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text


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
                "not_holders": h.not_holders,
            }
            for h in hosts
        },
        "freed_mib": sum(h.freed_mib for h in hosts),
        "exit_code": exit_code(hosts),
    }


ACTION_STYLE = {"keep": "dim", "refused": "yellow", "would-end": "cyan", "ended": "green", "failed": "red"}


def _started(epoch: float | None) -> str:
    return "?" if epoch is None else datetime.fromtimestamp(epoch).strftime("%m-%d %H:%M:%S")


# In the order each row's cells come; `why` last because it is the one that wraps (on a terminal).
COLUMNS = ("pid", "ppid", "gpu", "MiB", "owner", "started", "command", "action", "why")
NUMERIC = ("pid", "ppid", "gpu", "MiB")
# Left out, in this order, while a terminal is too narrow to leave `command` and `why` room to be read.
OPTIONAL = ("started", "ppid")
COMMAND_MIN, WHY_MIN, COMMAND_MAX = 16, 30, 60


def _cells(p: ReclaimedProcess) -> dict[str, str]:
    command = p.command or ""
    if p.mps_server is not None:
        command += f" (MPS client of pid {p.mps_server})"
    return {
        "pid": str(p.pid),
        "ppid": "?" if p.ppid is None else str(p.ppid),
        "gpu": str(p.gpu),
        "MiB": "?" if p.used_mib is None else str(p.used_mib),
        "owner": p.owner or "?",
        "started": _started(p.start_time),
        "command": command if len(command) <= COMMAND_MAX else command[: COMMAND_MAX - 1] + "…",
        "action": p.action,
        "why": p.reason,
    }


class Layout(NamedTuple):
    columns: list[str]
    command_width: int
    why_width: int


def fit(rows: list[dict[str, str]], width: int) -> Layout:
    """The columns of a table `width` wide and the widths of its two long ones: every short column whole
    (a pid or `would-end` never splits), OPTIONAL ones dropped until `command` and `why` get their minimum,
    `command` cut and `why` wrapped at spaces in what is left."""
    columns = list(COLUMNS)

    def left() -> int:
        short = [c for c in columns if c not in ("command", "why")]
        frame = 3 * (len(columns) - 1)  # a separator and its padding between columns (plain_table)
        return width - frame - sum(max(len(c), *(len(r[c]) for r in rows)) for c in short)

    for column in OPTIONAL:
        if left() >= COMMAND_MIN + WHY_MIN:
            break
        columns.remove(column)
    room = left()
    command = max(len("command"), *(len(r["command"]) for r in rows))
    if command + WHY_MIN > room:
        command = max(COMMAND_MIN, room - WHY_MIN)
    why = max(len("why"), *(len(r["why"]) for r in rows))
    return Layout(columns, command, max(1, min(why, room - command)))


def _table(title: str, rows: list[dict[str, str]], layout: Layout) -> Table:
    table = plain_table(shown(title))
    for column in layout.columns:
        table.add_column(
            column,
            no_wrap=column != "why",  # why wraps at spaces; command is cut; the rest are never narrower
            overflow="ellipsis" if column == "command" else "fold",
            width=layout.command_width
            if column == "command"
            else layout.why_width
            if column == "why"
            else None,
            justify="right" if column in NUMERIC else "left",
        )
    for row in rows:
        table.add_row(
            *(
                shown(row[c], style=ACTION_STYLE[row[c]]) if c == "action" else shown(row[c])
                for c in layout.columns
            )
        )
    return table


def _lines(title: str, rows: list[dict[str, str]]) -> list[Text]:
    """Where the output is not a terminal (a pipe, a log): a header and one line per process, every column
    but the last padded to its widest cell, nothing wrapped, so that grep and a log keep a row together."""
    columns = ["host", *COLUMNS]
    cells = [{"host": title, **row} for row in rows]
    widths = {c: max(len(c), *(len(r[c]) for r in cells)) for c in columns[:-1]}

    def line(values: dict[str, str]) -> str:
        padded = [
            values[c].rjust(widths[c]) if c in NUMERIC else values[c].ljust(widths[c]) for c in columns[:-1]
        ]
        return "  ".join([*padded, values[columns[-1]]])

    return [shown(line({c: c for c in columns})), *(shown(line(r)) for r in cells)]


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
        elif console.is_terminal:
            rows = [_cells(p) for p in host.processes]
            console.print(_table(host.name, rows, fit(rows, console.width)))
        else:
            for text in _lines(host.name, [_cells(p) for p in host.processes]):
                console.print(text, soft_wrap=True)
        for pid in host.not_holders:
            console.print(shown((f"{host.name}: pid {pid} holds no GPU memory: nothing to end", "yellow")))
    console.print(shown(summary(hosts, dry_run)), soft_wrap=not console.is_terminal)


def run(args: argparse.Namespace) -> int:
    fleet = options.prepare(args)
    if args.pid and len(fleet.targets) != 1:
        names = ", ".join(t.name for t in fleet.targets) or "none"
        raise ProvisionError(
            f"--pid names processes of one host, and {len(fleet.targets)} are chosen ({names}): "
            "choose one with --limit"
        )
    dry_run = not args.yes
    request = agent_args(fleet.loaded.spec.reclaim, dry_run, args.user, args.pid or ())
    hosts = collect(reclaim_fleet(fleet.targets, request, fleet.options))
    if args.json:
        print(json.dumps(as_json(hosts, dry_run, args.user), indent=2))
    else:
        render_human(hosts, dry_run, make_console())
    return exit_code(hosts)


def _user(text: str) -> str:
    if not protocol.user_name().ok(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a user name")
    return text


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id")
    return int(text)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "reclaim",
        help="find and end processes holding GPU memory after killed jobs (dry run unless --yes)",
        description=(
            "Find and end processes that still hold GPU memory after their job died.\n\n"
            "Lists every process holding GPU memory on the chosen hosts, with its owner, whether it is left\n"
            "over from a job that is gone or part of a live one, and what the rig's reclaim policy (never,\n"
            "orphans, orphans+patterns) does with it. Left over means: a worker of Python's\n"
            "multiprocessing, a DataLoader worker or a torchelastic worker (torchrun, accelerate launch,\n"
            "deepspeed) whose parent is gone, or a member of a process group whose leader is such a\n"
            "leftover. A process whose group leader is gone but that is no such worker (a job a script put\n"
            "in the background) is kept: --pid ends exactly the named process.\n"
            "Without --yes nothing is ended; with it each process is checked to have the same start time\n"
            "and still hold /dev/nvidia* right before each signal. Exit 0 when there is nothing to do or\n"
            "everything selected was ended, 2 when something is left, refused or failed, a --pid holds no\n"
            "GPU memory or a host is unreachable, 1 on errors."
        ),
        epilog="examples:\n  mgpu-provision reclaim rig.yaml            # dry run: what would be ended\n"
        "  mgpu-provision reclaim rig.yaml --yes --limit gpu-b\n"
        "  mgpu-provision reclaim rig.yaml --user alice   # only alice's processes\n"
        "  mgpu-provision reclaim rig.yaml --limit gpu-b --pid 4242 -y   # exactly pid 4242 on gpu-b",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    options.add_via_argument(parser)
    parser.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="end the selected processes (SIGTERM, then SIGKILL after grace_s)",
    )
    parser.add_argument(
        "--pid",
        type=_pid,
        action="append",
        metavar="PID",
        help="select exactly this process (repeatable; one host, chosen with --limit), whatever the policy "
        "would say; the same checks before each signal: same start time, still holding /dev/nvidia*",
    )
    parser.add_argument(
        "--user",
        type=_user,
        metavar="NAME",
        help="only NAME's processes may be ended (default: anyone's); the owner column shows whose each is",
    )
    parser.set_defaults(func=run)
