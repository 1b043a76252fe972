"""`mgpu-provision init --from HOST`: write a rig file from a known-good box.

Reads the box's facts over SSH (one agent call), captures its `nvidia-smi topo -m` matrix beside the rig file,
and writes a rig file that validates and whose plan against the same box is empty. The text itself comes from
`initgen.rig_from_facts` (pure); this module is the thin shell: parse, reach the box, write files.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from .. import protocol
from ..errors import ProvisionError
from ..facts import Facts
from ..fleet.options import FleetOptions
from ..fleet.pool import run_fleet
from ..fleet.session import read_facts
from ..fleet.targets import DEFAULT_PYTHON, HostTarget
from ..initgen import env_file_paths, rig_from_facts
from ..node.topology import format_topology, gpu_matrix

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


def run(args: argparse.Namespace) -> int:
    user, address, port = parse_destination(args.source)
    output: Path = args.output
    topo_path = output.with_name(output.stem + ".topo.txt")
    for path in (output, topo_path):  # checked before connecting: a refusal must not cost a login
        if path.exists() and not args.force:
            raise ProvisionError(f"{path} exists; choose another --output or pass --force")
    target = HostTarget(
        name=args.source,
        address=address,
        port=port,
        user=user,
        identity_file=str(args.identity_file) if args.identity_file else None,
        jump=None,
        become=False,
        python=args.python,
        connection="ssh",
        simulate=None,
        connect_timeout_s=args.timeout,
        command_timeout_s=300.0,
    )
    options = FleetOptions(
        accept_new_host_keys=args.accept_new_host_keys,
        known_hosts=args.known_hosts,
        ssh_config=args.ssh_config,
    )
    request = protocol.facts_request(files=env_file_paths(), python=args.smoke_python)
    outcome = run_fleet([target], lambda session: read_facts(session, request), options)[target.name]
    if outcome.value is None:
        raise ProvisionError(f"could not read {args.source}: {outcome.error}")
    facts = outcome.value

    topo_name = None
    if facts.gpus:
        topo_path.write_text(format_topology(gpu_matrix(len(facts.gpus), facts.cell)), encoding="utf-8")
        topo_name = topo_path.name
    name = args.name or host_name_for(facts, address)
    connection: dict[str, str | int | None] = {
        "user": user,
        "port": port,
        "identity_file": str(args.identity_file.resolve()) if args.identity_file else None,
        "python": args.python if args.python != DEFAULT_PYTHON else None,
    }
    output.write_text(rig_from_facts(name, address, facts, topo_name, connection), encoding="utf-8")
    print(f"wrote {output}" + (f" and {topo_name}" if topo_name else ""))
    print(f"next: review the `review:` lines, then `mgpu-provision plan {output}`")
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
            "  mgpu-provision init --from gpu-a --identity-file ~/.ssh/id_ed25519 --force"
        ),
    )
    parser.add_argument("--from", dest="source", required=True, metavar="HOST", help="[user@]host[:port]")
    parser.add_argument("-o", "--output", type=Path, default=Path("rig.yaml"), help="default ./rig.yaml")
    parser.add_argument("--force", action="store_true", help="overwrite the output file")
    parser.add_argument("--name", help="the host's name in the rig file (default: its hostname)")
    parser.add_argument("--identity-file", type=Path, metavar="KEY", help="SSH private key")
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="python3 on the box that runs the agent")
    parser.add_argument(
        "--smoke-python", default=DEFAULT_PYTHON, metavar="PYTHON", help="python with torch on the box"
    )
    parser.add_argument("--accept-new-host-keys", action="store_true", help="record an unknown host key")
    parser.add_argument("--known-hosts", type=Path, metavar="FILE", help="default ~/.ssh/known_hosts")
    parser.add_argument("--ssh-config", type=Path, metavar="FILE", help="default ~/.ssh/config")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="connect timeout")
    parser.set_defaults(func=run)
