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

from ..jobs.smoke import GroupReport, SmokeReport, new_run_id, run_smoke
from ..jobs.smoke_srun import run_smoke_srun
from . import options
from .output import make_console, plain_table, plural, print_json, shown


def verdict(ok: object) -> tuple[str, str]:
    return ("pass", "green") if ok else ("FAIL", "red")


def render_group(group: GroupReport, console: Console) -> None:
    nodes = plain_table(shown(f"DDP group of {group.master} (rendezvous {group.endpoint})"))
    for column in ("node", "rank", "result", "ranks ok", "seconds", "why"):
        nodes.add_column(column)
    for node in group.nodes:
        ranks_ok = sum(1 for r in node.ranks if r.get("ok"))
        nodes.add_row(
            shown(node.host),
            str(node.node_rank),
            shown(verdict(node.ok)),
            f"{ranks_ok}/{group.nproc_per_node}",
            f"{node.elapsed_s:.1f}",
            shown(node.diagnosis or ""),
        )
    console.print(nodes)
    if group.devices:
        devices = plain_table("ranks")
        for column in ("rank", "node", "backend", "device"):
            devices.add_column(column)
        for rank in group.devices:
            cells = (str(rank["rank"]), str(rank["host"]), str(rank["backend"]), device_text(rank))
            devices.add_row(*map(shown, cells))
        console.print(devices)
    data_parallel = [node for node in group.nodes if node.data_parallel]
    if data_parallel:
        table = plain_table("DataParallel (one process per node, after its ranks)")
        for column in ("node", "result", "detail"):
            table.add_column(column)
        for node in data_parallel:
            row = node.data_parallel or {}
            table.add_row(shown(node.host), shown(verdict(row.get("ok"))), shown(str(row.get("detail"))))
        console.print(table)
    loaded = [(node, gpu) for node in group.nodes for gpu in node.under_load]
    if loaded:
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
        console.print(table)
    for node in group.nodes:
        if node.transport:
            inside = ", ".join(node.transport.get("intra_node") or []) or "-"
            outside = ", ".join(node.transport.get("inter_node") or []) or "-"
            words = f"NCCL transport on {node.host}: within the node {inside}; to other nodes {outside}"
            console.print(shown(words), soft_wrap=True)
    if group.bandwidth:
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
        console.print(band)
    if group.srun is not None:
        srun = group.srun
        words = (
            f"srun job {srun.get('job_id') or '?'} on {','.join(srun.get('nodes') or [])}: exit code "
            f"{srun.get('exit_code')} after {srun.get('elapsed_s')} s"
        )
        console.print(shown(words), soft_wrap=True)
    floor = f", busbw floor {group.busbw_floor_gbps:g} GB/s" if group.busbw_floor_gbps is not None else ""
    if floor and not group.floor_judged:
        floor += " not judged (simulated nodes: Gloo on the CPU)"
    if group.backend is not None and group.backend != group.requested_backend:
        floor += f" (the rig says {group.requested_backend}: simulated nodes run Gloo)"
    line = shown(
        "Smoke ",
        verdict(group.ok),
        f": world size {group.world_size if group.world_size is not None else '-'} of "
        f"{group.expected_world_size} ({plural(group.nnodes, 'node')} x {group.nproc_per_node} processes), "
        f"{group.ranks_joined} ranks reported, backend {group.backend or '-'}{floor}",
    )
    console.print(line, soft_wrap=True)
    for problem in group.problems:
        console.print(shown("  ", ("!", "red"), f" {problem}"))


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

        if args.via == "srun":
            report = run_smoke_srun(
                fleet.loaded, fleet.hosts, fleet.targets, fleet.options, new_run_id(), on_node_done
            )
        else:
            report = run_smoke(fleet.loaded, fleet.hosts, fleet.targets, fleet.options, on_node_done)
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
            "fail. Exit 0 pass, 2 fail (a node, a missing rank, busbw below smoke.busbw_floor_gbps), 1 error."
        ),
        epilog="examples:\n  mgpu-provision smoke rig.yaml\n"
        "  mgpu-provision smoke rig.yaml --limit gpu-a,gpu-b --json\n"
        "  mgpu-provision smoke rig.yaml --via srun",
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
    parser.set_defaults(func=run)
