"""`mgpu-provision rehearse up|down`: a fleet of simulated boxes on loopback to try the fleet commands on.

`demo` shows one box without SSH; a fleet operator wants N boxes reached as a fleet is, over SSH, to try
`plan`, `apply --serial`, `smoke` and the node check on. `up` starts them (jobs/rehearse.py) and prints the
commands to run next, with the rig file and known_hosts it wrote; `down` stops them and removes the folder.
No root is needed where the kernel lets a user make namespaces; nothing listens outside 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..jobs import rehearse
from . import paths
from .output import print_json

DEFAULT_DIR = "mgpu-rehearsal"


def _int_range(low: int, high: int):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
        return value

    return parse


def next_steps(rehearsal: rehearse.Rehearsal, shown_dir: str) -> list[str]:
    """The commands a newcomer runs next, as README's rehearsal section gives them."""
    rig, known = f"{shown_dir}/rig.yaml", f"{shown_dir}/known_hosts"
    steps = [
        f"mgpu-provision plan {rig} --known-hosts {known}",
        f"mgpu-provision apply {rig} --known-hosts {known} --serial 1 --yes",
    ]
    if rehearsal.smoke:
        steps.append(f"mgpu-provision smoke {rig} --known-hosts {known}")
    first = rehearsal.hosts[0].name
    steps += [
        f"ssh -F {shown_dir}/ssh_config {first} {shlex.quote(rehearsal.check_command)}",
        "mgpu-provision rehearse down" + ("" if shown_dir == DEFAULT_DIR else f" --dir {shown_dir}"),
    ]
    return steps


def run_up(args: argparse.Namespace) -> int:
    python = args.python or sys.executable
    smoke_python = python if rehearse.has_torch(python) else None
    rehearsal = rehearse.up(args.dir, args.hosts, args.address, args.port, sys.executable, smoke_python)
    shown_dir = str(args.dir)
    steps = next_steps(rehearsal, shown_dir)
    if args.json:
        hosts = {h.name: h.as_dict() for h in rehearsal.hosts}
        return print_json(
            0, hosts, folder=str(rehearsal.folder), rig=str(rehearsal.rig),
            known_hosts=str(rehearsal.known_hosts), ssh_config=str(rehearsal.ssh_config), next=steps,
        )  # fmt: skip
    first, last = rehearsal.hosts[0], rehearsal.hosts[-1]
    span = first.address if len(rehearsal.hosts) == 1 else f"{first.address} to {last.address}"
    print(
        f"Rehearsal up: {len(rehearsal.hosts)} simulated hosts ({first.name} to {last.name}) on {span}, "
        f"port {first.port}, logging in as {rehearsal.user}."
    )
    print(f"Wrote {rehearsal.rig}, {rehearsal.known_hosts} and {rehearsal.ssh_config}.")
    if smoke_python is None:
        print(f"note: {python} has no torch, so the rig leaves out smoke; install the CPU build as README's")
        print("      'Try it' says (or name one with --python), then rehearse down and up again.")
    print("Next:")
    for step in steps:
        print(f"  {step}")
    return 0


def run_down(args: argparse.Namespace) -> int:
    rehearsal, stopped = rehearse.down(args.dir)
    if args.json:
        hosts = {h.name: {**h.as_dict(), "stopped": h.name in stopped} for h in rehearsal.hosts}
        return print_json(0, hosts, folder=str(rehearsal.folder), removed=True)
    gone = len(rehearsal.hosts) - len(stopped)
    print(
        f"Rehearsal down: stopped {len(stopped)} of {len(rehearsal.hosts)} hosts"
        + (f" ({gone} had stopped already)" if gone else "")
        + f"; removed {rehearsal.folder}."
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "rehearse",
        help="start (up) or stop (down) simulated SSH hosts on loopback to rehearse a fleet on",
        description=(
            "Start or stop a fleet to rehearse on.\n\n"
            "N simulated boxes (2x RTX 3090 twins), each behind an OpenSSH\n"
            "server of your own on a 127.x address, logging in as you. `up` writes a rig file, a\n"
            "known_hosts file and an ssh_config in --dir and prints the commands to try next (plan,\n"
            "apply --serial, smoke, the node check); `down` stops the hosts and removes --dir.\n"
            "Root is not needed where the kernel allows user namespaces; as root plain mount\n"
            "namespaces are used. Needs sshd (openssh-server) and unshare (util-linux)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  mgpu-provision rehearse up --hosts 8\n  mgpu-provision rehearse down",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up",
        help="start the hosts and write the rig file",
        description="Start N rehearsal hosts and write rig.yaml, known_hosts and ssh_config in --dir.",
    )
    up.add_argument("--hosts", type=_int_range(1, rehearse.MAX_HOSTS), default=2, help="how many (default 2)")
    up.add_argument("--address", default="127.0.100.1", help="the first host's address, in 127.0.0.0/8 "
                    "(the next ones count up; default 127.0.100.1)")  # fmt: skip
    up.add_argument("--port", type=_int_range(1024, 65535), default=2222, help="every host's SSH port")
    up.add_argument("--python", type=paths.program, help="python with torch for smoke (default: this one)")
    down = actions.add_parser(
        "down",
        help="stop the hosts and remove the folder",
        description="Stop the rehearsal hosts, remove --dir.",
    )
    for action in (up, down):
        action.add_argument("--dir", type=paths.work_folder, default=DEFAULT_DIR,
                            help=f"the rehearsal's folder (default ./{DEFAULT_DIR})")  # fmt: skip
        action.add_argument("--json", action="store_true", help="print a JSON document instead")
    up.set_defaults(func=run_up)
    down.set_defaults(func=run_down)
