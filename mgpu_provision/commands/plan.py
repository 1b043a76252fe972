"""`mgpu-provision plan RIG`: the drift audit — what differs on each box, and what apply would do about it.

Reads every chosen host with the agent's `facts` verb only (plan never changes a box), then decides on this
machine with the pure `plan_host`. Exit codes follow Terraform's `-detailed-exitcode`: 0 no drift, 2 drift,
failed checks or hosts that could not be read, 1 an error (bad rig file, unreadable topology file).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..jobs.plan import plan_fleet
from . import options, paths
from .output import make_console, waiting_for
from .plan_view import add_diff_option, plan_json, render_plan


def run(args: argparse.Namespace) -> int:
    fleet = options.prepare(args)
    drawn = args.svg is not None or args.report is not None or args.smoke is not None
    if drawn:  # the pictures' modules (SVG, HTML) only for a run that draws
        from .fleet_report import read_smoke, write_plan_pictures
    bandwidth = read_smoke(args.smoke, args.report) if args.smoke is not None else None
    with waiting_for("reading the hosts", [t.name for t in fleet.targets]) as host_done:
        run = dataclasses.replace(fleet.options, on_host_done=host_done)
        plan = plan_fleet(fleet.loaded, fleet.targets, run)
    if drawn:
        write_plan_pictures(fleet.loaded, plan, svg=args.svg, report=args.report, bandwidth=bandwidth)
    if args.json:
        print(json.dumps(plan_json(plan), indent=2))
    else:
        render_plan(plan, make_console(), new_content=args.diff)
    return plan.exit_code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "plan",
        help="show the drift: what differs from the rig file on each box (writes only a health sample)",
        description=(
            "Show the drift: what differs from the rig file on each box.\n\n"
            "Changes nothing on a box but the health counter sample it keeps (health-counters.json in\n"
            "files.state_dir), against which the next run judges NVLink, ECC and Xid counts as rates.\n"
            "Each change is marked + create, ~ update, ! failed check (apply cannot fix it) or ? manual\n"
            "step. Exit 0 no drift, 2 drift, a failed check or an unreachable host, 1 error."
        ),
        epilog="examples:\n  mgpu-provision plan rig.yaml\n"
        "  mgpu-provision plan rig.yaml --diff                # with the content of new files\n"
        "  mgpu-provision plan rig.yaml --limit 'rtx*' --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    options.add_via_argument(parser)
    add_diff_option(parser)
    parser.add_argument("--svg", type=paths.output_file, metavar="FILE",
                        help="also draw each box with its findings as SVG: FILE for one host, FILE-HOST.svg "
                        "beside it for several")
    parser.add_argument("--report", type=paths.output_file, metavar="FILE.html",
                        help="also write the fleet at a glance: checks x hosts folded per rig group, each "
                        "odd box drawn (one HTML file, no JavaScript)")
    parser.add_argument("--smoke", type=paths.input_file, metavar="FILE",
                        help="with --report: a `smoke --json` report, its bus bandwidth beside each row")
    parser.set_defaults(func=run)
