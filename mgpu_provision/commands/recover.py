"""`mgpu-provision recover RIG`: reset (or reboot) the GPUs whose findings ask for it, fleet-wide.

A dry run unless `--yes`: per host, what it would do. With `--yes`, per host: drain in Slurm (when the rig
runs slurmd), wait until no process holds the GPU, reset it, check again, resume its own drain; a failed
reset or a reboot finding reboots the box under the rig's reboot policy (jobs/recover.py). One line per step
in the recap. Exit 0: every host healthy or recovered (dry run: recoverable); 2: a host failed, is still
held or unreachable; 1: an error. rich is imported by the view only: `--json` never loads it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..fleet.pool import run_fleet
from ..fleet.session import AgentSession
from ..jobs.recover import HostRecovery, RecoverSettings, exit_code, recover_host
from . import options
from .output import make_console, plural, print_json, shown

if TYPE_CHECKING:
    from rich.console import Console

STATUS_STYLE = {
    "healthy": "green",
    "would-recover": "cyan",
    "recovered": "green",
    "failed": "bold red",
    "unreachable": "bold red",
}


def as_json(hosts: list[HostRecovery]) -> dict[str, Any]:
    """Per host: status, error and its steps (step, ok, words), in order."""
    return {
        h.host: {
            "status": h.status,
            "error": h.error,
            "steps": [{"step": s.step, "ok": s.ok, "words": s.words} for s in h.steps],
        }
        for h in hosts
    }


def render_human(hosts: list[HostRecovery], dry_run: bool, console: Console) -> None:
    for host in hosts:
        console.print(
            shown((host.host, "bold cyan"), ": ", (host.status, STATUS_STYLE[host.status])), soft_wrap=True
        )
        if host.error:
            console.print(shown("  ", ("✗ ", "red"), host.error), soft_wrap=True)
        for step in host.steps:
            mark = ("✓ ", "green") if step.ok else ("✗ ", "red")
            console.print(shown("  ", mark, (step.step, "bold"), f": {step.words}"), soft_wrap=True)
    counts = {s: sum(1 for h in hosts if h.status == s) for s in STATUS_STYLE}
    said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    head = "Recover (dry run, nothing changed)" if dry_run else "Recover"
    console.print(shown(f"{head}: {said}, of {plural(len(hosts), 'host', 'hosts')}"), soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    fleet = options.prepare(args)
    settings = RecoverSettings(
        dry_run=not args.yes,
        wait_s=args.wait,
        drain_timeout_s=args.drain_timeout,
        reboot_timeout_s=args.reboot_timeout,
    )
    console = None if args.json else make_console()

    def progress(line: str) -> None:
        if console is not None:
            console.print(shown((line, "dim")), soft_wrap=True)

    def one(session: AgentSession) -> HostRecovery:
        return recover_host(
            session, fleet.options, fleet.loaded, fleet.loaded.host(session.target.name), settings, progress
        )

    hosts = [
        outcome.value
        if outcome.status == "ok" and outcome.value is not None
        else HostRecovery(
            name, "unreachable" if outcome.status == "unreachable" else "failed", error=outcome.error
        )
        for name, outcome in run_fleet(fleet.targets, one, fleet.options).items()
    ]
    code = exit_code(hosts)
    if args.json:
        return print_json(code, as_json(hosts), dry_run=settings.dry_run)
    assert console is not None
    render_human(hosts, settings.dry_run, console)
    return code


# A wait: 0 up to a day (the node's gpu-reset takes at most that).
_seconds = options.seconds_up_to(86400)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "recover",
        help="reset or reboot the GPUs whose findings ask for it (dry run unless --yes)",
        description=(
            "Reset or reboot the GPUs whose findings ask for it.\n\n"
            "What asks for it: an Xid whose resolution in NVIDIA's catalog is RESET_GPU or RESTART_BM,\n"
            "NVML's recovery action, a pending memory repair, uncorrectable volatile ECC errors.\n"
            "Per host: drain it in Slurm when the rig runs slurmd (reason 'mgpu: recover') and wait for its\n"
            "jobs; wait until no process holds the GPU (--wait); reset it (nvidia-smi -r -i N; every GPU\n"
            "together on an NVSwitch rig); check again; resume the drain only if this run set it. A reset\n"
            "that fails, or a finding that asks for a reboot, reboots the box when the rig's driver.reboot\n"
            "is allowed (never the machine running this tool), then checks again. A GPU still held when\n"
            "--wait ends is not reset: nothing is changed. An admin's drain is never touched.\n"
            "Without --yes nothing is changed: each host's steps are said. Exit 0 when every host is\n"
            "healthy or recovered (dry run: recoverable), 2 when one failed, is still held or unreachable,\n"
            "1 on errors."
        ),
        epilog="examples:\n  mgpu-provision recover rig.yaml                 # dry run: what it would do\n"
        "  mgpu-provision recover rig.yaml --limit gpu-b --yes\n"
        "  mgpu-provision recover rig.yaml --yes --wait 600 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    parser.add_argument("-y", "--yes", action="store_true", help="carry out the steps (default: a dry run)")
    parser.add_argument(
        "--wait",
        type=_seconds,
        default=300.0,
        metavar="S",
        help="how long processes may still hold a GPU before its reset is given up (default 300)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=_seconds,
        default=3600.0,
        metavar="S",
        help="how long a drained node's Slurm jobs may take to end (default 3600)",
    )
    parser.add_argument(
        "--reboot-timeout",
        type=_seconds,
        default=900.0,
        metavar="S",
        help="how long a rebooted box may take to come back (default 900)",
    )
    parser.set_defaults(func=run)
