"""Options and setup shared by every command that talks to hosts (facts, plan, apply, smoke, reclaim).

One place defines `RIG --limit --json --forks --accept-new-host-keys --known-hosts --ssh-config --timeout`,
so they mean the same everywhere, and one place turns them into the loaded rig, the chosen hosts, their
targets and the `FleetOptions`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from ..errors import ProvisionError
from ..fleet.options import MAX_FORKS, FleetOptions
from ..fleet.targets import HostTarget, targets_for
from ..rig import LoadedRig, nodesets, select_hosts
from ..rig.cache import load_rig
from ..typing_lite import NamedTuple
from . import paths

if TYPE_CHECKING:
    from ..rig.models import Host


def _positive_int(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_FORKS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_FORKS}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError("must be more than 0 and at most 600 seconds")
    return value


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The rig file and the options that choose hosts and say how to reach them."""
    paths.add_rig_argument(parser)
    parser.add_argument(
        "--limit",
        metavar="PATTERN",
        help='hosts to act on: "gpu-a,rtx*,!gpu-c,gpu-[001-064]" (host names, groups, inventory groups, '
        "rig types, globs, node sets; @source:group with the clush extra)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (stable keys) instead of tables")
    parser.add_argument(
        "--forks",
        type=_positive_int,
        metavar="N",
        help=f"hosts at a time (default: all, at most {MAX_FORKS})",
    )
    parser.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="trust and record host keys not yet in known_hosts (a CHANGED key is always refused)",
    )
    parser.add_argument(
        "--known-hosts",
        type=paths.kept_file,
        metavar="FILE",
        help="known_hosts file (default: ~/.ssh/known_hosts)",
    )
    parser.add_argument(
        "--ssh-config", type=paths.input_file, metavar="FILE", help="ssh config (default: ~/.ssh/config)"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log each host's SSH steps with times on stderr (connect, banner, key exchange, login, agent); "
        "-vv for every detail",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="connect timeout per host (TCP, SSH banner, login); overrides the rig's connect_timeout_s",
    )


def add_via_argument(parser: argparse.ArgumentParser) -> None:
    """`--via clush` (facts, plan, reclaim, apply): the hosts through ClusterShell and OpenSSH, not Fabric."""
    parser.add_argument(
        "--via",
        choices=("fabric", "clush"),
        default="fabric",
        help="fan-out engine: fabric (default, built in) or clush (ClusterShell over OpenSSH: large fleets; "
        "the clush extra)",
    )
    parser.add_argument(
        "--topology",
        type=paths.input_file,
        metavar="FILE",
        help="with --via clush: reach the hosts through gateways, as ClusterShell's topology.conf FILE says "
        "([routes] head: gw[1-2], gw1: gpu-[001-512], …)",
    )


class FleetRun(NamedTuple):
    """Everything a host-facing command needs before it runs: the rig, its chosen hosts, how to reach them."""

    loaded: LoadedRig
    hosts: list[Host]
    targets: list[HostTarget]
    options: FleetOptions

    def host(self, target: HostTarget) -> Host:
        return self.loaded.host(target.name)


def fleet_options(args: argparse.Namespace) -> FleetOptions:
    # facts, plan, reclaim and apply take --via
    via: Literal["fabric", "clush"] = getattr(args, "via", "fabric")
    if via == "clush" and not nodesets.clustershell():
        raise ProvisionError(
            f"--via clush needs ClusterShell, which is not installed: {nodesets.INSTALL_HINT}"
        )
    if via == "clush" and (old := nodesets.too_old()):
        raise ProvisionError(old)
    topology = getattr(args, "topology", None)
    if topology is not None and via != "clush":
        raise ProvisionError("--topology names ClusterShell's gateways: add --via clush")
    return FleetOptions(
        forks=args.forks,
        via=via,
        topology=topology,
        accept_new_host_keys=args.accept_new_host_keys,
        known_hosts=args.known_hosts,
        ssh_config=args.ssh_config,
    )


def one_line_per_step(record: logging.LogRecord) -> bool:
    """Whether `-v` shows a log record: Paramiko logs a failed transport at ERROR as its traceback, one
    record per line; `-v` keeps the first ("Exception (client): Error reading SSH protocol banner") and
    leaves the traceback to `-vv`, as the tool's own one-line error says the rest."""
    if not record.name.startswith("paramiko") or record.levelno < logging.ERROR:
        return True
    return record.getMessage().startswith("Exception")


def verbose(level: int) -> None:
    """`-v`: this tool's and Paramiko's log records with the time of each, one line per SSH step, to see
    which step is slow; `-vv` every detail, Paramiko's tracebacks included."""
    if level:
        logging.basicConfig(
            level=logging.INFO if level == 1 else logging.DEBUG,
            format="%(asctime)s.%(msecs)03d %(name)s: %(message)s",
            datefmt="%H:%M:%S",
            stream=sys.stderr,
        )
    if level == 1:
        for handler in logging.getLogger().handlers:
            handler.addFilter(one_line_per_step)


def prepare(args: argparse.Namespace) -> FleetRun:
    """Load and check the rig (SpecError on problems), apply --limit, build targets and options."""
    verbose(args.verbose)
    loaded = load_rig(args.rig)
    hosts = select_hosts(loaded, args.limit)
    targets = targets_for(loaded, hosts)
    if args.timeout is not None:
        targets = [t._replace(connect_timeout_s=args.timeout) for t in targets]
    options = fleet_options(args)
    if options.topology is not None:  # checked against the whole rig before any host is asked
        from ..fleet.clush_tree import read_topology

        read_topology(options.topology, [h.name for h in loaded.spec.hosts])
    return FleetRun(loaded, hosts, targets, options)


def seconds_up_to(limit: int) -> Callable[[str], float]:
    """An argparse type for a wait: a number of seconds from 0 to `limit`."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 <= value <= limit:
            raise argparse.ArgumentTypeError(f"give a number of seconds from 0 to {limit}")
        return value

    return seconds
