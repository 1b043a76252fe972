"""`mgpu-provision smoke RIG`: prove with a real multi-node DDP run that the fleet can train together.

Every selected node starts its part through its installed launcher at once (`mgpu_provision/jobs/smoke.py`);
this module only wires the options, shows progress while the run lasts, and prints per node pass/fail,
where each rank ran (backend, device), the world size and the all_reduce bandwidth table, or `--json`.
Diagnoses, rank errors, GPU names and notices quote the nodes: they are printed through `output.shown`.
Exit 0: every DDP group passed; 2: a node failed, a rank never joined or busbw is below the rig's floor;
1: an error (rig file, selection).
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import ProvisionError
from ..jobs.smoke import STOPPED, GroupReport, SmokeOptions, SmokeReport, new_run_id, run_smoke
from ..jobs.smoke_isolate import DEFAULT_BUDGET_S
from ..jobs.smoke_srun import run_smoke_srun
from . import options
from .output import make_console, plain_table, plural, print_json, shown


def verdict(ok: object) -> tuple[str, str]:
    return ("pass", "green") if ok else ("FAIL", "red")


def render_group(group: GroupReport, console: Console) -> None:
    for part in (nodes_table, devices_table, data_parallel_table, load_table):
        table = part(group)
        if table is not None:
            console.print(table)
    for line in transport_lines(group):
        console.print(shown(line), soft_wrap=True)
    band = bandwidth_table(group)
    if band is not None:
        console.print(band)
    isolation = isolation_table(group)
    if isolation is not None:
        console.print(isolation)
    for said in (srun_line(group), baseline_line(group), burn_in_line(group)):
        if said is not None:
            console.print(shown(said), soft_wrap=True)
    console.print(verdict_line(group), soft_wrap=True)
    for problem in group.problems:
        console.print(shown("  ", ("!", "red"), f" {problem}"))


def nodes_table(group: GroupReport) -> Table:
    nodes = plain_table(shown(f"DDP group of {group.master} (rendezvous {group.endpoint})"))
    for column in ("node", "rank", "result", "ranks ok", "seconds", "why"):
        nodes.add_column(column)
    for node in group.nodes:
        ranks_ok = sum(1 for r in node.ranks if r.get("ok"))
        nodes.add_row(
            shown(node.host),
            str(node.node_rank),
            shown(("stopped", "yellow") if node.kind == STOPPED else verdict(node.ok)),
            f"{ranks_ok}/{group.nproc_per_node}",
            f"{node.elapsed_s:.1f}",
            shown(node.diagnosis or ""),
        )
    return nodes


def devices_table(group: GroupReport) -> Table | None:
    if not group.devices:
        return None
    devices = plain_table("ranks")
    for column in ("rank", "node", "backend", "device"):
        devices.add_column(column)
    for rank in group.devices:
        cells = (str(rank["rank"]), str(rank["host"]), str(rank["backend"]), device_text(rank))
        devices.add_row(*map(shown, cells))
    return devices


def data_parallel_table(group: GroupReport) -> Table | None:
    data_parallel = [node for node in group.nodes if node.data_parallel]
    if not data_parallel:
        return None
    table = plain_table("DataParallel (one process per node, after its ranks)")
    for column in ("node", "result", "detail"):
        table.add_column(column)
    for node in data_parallel:
        row = node.data_parallel or {}
        table.add_row(shown(node.host), shown(verdict(row.get("ok"))), shown(str(row.get("detail"))))
    return table


def load_table(group: GroupReport) -> Table | None:
    loaded = [(node, gpu) for node in group.nodes for gpu in node.under_load]
    if not loaded:
        return None
    table = plain_table("GPUs while the ranks ran")
    for column in ("node", "GPU", "PCIe trained", "PCIe max", "clock events seen", "samples"):
        table.add_column(column)
    for node, gpu in loaded:
        table.add_row(
            shown(node.host),
            str(gpu["index"]),
            link_text(gpu.get("pcie_gen"), gpu.get("pcie_width")),
            link_text(gpu.get("pcie_max_gen"), gpu.get("pcie_max_width")),
            shown(", ".join(gpu.get("throttle") or []) or "none"),
            str(gpu.get("samples")),
        )
    return table


def transport_lines(group: GroupReport) -> list[str]:
    lines = []
    for node in group.nodes:
        if node.transport:
            inside = ", ".join(node.transport.get("intra_node") or []) or "-"
            outside = ", ".join(node.transport.get("inter_node") or []) or "-"
            lines.append(f"NCCL transport on {node.host}: within the node {inside}; to other nodes {outside}")
    return lines


def bandwidth_table(group: GroupReport) -> Table | None:
    if not group.bandwidth:
        return None
    band = plain_table(f"all_reduce over {group.world_size} ranks (nccl-tests busbw)")
    for column in ("size MiB", "time us", "algbw GB/s", "busbw GB/s"):
        band.add_column(column, justify="right")
    for row in group.bandwidth:
        band.add_row(
            f"{row['size_mib']:g}",
            f"{row['time_us']:.0f}",
            f"{row['algbw_gbps']:.3f}",
            f"{row['busbw_gbps']:.3f}",
        )
    return band


def isolation_table(group: GroupReport) -> Table | None:
    """The runs that searched for the bad node, round by round."""
    rounds = (group.isolation or {}).get("rounds") or []
    if not rounds:
        return None
    table = plain_table(f"runs that named the bad node ({(group.isolation or {}).get('mode')})")
    for column in ("round", "nodes", "result", "busbw GB/s", "why"):
        table.add_column(column)
    for number, trials in enumerate(rounds, 1):
        for trial in trials:
            busbw = trial.get("busbw_gbps")
            table.add_row(
                str(number),
                shown(", ".join(trial["nodes"])),
                shown(verdict(trial["ok"])),
                "-" if busbw is None else f"{busbw:.3f}",
                shown(trial.get("why") or ""),
            )
    return table


def srun_line(group: GroupReport) -> str | None:
    if group.srun is None:
        return None
    srun = group.srun
    return (
        f"srun job {srun.get('job_id') or '?'} on {','.join(srun.get('nodes') or [])}: exit code "
        f"{srun.get('exit_code')} after {srun.get('elapsed_s')} s"
    )


def baseline_line(group: GroupReport) -> str | None:
    if group.baseline is None:
        return None
    base = group.baseline
    return (
        f"baseline: {base['busbw_gbps']:g} GB/s, recorded {base['age_s'] / 3600:.1f} h ago on {base['host']} "
        f"by run {base.get('run_id')}"
    )


def burn_in_line(group: GroupReport) -> str | None:
    if group.burn_in is None:
        return None
    spread = group.burn_in
    return (
        f"burn-in: {spread['runs']} runs, busbw {spread['min_gbps']:g} to {spread['max_gbps']:g} GB/s "
        f"(mean {spread['mean_gbps']:g}, spread {spread['spread']:.1%})"
    )


def verdict_line(group: GroupReport) -> Text:
    floor = f", busbw floor {group.busbw_floor_gbps:g} GB/s" if group.busbw_floor_gbps is not None else ""
    if floor and not group.floor_judged:
        floor += " not judged (simulated nodes: Gloo on the CPU)"
    if group.backend is not None and group.backend != group.requested_backend:
        floor += f" (the rig says {group.requested_backend}: simulated nodes run Gloo)"
    return shown(
        "Smoke ",
        verdict(group.ok),
        f": world size {group.world_size if group.world_size is not None else '-'} of "
        f"{group.expected_world_size} ({plural(group.nnodes, 'node')} x {group.nproc_per_node} processes), "
        f"{group.ranks_joined} ranks reported, backend {group.backend or '-'}{floor}",
    )


def link_text(gen: int | None, width: int | None) -> str:
    return f"gen {gen if gen is not None else '?'} x{width if width is not None else '?'}"


def device_text(rank: dict[str, Any]) -> str:
    gpu = rank.get("gpu")
    if not gpu:
        return str(rank.get("device") or "-") + (" (simulated node)" if rank.get("simulated") else "")
    uuid = f", {gpu['uuid']}" if gpu.get("uuid") else ""
    return f"{rank.get('device')}: {gpu.get('name')}{uuid}"


def render_human(report: SmokeReport, console: Console) -> None:
    for notice in report.notices:
        console.print(shown(("note:", "yellow"), f" {notice}"))
    for group in report.groups:
        render_group(group, console)


def run(args: argparse.Namespace) -> int:
    fleet = options.prepare(args)
    console = make_console(sys.stderr if args.json else sys.stdout)
    done: list[str] = []
    lock = threading.Lock()
    total = len(fleet.targets)
    timeout = fleet.loaded.spec.smoke.timeout_s
    label = f"DDP smoke on {total} node(s), up to {timeout:g} s"
    with console.status(label) as status:

        def on_node_done(host: str, ok: bool) -> None:
            with lock:
                done.append(f"{host} {'pass' if ok else 'FAIL'}")
                status.update(shown(f"{label} - {len(done)}/{total} done: {', '.join(done)}"))

        if args.via == "srun" and (args.pairs or args.burn_in):
            raise ProvisionError("--pairs and --burn-in run over SSH only: leave out --via srun")
        if args.via == "srun":
            report = run_smoke_srun(
                fleet.loaded, fleet.hosts, fleet.targets, fleet.options, new_run_id(), on_node_done
            )
        else:
            how = SmokeOptions(
                pairs=args.pairs, isolate=not args.no_isolate, budget_s=args.isolate_budget,
                burn_in_s=args.burn_in,
            )  # fmt: skip
            report = run_smoke(fleet.loaded, fleet.hosts, fleet.targets, fleet.options, on_node_done, how)
    code = 0 if report.ok else 2
    if args.json:
        hosts = {
            node.host: {"ok": node.ok, "group": group.master, "node_rank": node.node_rank}
            for group in report.groups
            for node in group.nodes
        }
        return print_json(code, hosts, **report.as_dict())
    render_human(report, console)
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "smoke",
        help="run a small multi-node DDP job on the fleet and report pass/fail and all_reduce bandwidth",
        description=(
            "Run a small DDP job on every chosen node at once and report pass/fail and bandwidth.\n\n"
            "torchrun starts it with the rig file's rendezvous (ddp), python, timeout, batch size and env.\n"
            "It checks that every rank joins, an all_reduce is exact, one DDP step leaves identical\n"
            "parameters, and measures all_reduce algbw/busbw; then, alone on each CUDA node once its ranks\n"
            "have ended, that DataParallel works over its GPUs. Every process it starts is ended, pass or\n"
            "fail. A group that fails is run again in halves until the bad node is named (--pairs: in\n"
            "pairs). A passing group's busbw is recorded on its nodes; the next run fails when it drops by\n"
            "more than smoke.baseline_drop. Exit 0 pass, 2 fail (a node, a missing rank, busbw below\n"
            "smoke.busbw_floor_gbps or the baseline, a bad node named), 1 error."
        ),
        epilog="examples:\n  mgpu-provision smoke rig.yaml\n"
        "  mgpu-provision smoke rig.yaml --limit gpu-a,gpu-b --json\n"
        "  mgpu-provision smoke rig.yaml --via srun\n"
        "  mgpu-provision smoke rig.yaml --pairs --burn-in 30m",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    parser.add_argument(
        "--via",
        choices=("ssh", "srun"),
        default="ssh",
        help="ssh (default): start every node's part over SSH; srun: one Slurm step per DDP group, started "
        "by one of its nodes (rigs with a `slurm` section; a failing rank ends the step on every node)",
    )
    parser.add_argument(
        "--pairs",
        action="store_true",
        help="also run every node in a pair and each member of a bad pair with a node of a good one, and "
        "name every bad node (acceptance of new nodes; --via ssh)",
    )
    parser.add_argument(
        "--no-isolate",
        action="store_true",
        help="when a group fails, do not bisect it to name the bad node",
    )
    parser.add_argument(
        "--isolate-budget",
        type=seconds,
        default=DEFAULT_BUDGET_S,
        metavar="DURATION",
        help=f"start no run that names a bad node past this long (default {DEFAULT_BUDGET_S:g}s)",
    )
    parser.add_argument(
        "--burn-in",
        type=seconds,
        metavar="DURATION",
        help="repeat the whole smoke this long (30m, 2h) and record the spread of busbw in the baseline",
    )
    parser.set_defaults(func=run)


def seconds(value: str) -> float:
    """A duration for --burn-in and --isolate-budget: a number of seconds, or with s, m or h."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    number, unit = (value[:-1], value[-1]) if value[-1:] in units else (value, "s")
    try:
        found = float(number) * units[unit]
    except ValueError:
        found = -1.0
    if not found > 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration such as 90, 90s, 15m or 2h")
    return found
