"""`mgpu-provision plan RIG`: the drift audit — what differs on each box, and what apply would do about it.

Reads every chosen host with the agent's `facts` verb only (plan never changes a box), then decides on this
machine with the pure `plan_host`. Exit codes follow Terraform's `-detailed-exitcode`: 0 no drift, 2 drift,
failed checks or hosts that could not be read, 1 an error (bad rig file, unreadable topology file).
"""

from __future__ import annotations

import argparse
import json

from ..errors import ProvisionError
from ..plan.host import FleetPlan, HostPlan, plan_host
from . import options
from .facts import collect
from .plan_view import make_console, plan_json, render_plan


def build_plan(fleet: options.FleetRun) -> FleetPlan:
    """Facts from every host at once, then each host's plan; a host that was not read keeps its reason."""
    hosts: list[HostPlan] = []
    for name, outcome in collect(fleet).items():
        if outcome.status != "ok" or outcome.value is None:
            status = "failed" if outcome.status == "ok" else outcome.status  # ok without facts: not a plan
            hosts.append(HostPlan(name, status, (), outcome.error))
            continue
        try:
            changes = plan_host(fleet.loaded, fleet.loaded.host(name), outcome.value)
        except ProvisionError as exc:  # e.g. a visible-device UUID no GPU of this box has: this host only
            hosts.append(HostPlan(name, "failed", (), str(exc)))
            continue
        hosts.append(HostPlan(name, "ok", tuple(changes)))
    return FleetPlan(tuple(hosts))


def run(args: argparse.Namespace) -> int:
    plan = build_plan(options.prepare(args))
    if args.json:
        print(json.dumps(plan_json(plan), indent=2))
    else:
        render_plan(plan, make_console())
    return plan.exit_code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "plan",
        help="show the drift: what differs from the rig file on each box (changes nothing)",
        description="Read every chosen host and show what apply would change (+ create, ~ update), "
        "which checks fail (!) and what needs a person (?). Exit 0 no drift, 2 drift, failed checks "
        "or unreachable hosts, 1 error.",
        epilog="examples:\n  mgpu-provision plan rig.yaml\n"
        "  mgpu-provision plan rig.yaml --limit 'rtx*' --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    parser.set_defaults(func=run)
