"""`mgpu-provision slurm-conf RIG`: slurm.conf's node lines for the fleet, from what each box reports.

People write slurm.conf's `NodeName=` lines by hand and get them wrong: a GPU count above what gres.conf
lists makes the node INVAL, a core layout unlike the box's makes slurmctld refuse gres.conf's `Cores=`. This
prints `GresTypes=gpu` and one line per host whose rig has a `slurm` section (Sockets, CoresPerSocket,
ThreadsPerCore — NUMA nodes as sockets with `socket_layout: numa` —, RealMemory less the rig's headroom,
Gres=gpu:<type>:<n>) from the same facts and rules that write its gres.conf, for the controller's
slurm.conf or a file it includes. Comment lines above each say what `slurmd -C` registers, the
SlurmdParameters a layout needs and, for a configless node, the gres.conf lines that belong on the
controller. Unreachable hosts are comment lines and exit 2.
"""

from __future__ import annotations

import argparse

from ..errors import ProvisionError
from ..jobs.plan import gather_facts
from ..plan.resources.slurm import node_line, node_notes
from . import options
from .output import print_json


def run(args: argparse.Namespace) -> int:
    fleet = options.prepare(args)
    hosts = [h for h in fleet.hosts if fleet.loaded.rig_of(h).slurm is not None]
    if not hosts:
        raise ProvisionError(f"{args.rig}: no host's rig has a `slurm` section, so no node line to print")
    targets = [t for t in fleet.targets if fleet.loaded.rig_of(fleet.host(t)).slurm is not None]
    outcomes = gather_facts(fleet.loaded, targets, fleet.options)
    lines = [f"# From the facts of {len(hosts)} host(s) of {args.rig} (mgpu-provision slurm-conf)"]
    lines.append("GresTypes=gpu")
    failed = False
    per_host: dict[str, dict[str, str | None]] = {}
    for host in hosts:
        outcome = outcomes[host.name]
        line = None
        if outcome.status == "ok" and outcome.value is not None:
            line = node_line(host, fleet.loaded.rig_of(host), outcome.value)
            lines += node_notes(host, fleet.loaded.rig_of(host), outcome.value)
            why = "the node reported no CPU layout"
        else:
            why = f"{outcome.status}: {outcome.error}"
        if line is None:
            failed = True
            lines.append(f"# {host.name}: no line ({why})")
        else:
            lines.append(line)
        per_host[host.name] = {"line": line, "error": None if line else why}
    code = 2 if failed else 0
    if args.json:
        return print_json(code, per_host, lines=lines)
    print("\n".join(lines))
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "slurm-conf",
        help="print slurm.conf's NodeName lines and GresTypes=gpu from each box's facts",
        description=(
            "Print slurm.conf's GresTypes=gpu and NodeName lines, read from the boxes.\n\n"
            "One line per host whose rig has a `slurm` section: Sockets, CoresPerSocket, ThreadsPerCore,\n"
            "RealMemory (MemTotal less slurm.memory_headroom_percent) and Gres=gpu:<type>:<n>, for the\n"
            "controller's slurm.conf (or a file it includes). Comments above each line give slurmd -C's\n"
            "RealMemory, the SlurmdParameters a socket_layout needs and a configless node's gres.conf\n"
            "lines.\n"
            "Nothing is changed. Exit 0, or 2 when a host gave no line."
        ),
        epilog="examples:\n  mgpu-provision slurm-conf rig.yaml > /etc/slurm/nodes.conf",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    parser.set_defaults(func=run)
