"""`mgpu-provision facts RIG`: what each box is — GPUs, driver, links — read in one agent call per host.

The first command a user runs against a fleet, and the one that shows whether the tool sees a box the way
`nvidia-smi` does: a GPU table per host and the link matrix in `nvidia-smi topo -m` form. Unreachable hosts
are listed with the reason and make the exit code 2; the others are shown regardless. Every value is the
node's word (GPU names, kernel, error texts): the views print it through `output.shown`. They import rich
inside their functions, so that `--json` never loads it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from ..catalog.topology import format_topology, gpu_matrix
from ..facts import Facts, Gpu, PcieLink
from ..fleet.pool import HostOutcome
from ..jobs.plan import gather_facts
from . import options, paths
from .box_picture import box_svg, wanted_of, write_pictures
from .output import make_console, print_json, shown, waiting_for

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table


def as_json(outcomes: dict[str, HostOutcome[Facts]]) -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for name, outcome in outcomes.items():
        if outcome.status == "ok" and outcome.value is not None:
            hosts[name] = {"status": "ok", "facts": outcome.value.model_dump(mode="json")}
        else:
            hosts[name] = {"status": outcome.status, "error": outcome.error}
    return {"hosts": hosts}


def _pcie(link: PcieLink) -> str:
    def one(gen: int | None, width: int | None) -> str:
        return f"Gen{gen or '?'} x{width or '?'}"

    return f"{one(link.gen, link.width)} / {one(link.max_gen, link.max_width)}"


def _persistence(gpu: Gpu) -> str:
    return {True: "on", False: "off", None: "?"}[gpu.persistence_mode]


def gpu_table(facts: Facts) -> Table:
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for column in ("GPU", "Name", "Memory", "Bus id", "PCIe cur / max", "Persistence"):
        table.add_column(column, justify="right" if column in ("GPU", "Memory") else "left")
    for gpu in facts.gpus:
        cells = (
            str(gpu.index),
            gpu.name,
            f"{gpu.memory_mib} MiB",
            gpu.pci_bus_id,
            _pcie(gpu.pcie),
            _persistence(gpu),
        )
        table.add_row(*map(shown, cells))
    return table


def driver_line(facts: Facts) -> str:
    driver = facts.driver
    if driver.nvml != "ok":
        line = f"driver: {driver.message or 'NVML unavailable'} ({driver.nvml})"
        known = [f"installed {driver.installed}"] if driver.installed else []
        known += ["reboot required"] if driver.reboot_required else []
        known += ["nouveau loaded"] if driver.nouveau else []
        return "; ".join([line, ", ".join(known)]) if known else line
    parts = [f"driver {driver.version}", f"CUDA {driver.cuda}"]
    if driver.loaded and driver.loaded != driver.version:
        parts.append(f"loaded module {driver.loaded}")
    if driver.reboot_required:
        parts.append("reboot required")
    if facts.nvswitch:
        parts.append("NVSwitch")
    return ", ".join(parts)


RUNTIME_STATES = {True: "nvidia runtime configured", False: "no nvidia runtime", None: "reads CDI"}


def containers_lines(facts: Facts) -> list[str]:
    """The toolkit and each CDI spec the node read (a rig with a `containers` section asks for them)."""
    found = facts.containers
    if found is None:
        return []
    toolkit = f"NVIDIA Container Toolkit {found.toolkit}" if found.toolkit else "no NVIDIA Container Toolkit"
    lines = [toolkit + (" (refresh service enabled)" if found.refresh else "")]
    for spec in found.specs:
        if spec.error:
            lines.append(f"CDI {spec.path}: {spec.error}")
            continue
        missing = sum(1 for p in spec.paths if p.exists is False)
        gone = f", {missing} path(s) missing" if missing else ""
        lines.append(f"CDI {spec.path}: {spec.kind}, {len(spec.devices)} devices{gone}")
    for name, runtime in found.runtimes.items():
        state = RUNTIME_STATES[runtime.configured]
        lines.append(f"{name}: {state if runtime.installed else 'not installed'}")
    return lines


def link_matrix(facts: Facts) -> str:
    """The GPU-to-GPU matrix as `nvidia-smi topo -m` prints it (cells the agent could not place: `?`)."""

    def cell(i: int, j: int) -> str:
        pair = facts.pair(i, j)
        return pair.cell if pair is not None else "?"

    # Facts carry no CPU/NUMA affinity, so the matrix is printed without those trailing columns.
    count = len(facts.gpus) + len(facts.lost_gpus)  # a lost GPU keeps its index: its cells read `?`
    return format_topology(gpu_matrix(count, cell)._replace(titles=()))


def health_lines(facts: Facts) -> list[str]:
    """Lost GPUs, and what the node could not read (once per value); the verdicts are `plan`'s."""
    lines = [f"GPU {gpu.index} is lost ({gpu.error})" for gpu in facts.lost_gpus]
    if facts.health is not None and facts.health.not_checked:
        lines.append("not checked: " + "; ".join(facts.health.not_checked))
    return lines


def host_view(name: str, facts: Facts) -> RenderableType:
    from rich.console import Group

    info = facts.host
    title = shown(
        (name, "bold cyan"),
        f"  {info.hostname} · {info.os} · kernel {info.kernel} · python {info.python}",
        (" · simulated" if info.simulated else "", "yellow"),
    )
    parts: list[RenderableType] = [title, shown(driver_line(facts))]
    if facts.gpus:
        parts += [gpu_table(facts), shown(link_matrix(facts).rstrip("\n"))]
    else:
        parts.append(shown("no GPUs"))
    parts += [shown(line, style="yellow") for line in health_lines(facts)]
    parts += [shown(line) for line in containers_lines(facts)]
    return Group(*parts)


def render(outcomes: dict[str, HostOutcome[Facts]], console: Console) -> None:
    for name, outcome in outcomes.items():
        if outcome.status == "ok" and outcome.value is not None:
            console.print(host_view(name, outcome.value))
        else:
            console.print(shown((name, "bold red"), f"  {outcome.status}: {outcome.error}"))
        console.print()


def run(args: argparse.Namespace) -> int:
    fleet = options.prepare(args)
    with waiting_for("reading facts", [t.name for t in fleet.targets]) as host_done:
        run = dataclasses.replace(fleet.options, on_host_done=host_done)
        outcomes = gather_facts(fleet.loaded, fleet.targets, run)
    code = 0 if all(o.status == "ok" for o in outcomes.values()) else 2
    if args.svg is not None:
        loaded = fleet.loaded
        write_pictures(args.svg, {
            name: box_svg(name, o.value, wanted_of(loaded, loaded.host(name)), error=o.error)
            for name, o in outcomes.items()
        })
    if args.json:
        return print_json(code, **as_json(outcomes))
    render(outcomes, make_console())
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "facts",
        help="show what each box is: GPUs, driver, links (one SSH command per host)",
        description=(
            "Show what each box is: GPUs, driver, NVLink/PCIe link matrix, PCIe links, torch.\n\n"
            "One SSH command per host; nothing is changed. Exit 0 when every host answered, 2 when some\n"
            "were unreachable or failed, 1 on errors."
        ),
        epilog="examples:\n  mgpu-provision facts rig.yaml\n"
        "  mgpu-provision facts rig.yaml --limit gpu-a --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_fleet_arguments(parser)
    options.add_via_argument(parser)
    parser.add_argument(
        "--svg",
        type=paths.output_file,
        metavar="FILE",
        help="also draw each box (GPUs, links as the rig says and as they are) as SVG: FILE for one host, "
        "FILE-HOST.svg beside it for several",
    )
    parser.set_defaults(func=run)
