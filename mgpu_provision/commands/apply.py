"""`mgpu-provision apply RIG`: converge the fleet, a batch at a time, after showing the plan and asking.

Thin: parse the options, read every host's plan (`apply.preview`), show it and ask (unless `--yes`; without a
terminal and without `--yes` it refuses), run the rollout (`apply.rollout`) and print the recap. Exit 0 when
every host converged, 2 when one failed, was unreachable, was skipped or needs a reboot, 1 on errors.
Progress lines, notes and errors quote the nodes: they are printed through `output.shown`, never as markup.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.text import Text

from ..errors import ProvisionError
from ..jobs.apply import ApplyResult, ApplySettings, fleet_plan, rollout, to_carry_out
from ..jobs.drain import DRAIN_KINDS, DrainSettings
from ..jobs.plan import FleetPlan
from ..jobs.playbooks import load_playbook, select_steps
from ..jobs.rollout import Serial, parse_max_fail_percent, parse_serial
from ..rig.nodesets import fold
from . import options
from .output import host_table, make_console, print_json, shown
from .plan_view import add_diff_option, change_json, change_lines, render_plan

MAX_WAIT_S = 3600
MAX_DRAIN_WAIT_S = 7 * 24 * 3600  # a training job may run for days; the batch waits for it or is skipped
# Without --serial, a rollout that reboots goes one host at a time: a driver that breaks boot must not take
# every box down at once (the default of Ansible's rolling updates, `serial`, for the same reason).
REBOOT_SERIAL = Serial(1, False)


class NotConfirmed(ProvisionError):
    """apply needs a yes from a person (or --yes) before it changes anything."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "apply",
        help="converge the fleet to the rig file (shows the plan and asks first)",
        description=(
            "Converge the fleet to the rig file, a batch of hosts at a time.\n\n"
            "Shows the plan and asks first (unless --yes; without a terminal it needs --yes). Each host is\n"
            "changed in one locked call with atomic file writes, then read again for the recap. A failed\n"
            "check (!) stops none of that host's changes: the others are carried out, the check is reported\n"
            "and the host ends failed. Exit 0 when\n"
            "every host converged, 2 when one failed, was unreachable, was skipped or needs a reboot,\n"
            "1 on errors."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  mgpu-provision apply rig.yaml --serial 1 --max-fail-percent 0\n"
        "  mgpu-provision apply rig.yaml --playbook env --yes\n"
        "  mgpu-provision apply rig.yaml --skip-tags reboot --limit 'rtx*'\n"
        "  mgpu-provision apply rig.yaml --drain slurm --serial 2 --drain-timeout 7200\n"
        "  mgpu-provision apply rig.yaml --via clush --topology topology.conf --yes",
    )
    options.add_fleet_arguments(parser)
    options.add_via_argument(parser)
    add_diff_option(parser)
    parser.add_argument(
        "--playbook",
        default="provision",
        metavar="NAME|FILE",
        help="provision (default), audit, env, or a file",
    )
    parser.add_argument("--tags", metavar="A,B", help="run only the playbook steps with one of these tags")
    parser.add_argument("--skip-tags", metavar="A,B", help="leave out the playbook steps with these tags")
    parser.add_argument(
        "--serial",
        metavar="N|N%",
        help="hosts per batch (default: all at once, or one at a time when a reboot is planned)",
    )
    parser.add_argument(
        "--max-fail-percent", metavar="P", help="stop the later batches when more than P%% of a batch fails"
    )
    parser.add_argument(
        "--drain",
        choices=DRAIN_KINDS,
        help="slurm: drain each batch's nodes (reason 'mgpu: apply'), wait for their running jobs to end, "
        "apply, check, and resume the nodes this drained once they converged",
    )
    parser.add_argument(
        "--drain-timeout",
        type=options.seconds_up_to(MAX_DRAIN_WAIT_S),
        default=3600.0,
        metavar="SECONDS",
        help="with --drain: how long a batch's running jobs may take to end; a batch not drained by then "
        "is skipped and goes back to work (default 3600)",
    )
    parser.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    parser.add_argument(
        "--allow-control-machine",
        action="store_true",
        help="install a driver on, or reboot, a host that is the machine running mgpu-provision (refused "
        "by default: a rig file that reaches this machine without simulate: is usually a mistake)",
    )
    parser.add_argument(
        "--lock-wait",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="wait this long for another apply's lock",
    )
    parser.add_argument(
        "--reboot-timeout",
        type=_seconds,
        default=900.0,
        metavar="SECONDS",
        help="how long a rebooted box may take to come back (default 900)",
    )
    parser.set_defaults(func=run)


_seconds = options.seconds_up_to(MAX_WAIT_S)


def _split(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None


def run(args: argparse.Namespace) -> int:
    playbook = load_playbook(args.playbook)
    steps = select_steps(playbook, _split(args.tags), _split(args.skip_tags))
    serial = parse_serial(args.serial) if args.serial else None
    max_fail = parse_max_fail_percent(args.max_fail_percent) if args.max_fail_percent is not None else None
    fleet = options.prepare(args)
    no_slurm = [h.name for h in fleet.hosts if args.drain and fleet.loaded.rig_of(h).slurm is None]
    if no_slurm:  # refused before any host is asked, as smoke --via srun is
        raise ProvisionError(
            f"--drain slurm needs a `slurm` section in the rig of {', '.join(no_slurm)} (the nodes run "
            "slurmd); leave --drain out, or --limit the hosts that have one"
        )
    settings = ApplySettings(
        steps,
        lock_wait_s=args.lock_wait,
        reboot_timeout_s=args.reboot_timeout,
        allow_control_machine=args.allow_control_machine,
    )
    # soft_wrap: diffs and paths stay one line each, whatever the terminal width.
    err = make_console(sys.stderr, soft_wrap=True)
    out = err if args.json else make_console(soft_wrap=True)

    plan = fleet_plan(fleet.loaded, fleet.targets, steps, fleet.options)
    busy = [h for h in plan.hosts if to_carry_out(h, steps)]
    if serial is None and reboots(plan, steps):
        serial = REBOOT_SERIAL
        err.print(shown("note: a reboot is planned, so one host at a time (--serial 1; --serial N chooses)"))
    if busy:
        show_plan(out, plan, steps, args.diff)
        confirm(args.yes, len(busy), err)
    # A spinner with the latest step and the time spent: driver installs and reboot waits take minutes.
    # rich shows it only on a terminal; the progress lines themselves are always printed (logs, CI).
    with err.status("applying", spinner="dots") as status:

        def progress(line: str) -> None:
            err.print(shown(line, style="dim"))
            status.update(shown(f"{line} (driver installs and reboots take minutes)"))

        result = rollout(
            fleet.loaded,
            fleet.targets,
            plan,
            settings,
            fleet.options,
            serial=serial,
            max_fail_percent=max_fail,
            drain=DrainSettings(args.drain_timeout) if args.drain else None,
            progress=progress,
        )
    if args.json:
        return print_json(result.exit_code, **as_json(playbook.name, steps, result, plan))
    show_recap(out, result, plan)
    return result.exit_code


def reboots(plan: FleetPlan, steps: tuple[str, ...]) -> bool:
    """Whether apply would reboot a host of `plan` (its `reboot: allowed` and the playbook's reboot step)."""
    return any(c.resource == "reboot" for h in plan.hosts for c in to_carry_out(h, steps))


def confirm(yes: bool, hosts: int, console: Console) -> None:
    """Return when the person (or --yes) agrees; raise NotConfirmed otherwise."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise NotConfirmed(
            f"apply would change {hosts} host(s) and needs confirmation: pass --yes, or run it in a terminal"
        )
    try:
        answer = console.input(f"Apply these changes to {hosts} host(s)? Only 'yes' is accepted: ")
    except EOFError:  # Ctrl-D (or the end of piped input): no answer is not a yes
        console.print()
        answer = ""
    if answer.strip().lower() != "yes":
        raise NotConfirmed("apply cancelled: nothing was changed")


def show_plan(console: Console, plan: FleetPlan, steps: tuple[str, ...], new_content: bool = False) -> None:
    console.print(shown(("Plan", "bold"), f" (playbook steps: {', '.join(steps)})"))
    render_plan(plan, console, new_content)


def node_kind(simulated: bool | None) -> str:
    """The RECAP's `node` cell: whether a twin file stood in for the host's NVIDIA layer."""
    return {True: "simulated", False: "real", None: ""}[simulated]


# An error cell longer than this is cut, and the whole error printed below the table: a 400-character
# message from a node made every row of the recap as wide.
ERROR_CELL = 60


def short_error(error: str | None) -> str | None:
    if error is None or len(error) <= ERROR_CELL:
        return error
    return error[: ERROR_CELL - 10].rstrip() + "… (below)"


def show_recap(console: Console, result: ApplyResult, plan: FleetPlan) -> None:
    planned = {h.host: h for h in plan.hosts}
    for recap in result.recaps:
        lines = [f"done: {line}" for line in recap.done] + recap.notes
        if lines or recap.remaining:
            console.print(shown((recap.host, "bold cyan")))
        for line in lines:
            console.print(shown(f"  {line}"), soft_wrap=True)
        for change in recap.remaining:
            for text in change_lines(change):
                console.print(text, soft_wrap=True)
    rows = {
        r.host: {
            "node": node_kind(planned[r.host].simulated),
            "status": r.status,
            "done": len(r.done),
            "left": len([c for c in r.remaining if c.resource != "reboot"]),
            "reboot": "reboot required" if r.reboot_required else ("rebooted" if r.rebooted else ""),
            "time": f"{r.elapsed_s:.1f}s",
            "error": short_error(r.error),
        }
        for r in result.recaps
        if not (result.stopped and r.status == "skipped")  # one line below says which were not touched
    }
    console.print(Text("RECAP", style="bold"))
    console.print(host_table(rows, ("node", "status", "done", "left", "reboot", "time", "error")))
    for r in result.recaps:  # the whole of each error too long for its cell, below the table
        if r.error is not None and short_error(r.error) != r.error and r.host in rows:
            console.print(shown((r.host, "bold cyan"), f": {r.error}"), soft_wrap=True)
    if result.stopped:
        untouched = fold([r.host for r in result.recaps if r.status == "skipped"])
        console.print(shown((result.stopped, "red"), f"; not touched: {untouched}"), soft_wrap=True)
    for line in result.drain_skipped:
        console.print(shown((line, "yellow")), soft_wrap=True)
    counts = result.counts()
    needs = counts.pop("reboot_required")
    listed = ", ".join(f"{status} {n}" for status, n in counts.items())
    verdict = "Converged" if result.converged else "NOT converged"
    console.print(f"{verdict}: {listed}" + (f", reboot required on {needs}" if needs else ""), soft_wrap=True)


def as_json(playbook: str, steps: tuple[str, ...], result: ApplyResult, plan: FleetPlan) -> dict[str, Any]:
    planned = {h.host: h for h in plan.hosts}
    hosts = {
        r.host: {
            "simulated": planned[r.host].simulated,
            "control_machine": planned[r.host].control_machine,
            "status": r.status,
            "done": r.done,
            "remaining": [change_json(c) for c in r.remaining],
            "reboot_required": r.reboot_required,
            "rebooted": r.rebooted,
            "error": r.error,
            "notes": r.notes,
            "elapsed_s": round(r.elapsed_s, 3),
        }
        for r in result.recaps
    }
    return {
        "playbook": playbook,
        "steps": list(steps),
        "hosts": hosts,
        "recap": result.counts(),
        "converged": result.converged,
        "stopped": result.stopped,
        "drain_skipped": list(result.drain_skipped),
    }
