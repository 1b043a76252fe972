"""`mgpu-provision init`: write a rig file from a known-good box.

People should not type GPU names, link counts and driver versions by hand: the box that works is the best
description of the boxes that should match it. The box is reached like any rig-file host (over SSH, or this
machine with `connection: local`, its NVIDIA layer optionally simulated), and the text comes from the pure
`initgen.rig_from_facts`; this command parses, reaches the box and writes the files.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from .. import protocol
from ..catalog.topology import format_topology, gpu_matrix
from ..errors import ProvisionError
from ..facts import Facts
from ..fleet.options import FleetOptions
from ..fleet.pool import run_fleet
from ..fleet.session import read_facts
from ..fleet.targets import DEFAULT_PYTHON, HostTarget
from ..jobs.init import env_file_paths, rig_from_facts
from ..rig.models import path_in_rig, schema_comment
from . import paths
from .output import print_json

# Where a `connection: local` box is written to be: the rendezvous address of a one-box rig.
LOCAL_ADDRESS = "127.0.0.1"

DESTINATION = re.compile(
    r"^(?:(?P<user>[a-z_][a-z0-9_.-]*)@)?(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*)(?::(?P<port>\d+))?$"
)


def parse_destination(text: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` (or an ~/.ssh/config alias) as OpenSSH writes it."""
    match = DESTINATION.match(text)
    if not match:
        raise ProvisionError(f"--from {text!r}: expected [user@]host[:port], e.g. ubuntu@10.0.0.11:22")
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 1 <= port <= 65535:
        raise ProvisionError(f"--from {text!r}: port {port} is not between 1 and 65535")
    return match["user"], match["host"], port


def host_name_for(facts: Facts, address: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", facts.host.hostname).strip("-.") or address
    return name[:63]


def target_for(args: argparse.Namespace) -> HostTarget:
    """The box to read: `--from` over SSH, or this machine with `--connection local`."""
    if args.connection == "local":
        if args.source:
            raise ProvisionError("--from is for SSH; --connection local reads this machine")
        user, address, port = None, LOCAL_ADDRESS, None
    elif not args.source:
        raise ProvisionError("init needs --from HOST (or --connection local for this machine)")
    else:
        user, address, port = parse_destination(args.source)
    return HostTarget(
        name=args.source or "this machine",
        address=address,
        port=port,
        user=user,
        identity_file=str(args.identity_file) if args.identity_file else None,
        jump=None,
        become=False,
        python=args.python,
        connection=args.connection,
        simulate=str(args.simulate.resolve()) if args.simulate else None,
        connect_timeout_s=args.timeout,
        command_timeout_s=300.0,
    )


def run(args: argparse.Namespace) -> int:
    target = target_for(args)
    output: Path = args.output
    topo_path = output.with_name(output.stem + ".topo.txt")
    for path in (output, topo_path):  # checked before connecting: a refusal must not cost a login
        if path.exists() and not args.force:
            raise ProvisionError(f"{path} exists; choose another --output or pass --force")
    options = FleetOptions(
        accept_new_host_keys=args.accept_new_host_keys,
        known_hosts=args.known_hosts,
        ssh_config=args.ssh_config,
    )
    request = protocol.facts_request(files=env_file_paths(), python=args.smoke_python)
    outcome = run_fleet([target], lambda session: read_facts(session, request), options)[target.name]
    if outcome.value is None:
        raise ProvisionError(f"could not read {target.name}: {outcome.error}")
    facts = outcome.value

    name = args.name or host_name_for(facts, target.address)
    folder = output.resolve().parent
    connection: dict[str, str | int | None] = {
        "user": target.user,
        "port": target.port,
        "identity_file": str(args.identity_file.resolve()) if args.identity_file else None,
        "python": args.python if args.python != DEFAULT_PYTHON else None,
        "connection": "local" if target.connection == "local" else None,
        "simulate": path_in_rig(args.simulate, folder) if args.simulate else None,
    }
    source = f"--from {args.source}" if args.source else "--connection local"
    text = rig_from_facts(
        name, target.address, facts, topo_path.name, connection, schema_comment(folder), source
    )
    topo_path.write_text(format_topology(gpu_matrix(len(facts.gpus), facts.cell)), encoding="utf-8")
    output.write_text(text, encoding="utf-8")
    if args.json:
        host = {"address": target.address, "gpus": len(facts.gpus), "simulated": facts.host.simulated}
        return print_json(0, {name: host}, rig=str(output), topology=str(topo_path))
    print(f"wrote {output} and {topo_path.name}")
    print(f"next: review the `review:` lines, then run: mgpu-provision plan {output}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "init",
        help="write a rig file from a known-good box",
        description=(
            "Write a rig file from a known-good box.\n\n"
            "Reads the box (over SSH, or this machine with --connection local), saves its link matrix (as\n"
            "nvidia-smi topo -m prints it) beside the rig file, and writes a rig file that validates and\n"
            "whose plan against the same box is empty. Lines marked `review:` are guesses to check."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  mgpu-provision init --from ubuntu@10.0.0.11 -o rig.yaml\n"
            "  mgpu-provision init --from gpu-a --identity-file ~/.ssh/id_ed25519 --force\n"
            "  mgpu-provision init --connection local                  # this machine\n"
            "  mgpu-provision init --connection local --simulate examples/twins/rtx3090-nvlink.yaml"
        ),
    )
    parser.add_argument(
        "--from", dest="source", metavar="HOST", help="[user@]host[:port] or an ~/.ssh/config alias (SSH)"
    )
    parser.add_argument(
        "--connection",
        choices=("ssh", "local"),
        default="ssh",
        help="ssh (default, needs --from) or local: read this machine without SSH",
    )
    parser.add_argument(
        "--simulate",
        type=paths.input_file,
        metavar="TWIN",
        help="simulate the box's NVIDIA layer from a twin file (rehearsal; see examples/twins/)",
    )
    parser.add_argument(
        "-o", "--output", type=paths.output_file, default="rig.yaml", help="default ./rig.yaml"
    )
    parser.add_argument("--force", action="store_true", help="overwrite the output file")
    parser.add_argument("--json", action="store_true", help="print what was written as a JSON document")
    parser.add_argument("--name", help="the host's name in the rig file (default: its hostname)")
    parser.add_argument("--identity-file", type=paths.input_file, metavar="KEY", help="SSH private key")
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="python3 on the box that runs the agent")
    parser.add_argument(
        "--smoke-python", default=DEFAULT_PYTHON, metavar="PYTHON", help="python with torch on the box"
    )
    parser.add_argument("--accept-new-host-keys", action="store_true", help="record an unknown host key")
    parser.add_argument(
        "--known-hosts", type=paths.kept_file, metavar="FILE", help="default ~/.ssh/known_hosts"
    )
    parser.add_argument("--ssh-config", type=paths.input_file, metavar="FILE", help="default ~/.ssh/config")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="connect timeout")
    parser.set_defaults(func=run)
