"""`mgpu-provision validate RIG`: check a rig file (schema and cross-field rules) without touching any host.

It is the first command a user runs and what CI runs on a rig file, so every problem is printed at once,
one per line as `file:line:col: field: message` (the form editors and CI annotations understand), and
`--json` gives the same problems to machines. Exit 0 valid, 1 invalid.
"""

from __future__ import annotations

import argparse

from ..errors import SpecError
from ..rig.cache import check_rig
from .output import print_json, visible
from .paths import add_rig_argument


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check a rig file (schema and rules), no network",
        description=(
            "Check a rig file against the schema and the cross-field rules.\n\n"
            "No host is contacted. Every problem is reported at once, as FILE:LINE:COLUMN: FIELD: what is\n"
            "wrong. Exit 0 valid, 1 invalid."
        ),
        epilog=(
            "examples:\n  mgpu-provision validate examples/mixed-fleet.yaml\n"
            "  mgpu-provision validate rig.yaml --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_rig_argument(parser)
    parser.add_argument(
        "--json", action="store_true", help='print JSON: {"valid": bool, "problems": [...], ...}'
    )
    parser.set_defaults(func=run)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def run(args: argparse.Namespace) -> int:
    try:
        checked = check_rig(args.rig)
    except SpecError as exc:
        if args.json:
            return print_json(1, {}, valid=False, problems=[p.as_dict() for p in exc.problems])
        for problem in exc.problems:
            print(visible(problem.render()))  # a problem may quote the file's bytes
        print(f"{args.rig}: invalid, {_count(len(exc.problems), 'problem')}")
        return 1
    if args.json:  # hosts: each host of the file and its rig type (nothing is contacted)
        return print_json(0, {name: {"rig": rig} for name, rig in checked.host_rigs}, valid=True, problems=[])
    print(f"{args.rig}: valid, {_count(len(checked.host_rigs), 'host')}, {_count(checked.rigs, 'rig')}")
    return 0
