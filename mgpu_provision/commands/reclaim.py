"""`mgpu-provision reclaim RIG`: find and end processes that hold GPU memory after killed jobs, fleet-wide.

A dry run by default: it shows, per node, every process holding GPU memory and what the rig's reclaim policy
would do with it. `--yes` ends the selected ones (SIGTERM, SIGKILL after the grace period) and verifies with
fresh facts that their memory is free. Exit 0: nothing to do or all ended; 2: something left, refused or
failed, or a host unreachable; 1: an error.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from ..fleet.pool import run_fleet
from ..fleet.session import AgentSession
from ..reclaim import HostResult, agent_args, as_json, collect, exit_code, reclaim_on, render_human
from . import options


def run(args: argparse.Namespace) -> int:
    fleet = options.prepare(args)
    dry_run = not args.yes
    request = agent_args(fleet.loaded.spec.reclaim, dry_run)

    def one(session: AgentSession) -> HostResult:
        return reclaim_on(session, request)

    hosts = collect(run_fleet(fleet.targets, one, fleet.options))
    if args.json:
        print(json.dumps(as_json(hosts, dry_run), indent=2))
    else:
        render_human(hosts, dry_run, Console(file=sys.stdout))
    return exit_code(hosts)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "reclaim",
        help="find and end processes holding GPU memory after killed jobs (dry run unless --yes)",
        description="List every process holding GPU memory on the chosen hosts, whether it is orphaned or "
        "part of a live torchrun job, and what the rig's reclaim policy (never, orphans, orphans+patterns) "
        "does with it. Without --yes nothing is ended. Exit 0 when there is nothing to do or everything "
        "selected was ended, 2 when something is left, refused or failed or a host is unreachable, "
        "1 on errors.",
        epilog="examples:\n  mgpu-provision reclaim rig.yaml            # dry run: what would be ended\n"
        "  mgpu-provision reclaim rig.yaml --yes --limit gpu-b",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    parser.add_argument(
        "--yes", action="store_true", help="end the selected processes (SIGTERM, then SIGKILL after grace_s)"
    )
    parser.set_defaults(func=run)
