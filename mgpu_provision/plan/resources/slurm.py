"""Slurm's view of a box: gres.conf generated from facts, slurm.conf's node line, and the checks between them.

gres.conf is written, not autodetected: Debian 12's Slurm ships no `gpu_nvml.so`, so `AutoDetect=nvml` cannot
work there, and a static file from facts works everywhere. Its traps, each reproduced with Slurm 22.05:
- `Cores=` are Slurm's logical core indices (cores numbered socket by socket), not the OS CPU ids of
  `nvidia-smi topo -m`'s affinity column, which include SMT siblings: DeepOps wrote those
  (NVIDIA/deepops#1195), slurmctld logs "invalid GRES core specification" and the GPU loses its affinity.
- lines in PCI bus order, `File=/dev/nvidia<minor>` (NVML's minor number, not its index);
- a GPU count below slurm.conf's `Gres=` makes the node INVAL; a missing `File=` device stops slurmd.
The checks read the controller's node line (`scontrol show node -o`, gathered by the node) so that a box
with a GPU missing is reported before a restarted slurmd makes the node INVAL.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ... import protocol
from ...catalog.cpulist import parse_cpu_list
from ...catalog.pci import pci_key
from ...facts import Facts, Gpu, Machine
from ...rig.models import Host, Rig, Slurm
from ..change import Change, HostContext, check_failed
from ..files import DesiredFile, diff_file, diff_files, render

if TYPE_CHECKING:
    from ...rig import LoadedRig

OUR_REASON = "mgpu:"  # drain reasons this tool sets start with it; an admin's drain is never ours
# `apply --drain slurm`'s own drain: lifted by that apply once the box converged, by nothing else.
APPLY_REASON = "mgpu: apply"
APPLY_DRAIN = "slurm:drain"  # the check that names a drain a rolling apply left behind
_GRES = re.compile(r"gpu:(?:(?P<type>[^:(,]+):)?(?P<count>\d+)(?P<affinity>\(S:[^)]*\))?")


def slurm_cores(machine: Machine) -> dict[int, int]:
    """OS CPU id -> Slurm's logical core index: sockets in order, each socket's cores in core-id order
    (core ids may skip), both SMT siblings of a core on the same index."""
    sockets = sorted({t.socket for t in machine.threads})
    index: dict[tuple[int, int], int] = {}
    for socket in sockets:
        for core in sorted({t.core for t in machine.threads if t.socket == socket}):
            index[(socket, core)] = len(index)
    return {t.cpu: index[(t.socket, t.core)] for t in machine.threads}


def layout(machine: Machine) -> tuple[int, int, int]:
    """(Sockets, CoresPerSocket, ThreadsPerCore) as slurm.conf's node line states them."""
    sockets = {t.socket for t in machine.threads}
    cores = {(t.socket, t.core) for t in machine.threads}
    return len(sockets), len(cores) // len(sockets), len(machine.threads) // len(cores)


def ranges(numbers: set[int]) -> str:
    """1,2,3,7 -> "1-3,7" (Slurm's and the kernel's list form)."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and n - 1 == int(out[-1].split("-")[-1]):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def gpu_cores(gpu: Gpu, cores: dict[int, int]) -> str | None:
    """The GPU's affinity as Slurm logical core indices; None when the affinity or the CPUs are unknown."""
    if not gpu.cpu_affinity:
        return None
    indices = {cores[cpu] for cpu in parse_cpu_list(gpu.cpu_affinity) if cpu in cores}
    return ranges(indices) or None


def bus_order(facts: Facts) -> list[Gpu]:
    return sorted(facts.gpus, key=lambda g: pci_key(g.pci_bus_id) or (0, 0, 0, 0))


def gres_lines(facts: Facts, gres_type: str, with_cores: bool, with_links: bool) -> list[str]:
    """One `Name=gpu` line per GPU, in PCI bus order; Links= counts NVLinks to each GPU in that same order
    (-1 for itself)."""
    cores = slurm_cores(facts.machine) if with_cores and facts.machine else {}
    ordered = bus_order(facts)
    lines = []
    for gpu in ordered:
        minor = gpu.index if gpu.minor_number is None else gpu.minor_number
        line = f"Name=gpu Type={gres_type} File=/dev/nvidia{minor}"
        near = gpu_cores(gpu, cores) if with_cores else None
        if near:
            line += f" Cores={near}"
        if with_links and len(ordered) > 1:
            counts = [-1 if o is gpu else _links(facts, gpu, o) for o in ordered]
            line += " Links=" + ",".join(str(c) for c in counts)
        lines.append(line)
    return lines


def _links(facts: Facts, a: Gpu, b: Gpu) -> int:
    pair = facts.pair(a.index, b.index)
    return 0 if pair is None else pair.nvlinks


def gres_conf(host: Host, rig: Rig, slurm: Slurm, facts: Facts) -> str:
    lines = gres_lines(facts, slurm.type_for(rig.gpus.model), slurm.cores, slurm.links)
    header = [
        f"# Managed by mgpu-provision (rig {host.rig}, host {host.name}): generated from this box's facts;",
        "# edits are overwritten. AutoDetect=off: the GPUs below are what this file says.",
        "AutoDetect=off",
    ]
    return "\n".join(header + lines) + "\n"


def paths(loaded: LoadedRig, host: Host) -> list[str]:
    """gres.conf and, with `health_check`, the HealthCheckProgram script: what the facts must describe."""
    rig = loaded.rig_of(host)
    if rig.slurm is None:
        return []
    return [rig.slurm.gres_conf] + ([rig.slurm.health_script] if rig.slurm.health_check else [])


def desired(ctx: HostContext) -> list[DesiredFile]:
    """gres.conf and, with `health_check`, the HealthCheckProgram script that drains on a failed check."""
    host, rig, facts = ctx.host, ctx.rig, ctx.facts
    if rig.slurm is None:
        return []
    files = [DesiredFile(rig.slurm.gres_conf, gres_conf(host, rig, rig.slurm, facts), "0644", "env")]
    if rig.slurm.health_check is not None:
        script = render(
            "slurm-health.sh.j2",
            rig_name=host.rig,
            host_name=host.name,
            path=rig.slurm.health_script,
            # scontrol reads slurm.conf beside gres.conf; slurmd passes no SLURM_CONF to the program.
            slurm_conf=os.path.join(os.path.dirname(rig.slurm.gres_conf), "slurm.conf"),
            check=rig.slurm.health_check,
        )
        files.append(DesiredFile(rig.slurm.health_script, script, "0755", "env"))
    return files


def node_line(host: Host, rig: Rig, facts: Facts) -> str | None:
    """slurm.conf's NodeName line for this box; None without the CPU layout."""
    if facts.machine is None:
        return None
    sockets, cores, threads = layout(facts.machine)
    parts = [
        f"NodeName={facts.host.hostname.split('.')[0]}",
        f"Sockets={sockets}",
        f"CoresPerSocket={cores}",
        f"ThreadsPerCore={threads}",
    ]
    if facts.machine.memory_mib:
        parts.append(f"RealMemory={facts.machine.memory_mib}")
    if rig.slurm is not None and facts.gpus:
        parts.append(f"Gres=gpu:{rig.slurm.type_for(rig.gpus.model)}:{len(facts.gpus)}")
    return " ".join(parts)


@dataclass(frozen=True)
class GresSeen:
    type: str | None
    count: int
    affinity: bool


def controller_gres(value: str | None) -> GresSeen | None:
    """The gpu entry of the controller's Gres= (e.g. `gpu:rtx_3090:2(S:0-1)`), None when it has none."""
    match = _GRES.search(value or "")
    if match is None:
        return None
    return GresSeen(match["type"], int(match["count"]), match["affinity"] is not None)


def diff(ctx: HostContext) -> list[Change]:
    """gres.conf (and a slurmd restart when it changes) plus the checks against the controller."""
    rig, facts = ctx.rig, ctx.facts
    wanted = desired(ctx)
    if not wanted or rig.slurm is None:
        return []
    want = wanted[0]
    written = diff_file(want, facts.file(want.path))
    changes = checks(rig, rig.slurm, facts, gres_conf_current=written is None)
    changes += diff_files(wanted[1:], facts)
    if written is not None:
        command = list(rig.slurm.restart_command)
        changes += [
            written,
            Change(
                "slurmd",
                "update",
                f"restart slurmd ({' '.join(command)}): it reads {want.path} only when it starts",
                None,
                "restarted",
                agent_step=protocol.restart_step(command),
                phase="env",
            ),
        ]
    return changes


def checks(rig: Rig, slurm: Slurm, facts: Facts, gres_conf_current: bool) -> list[Change]:
    """What Slurm would refuse or silently lose, said before a restart makes it so; the controller's
    affinity is judged only once gres.conf is as generated (`gres_conf_current`)."""
    found: list[Change] = []
    gres_type = slurm.type_for(rig.gpus.model)
    if slurm.cores:
        missing = [str(g.index) for g in facts.gpus if not g.cpu_affinity]
        if missing or facts.machine is None:
            found.append(
                check_failed(
                    "slurm:affinity",
                    f"no CPU affinity known for GPU(s) {', '.join(missing) or 'all'}: gres.conf gets no "
                    "Cores= for them (set slurm.cores: false to leave Cores= out on purpose)",
                )
            )
    state = facts.slurm
    if state is None:
        return found
    if state.missing_devices:
        found.append(
            check_failed(
                "slurm:devices",
                f"{', '.join(state.missing_devices)} missing: gres.conf's File= names it, and slurmd exits "
                "(after ~19 s of waiting) when a File= device does not exist",
            )
        )
    if state.controller is None:
        found.append(check_failed("slurm:node", f"the controller has no line for this node: {state.error}"))
        return found
    line = state.controller
    seen = controller_gres(line.get("Gres"))
    have = f"gpu:{gres_type}:{len(facts.gpus)}"
    if seen is None or seen.count != len(facts.gpus) or (seen.type not in (None, gres_type)):
        said = "no gpu" if seen is None else f"gpu:{seen.type or '(no type)'}:{seen.count}"
        consequence = (
            "slurmd would make the node INVAL (count reported lower than configured)"
            if seen is not None and seen.count > len(facts.gpus)
            else "the GPUs Slurm schedules are not the box's"
        )
        found.append(
            check_failed(
                "slurm:gres", f"slurm.conf says Gres={said}, the box has {have}: {consequence}", said, have
            )
        )
    elif slurm.cores and not seen.affinity and gres_conf_current:
        found.append(
            check_failed(
                "slurm:affinity",
                f"the controller holds Gres={line.get('Gres')} without (S:...): slurmctld refused "
                "gres.conf's Cores= (compare slurm.conf's Sockets, CoresPerSocket and ThreadsPerCore with "
                "the box's)",
            )
        )
    if facts.machine is not None:
        box = dict(
            zip(("Sockets", "CoresPerSocket", "ThreadsPerCore"), map(str, layout(facts.machine)), strict=True)
        )
        differs = [f"{k}={line.get(k)} (box: {v})" for k, v in box.items() if line.get(k) not in (None, v)]
        if differs:
            found.append(
                check_failed(
                    "slurm:layout",
                    f"slurm.conf's node line says {', '.join(differs)}: Cores= are counted in its layout",
                )
            )
    node_state = line.get("State", "")
    reason = line.get("Reason", "")
    if "INVAL" in node_state:
        found.append(check_failed("slurm:state", f"node is {node_state}: {reason or 'no reason given'}"))
    elif "DRAIN" in node_state and reason.startswith(APPLY_REASON):
        found.append(
            check_failed(
                APPLY_DRAIN,
                f"node is {node_state} by apply --drain slurm ({reason}): apply resumes it once the box "
                "converged, and this one has not (yet)",
            )
        )
    elif "DRAIN" in node_state and reason.startswith(OUR_REASON):
        found.append(check_failed("slurm:state", f"node is {node_state} by this tool: {reason}"))
    return found
