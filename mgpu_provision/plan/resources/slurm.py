"""Slurm's view of a box: gres.conf generated from facts, slurm.conf's node line, and the checks between them.

gres.conf is written, not autodetected by default: Debian 12's Slurm ships no `gpu_nvml.so`, so
`AutoDetect=nvml` cannot work there, and a static file from facts works everywhere (`AutoDetect=nvidia`,
24.11+, is the rig's option). Its traps, each reproduced with Slurm 22.05 or read in SchedMD's source:
- `Cores=` are Slurm's logical core indices (cores numbered socket by socket), not the OS CPU ids of
  `nvidia-smi topo -m`'s affinity column, which include SMT siblings: DeepOps wrote those
  (NVIDIA/deepops#1195), slurmctld logs "invalid GRES core specification" and the GPU loses its affinity.
- from 24.11 `Cores=` must cover whole Slurm sockets (`socket_rule`), so a GPU near one NUMA node of an
  NPS4/SNC socket gets its socket's cores, or slurm.conf counts NUMA nodes as sockets (`socket_layout`).
- lines in PCI bus order, `File=/dev/nvidia<minor>` (NVML's minor number, not its index), each with
  `NodeName=`: a gres.conf shared by NFS, an image or configless must not give one box's GPUs to all;
- a GPU count below slurm.conf's `Gres=` makes the node INVAL; a missing `File=` device stops slurmd;
- a configless slurmd reads the controller's gres.conf, never the local one.
The checks read the controller's node line (`scontrol show node -o`, gathered by the node) so that a box
with a GPU missing is reported before a restarted slurmd makes the node INVAL.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from ... import protocol
from ...catalog.cpulist import parse_cpu_list
from ...catalog.pci import pci_key
from ...facts import Facts, Gpu, Machine, SlurmNode
from ...typing_lite import NamedTuple
from ..change import Change, HostContext, check_failed
from ..files import DesiredFile, diff_file, diff_files, render

if TYPE_CHECKING:
    from ...rig import LoadedRig
    from ...rig.models import Host, Rig, Slurm

OUR_REASON = "mgpu:"  # drain reasons this tool sets start with it; an admin's drain is never ours
# `apply --drain slurm`'s own drain: lifted by that apply once the box converged, by nothing else.
APPLY_REASON = "mgpu: apply"
APPLY_DRAIN = "slurm:drain"  # the check that names a drain a rolling apply left behind
_GRES = re.compile(r"gpu:(?:(?P<type>[^:(,]+):)?(?P<count>\d+)(?P<affinity>\(S:[^)]*\))?")
_CORES = re.compile(r"^(?:NodeName=(\S+) .*?)?Name=gpu .*File=(\S+)(?: Cores=(\S+))?", re.M)
# slurmd's HealthCheckProgram deadline before 26.05's HealthCheckTimeout (slurmd.c run_script_health_check:
# `.max_wait = 60 * 1000` in 22.05.8, line 2870).
HEALTH_TIMEOUT_S = 60

Grouping = Literal["socket", "numa", "l3cache"]
Rule = Literal["none", "whole", "one"]


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """ "24.11.0" -> (24, 11, 0); None when there is no version or it is not numbers."""
    if not version:
        return None
    parts = re.findall(r"\d+", version)[:3]
    return tuple(int(p) for p in parts) if len(parts) >= 2 else None


def socket_rule(version: str | None) -> Rule:
    """How slurmctld judges `Cores=` against its sockets, by slurmd's version (SchedMD/slurm
    src/interfaces/gres.c `_foreach_rebuild_topo` / `_check_core_range_matches_sock`):
    - before 24.11: any cores (the check of b886b6e82f was merged into 24.05.5 and reverted there by
      c9c88df9d7; no 24.05 release has it);
    - 24.11 and 25.05: each socket's cores all or none ("if (set_cnt && (set_cnt != cores_per_sock))",
      24.11.0 gres.c line 3717);
    - 25.11 on: exactly one socket, or every core of the node (06fa614909 "Don't allow gres to have
      affinity to multiple sockets", f0f6916b28 "Allow all cores to be set"; 26.05.0 gres.c lines 3953-3963).
    An unknown version is judged by the strictest rule."""
    have = version_tuple(version)
    if have is None or have >= (25, 11):
        return "one"
    return "whole" if have >= (24, 11) else "none"


def refused(cores: set[int], sockets: int, per_socket: int, rule: Rule) -> str | None:
    """Slurm's words when it refuses `Cores=` (Slurm logical indices) on a node of `sockets` x `per_socket`
    cores, None when it accepts them: `_check_core_range_matches_sock` line for line."""
    if rule == "none" or not cores or len(cores) == sockets * per_socket:
        return None
    for i in range(sockets):
        first, last = i * per_socket, (i + 1) * per_socket
        count = sum(1 for c in cores if first <= c < last)
        whole = count == per_socket and (rule == "whole" or count == len(cores))
        if count and not whole:
            return (
                f"GRES core specification {ranges(cores)} doesn't match socket boundaries. "
                f"(Socket {i} is cores {first}-{last - 1})"
            )
    return None


class Layout(NamedTuple):
    """The box as one slurm.conf node line counts it: `grouping` says what Slurm calls a socket, `widen`
    whether a GPU's cores grow to whole Slurm sockets, `rule` what slurmctld accepts."""

    grouping: Grouping
    widen: bool
    rule: Rule
    name: str

    @property
    def parameter(self) -> str | None:
        """The SlurmdParameters value slurmd needs to count sockets this way (slurm.conf.5)."""
        return {"numa": "numa_node_as_socket", "l3cache": "l3cache_as_socket"}.get(self.grouping)


def chosen_layout(slurm: Slurm, state: SlurmNode | None) -> Layout:
    """The rig's `socket_layout`, `auto` resolved by slurmd's version from the facts."""
    version = state.version if state is not None else None
    rule = socket_rule(version)
    name = slurm.socket_layout
    if name == "auto":
        name = "exact" if rule == "none" and version is not None else "sockets"
    grouping: Grouping = "numa" if name == "numa" else "l3cache" if name == "l3cache" else "socket"
    return Layout(grouping, name != "exact", rule, name)


def _core_key(machine: Machine, grouping: Grouping) -> dict[tuple[int, int], int]:
    """(socket, core) -> the Slurm socket it counts in: the physical socket, or the NUMA node (L3 cache)
    of the core's first thread where known."""
    keys: dict[tuple[int, int], int] = {}
    for t in sorted(machine.threads, key=lambda t: t.cpu):
        group = {"numa": t.numa, "l3cache": t.l3}.get(grouping)
        keys.setdefault((t.socket, t.core), t.socket if group is None else group)
    return keys


def slurm_cores(machine: Machine, grouping: Grouping = "socket") -> dict[int, int]:
    """OS CPU id -> Slurm's logical core index: Slurm sockets in order, each one's cores in (socket,
    core-id) order (core ids may skip), both SMT siblings of a core on the same index."""
    keys = _core_key(machine, grouping)
    index: dict[tuple[int, int], int] = {}
    for core in sorted(keys, key=lambda c: (keys[c], c)):
        index[core] = len(index)
    return {t.cpu: index[(t.socket, t.core)] for t in machine.threads}


def layout(machine: Machine, grouping: Grouping = "socket") -> tuple[int, int, int]:
    """(Sockets, CoresPerSocket, ThreadsPerCore) as slurm.conf's node line states them."""
    keys = _core_key(machine, grouping)
    sockets = set(keys.values())
    return len(sockets), len(keys) // len(sockets), len(machine.threads) // len(keys)


def ranges(numbers: Iterable[int]) -> str:
    """1,2,3,7 -> "1-3,7" (Slurm's and the kernel's list form)."""
    out: list[str] = []
    for n in sorted(set(numbers)):
        if out and n - 1 == int(out[-1].split("-")[-1]):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


class GpuCores(NamedTuple):
    """One GPU's `Cores=` (None: none written) and, when Slurm would refuse its own cores, why."""

    cores: str | None
    refused: str | None = None


def gpu_cores(gpu: Gpu, machine: Machine, chosen: Layout) -> GpuCores:
    """The GPU's affinity as Slurm logical core indices under `chosen`, grown to whole Slurm sockets when
    it widens, and to every core where Slurm takes only one socket and they span more."""
    if not gpu.cpu_affinity:
        return GpuCores(None)
    cores = slurm_cores(machine, chosen.grouping)
    near = {cores[cpu] for cpu in parse_cpu_list(gpu.cpu_affinity) if cpu in cores}
    if not near:
        return GpuCores(None)
    sockets, per_socket, _ = layout(machine, chosen.grouping)
    if chosen.widen:
        near = {c for c in range(sockets * per_socket) if c // per_socket in {n // per_socket for n in near}}
        if refused(near, sockets, per_socket, chosen.rule):
            near = set(range(sockets * per_socket))  # no affinity rather than a node Slurm refuses
    return GpuCores(ranges(near), refused(near, sockets, per_socket, chosen.rule))


def bus_order(facts: Facts) -> list[Gpu]:
    return sorted(facts.gpus, key=lambda g: pci_key(g.pci_bus_id) or (0, 0, 0, 0))


def slurm_name(host: Host, facts: Facts) -> str:
    """The node's Slurm NodeName: what its slurmd registers, else the short hostname."""
    if facts.slurm is not None and facts.slurm.name:
        return facts.slurm.name
    return facts.host.hostname.split(".")[0] or host.name


def gres_lines(
    facts: Facts, gres_type: str, with_cores: bool, with_links: bool, chosen: Layout | None = None
) -> list[str]:
    """One `Name=gpu` line per GPU, in PCI bus order; Links= counts NVLinks to each GPU in that same order
    (-1 for itself)."""
    chosen = chosen or Layout("socket", False, "none", "exact")
    ordered = bus_order(facts)
    lines = []
    for gpu in ordered:
        minor = gpu.index if gpu.minor_number is None else gpu.minor_number
        line = f"Name=gpu Type={gres_type} File=/dev/nvidia{minor}"
        near = gpu_cores(gpu, facts.machine, chosen).cores if with_cores and facts.machine else None
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


def node_gres_lines(host: Host, rig: Rig, slurm: Slurm, facts: Facts) -> list[str]:
    """gres.conf's lines for this node, each with `NodeName=` and `AutoDetect=` (gres.conf.5 "NodeName":
    one file may serve every node; a node-specific AutoDetect is the node's own)."""
    # AutoDetect=nvidia detects no NVLinks (gres.conf.5, 24.11): Links= would fail its sanity check.
    links = slurm.links and slurm.autodetect == "off"
    chosen = chosen_layout(slurm, facts.slurm)
    lines = gres_lines(facts, slurm.type_for(rig.gpus.model), slurm.cores, links, chosen)
    prefix = f"NodeName={slurm_name(host, facts)} AutoDetect={slurm.autodetect} "
    return [prefix + line for line in lines]


def gres_conf(host: Host, rig: Rig, slurm: Slurm, facts: Facts) -> str:
    header = [
        f"# Managed by mgpu-provision (rig {host.rig}, host {host.name}): generated from this box's facts;",
        f"# edits are overwritten. AutoDetect={slurm.autodetect}: "
        + (
            "the GPUs below are what this file says."
            if slurm.autodetect == "off"
            else "checked by these lines."
        ),
    ]
    return "\n".join(header + node_gres_lines(host, rig, slurm, facts)) + "\n"


def paths(loaded: LoadedRig, host: Host) -> list[str]:
    """gres.conf and, with `health_check`, the HealthCheckProgram script: what the facts must describe."""
    rig = loaded.rig_of(host)
    if rig.slurm is None:
        return []
    return [rig.slurm.gres_conf] + ([rig.slurm.health_script] if rig.slurm.health_check else [])


def deadline_of(loaded: LoadedRig) -> float:
    """The node check's deadline, which the health script fits inside slurmd's."""
    check = loaded.spec.node_check
    return check.deadline_s if check is not None else HEALTH_TIMEOUT_S - 15.0


def health_timeout_s(state: SlurmNode | None) -> int:
    """How long slurmd lets HealthCheckProgram run: 26.05's HealthCheckTimeout when the cluster says it
    (slurm.conf.5 "HealthCheckTimeout": default 60), the fixed 60 s before."""
    said = (state.config.get("HealthCheckTimeout") or "").split()[:1] if state is not None else []
    return int(said[0]) if said and said[0].isdigit() and int(said[0]) > 0 else HEALTH_TIMEOUT_S


def scontrol_timeout_s(timeout_s: int, deadline_s: float) -> int:
    """Each of the script's two scontrol calls gets what the check's deadline leaves of slurmd's, halved,
    at least 2 s: a hanging controller ends the script, not slurmd's kill."""
    return max(2, int((timeout_s - deadline_s - 2) // 2))


def health_script(host: Host, rig: Rig, slurm: Slurm, facts: Facts, deadline_s: float) -> str:
    state = facts.slurm
    scontrol = state.scontrol if state is not None else None
    return render(
        "slurm-health.sh.j2",
        rig_name=host.rig,
        host_name=host.name,
        path=slurm.health_script,
        # slurmd passes no SLURM_CONF to the program: the slurm.conf beside gres.conf, where it exists
        # (a configless node has none and scontrol reads /run/slurm/conf's).
        slurm_conf=os.path.join(os.path.dirname(slurm.gres_conf), "slurm.conf"),
        check=slurm.health_check,
        node=slurm_name(host, facts),
        scontrol_dir=os.path.dirname(scontrol) if scontrol else None,
        timeout_s=scontrol_timeout_s(health_timeout_s(state), deadline_s),
    )


def desired(ctx: HostContext) -> list[DesiredFile]:
    """gres.conf (not on a configless node: its slurmd reads the controller's) and, with `health_check`, the
    HealthCheckProgram script that drains on a failed check."""
    host, rig, facts = ctx.host, ctx.rig, ctx.facts
    if rig.slurm is None:
        return []
    files = [] if configless_source(facts) else [GresConf(host, rig, rig.slurm, facts).file]
    if rig.slurm.health_check is not None:
        script = health_script(host, rig, rig.slurm, facts, deadline_of(ctx.loaded))
        files.append(DesiredFile(rig.slurm.health_script, script, "0755", "env"))
    return files


def real_memory(slurm: Slurm, memory_mib: int) -> int:
    """RealMemory: MemTotal less the rig's headroom (slurmctld marks a node INVAL when it registers less
    than this: node_mgr.c "Low RealMemory (reported:%lu < %.2f%% of configured:%lu)", 26.05.0 line 3515)."""
    return math.floor(memory_mib * (100 - slurm.memory_headroom_percent) / 100)


def node_line(host: Host, rig: Rig, facts: Facts) -> str | None:
    """slurm.conf's NodeName line for this box; None without the CPU layout."""
    if facts.machine is None:
        return None
    chosen = chosen_layout(rig.slurm, facts.slurm) if rig.slurm is not None else None
    sockets, cores, threads = layout(facts.machine, chosen.grouping if chosen else "socket")
    parts = [
        f"NodeName={slurm_name(host, facts)}",
        f"Sockets={sockets}",
        f"CoresPerSocket={cores}",
        f"ThreadsPerCore={threads}",
    ]
    if facts.machine.memory_mib:
        memory = real_memory(rig.slurm, facts.machine.memory_mib) if rig.slurm else facts.machine.memory_mib
        parts.append(f"RealMemory={memory}")
    if rig.slurm is not None and rig.slurm.mem_spec_limit_mib:
        parts.append(f"MemSpecLimit={rig.slurm.mem_spec_limit_mib}")
    if rig.slurm is not None and facts.gpus:
        parts.append(f"Gres=gpu:{rig.slurm.type_for(rig.gpus.model)}:{len(facts.gpus)}")
    return " ".join(parts)


def node_notes(host: Host, rig: Rig, facts: Facts) -> list[str]:
    """Comment lines slurm-conf prints above a node's line: slurmd's own figures, what the layout needs."""
    notes = []
    state = facts.slurm
    said = (state.registers or {}).get("RealMemory") if state is not None else None
    if rig.slurm is not None and facts.machine is not None and facts.machine.memory_mib:
        notes.append(
            f"# {host.name}: RealMemory is MemTotal {facts.machine.memory_mib} MiB less "
            f"{rig.slurm.memory_headroom_percent:g}%; slurmd -C says RealMemory={said or '?'}"
        )
    if rig.slurm is not None and (parameter := chosen_layout(rig.slurm, state).parameter):
        what = "NUMA nodes" if parameter == "numa_node_as_socket" else "L3 caches"
        notes.append(f"# {host.name}: sockets are {what}: slurm.conf needs SlurmdParameters={parameter}")
    if state is not None and state.configless:
        notes.append(f"# {host.name}: configless ({state.configless}): its gres.conf lines go here too:")
        notes += ["# " + line for line in node_gres_lines(host, rig, rig.slurm, facts)] if rig.slurm else []
    return notes


# --- the controller's node line, typed -----------------------------------------------------------------


class GresSeen(NamedTuple):
    """The gpu entry of the controller's Gres= for the node: its type, its count of GPUs, whether it names
    sockets."""

    type: str | None
    gpus: int  # not `count`, which would hide tuple.count
    affinity: bool


def controller_gres(value: str | None) -> GresSeen | None:
    """The gpu entry of the controller's Gres= (e.g. `gpu:rtx_3090:2(S:0-1)`), None when it has none."""
    match = _GRES.search(value or "")
    if match is None:
        return None
    return GresSeen(match["type"], int(match["count"]), match["affinity"] is not None)


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


class NodeLine(NamedTuple):
    """The fields of `scontrol show node -o` the checks read."""

    state: str
    reason: str
    gres: str | None
    sockets: int | None
    cores_per_socket: int | None
    threads_per_core: int | None
    real_memory: int | None

    @classmethod
    def of(cls, line: dict[str, str]) -> NodeLine:
        return cls(
            line.get("State", ""),
            line.get("Reason", ""),
            line.get("Gres"),
            _int(line.get("Sockets")),
            _int(line.get("CoresPerSocket")),
            _int(line.get("ThreadsPerCore")),
            _int(line.get("RealMemory")),
        )


# --- the checks, one per thing Slurm would refuse or silently lose ---------------------------------------


def affinity_unknown(slurm: Slurm, facts: Facts) -> list[Change]:
    if not slurm.cores:
        return []
    missing = [str(g.index) for g in facts.gpus if not g.cpu_affinity]
    if not missing and facts.machine is not None:
        return []
    return [
        check_failed(
            "slurm:affinity",
            f"no CPU affinity known for GPU(s) {', '.join(missing) or 'all'}: gres.conf gets no Cores= for "
            "them (set slurm.cores: false to leave Cores= out on purpose)",
        )
    ]


def cores_refused(slurm: Slurm, facts: Facts) -> list[Change]:
    """`socket_layout: exact` on a Slurm that takes whole sockets only: the node would be INVAL."""
    if not slurm.cores or facts.machine is None:
        return []
    chosen = chosen_layout(slurm, facts.slurm)
    said = [(g.index, gpu_cores(g, facts.machine, chosen).refused) for g in facts.gpus]
    return [
        check_failed(
            "slurm:affinity",
            f"GPU {index}: slurmctld {facts.slurm.version if facts.slurm else ''} would refuse gres.conf's "
            f"Cores= ({why}) and make the node INVAL: set slurm.socket_layout to sockets or numa",
        )
        for index, why in said
        if why
    ]


def _failed(when: bool, resource: str, summary: str) -> list[Change]:
    """One failed check as the list each check returns: empty when it passed."""
    return [check_failed(resource, summary)] if when else []


def missing_devices(state: SlurmNode) -> list[Change]:
    return _failed(
        bool(state.missing_devices),
        "slurm:devices",
        f"{', '.join(state.missing_devices)} missing: gres.conf's File= names it, and slurmd exits "
        "(after ~19 s of waiting) when a File= device does not exist",
    )


def gres_count(gres_type: str, facts: Facts, line: NodeLine) -> list[Change]:
    seen = controller_gres(line.gres)
    have = f"gpu:{gres_type}:{len(facts.gpus)}"
    if seen is not None and seen.gpus == len(facts.gpus) and seen.type in (None, gres_type):
        return []
    said = "no gpu" if seen is None else f"gpu:{seen.type or '(no type)'}:{seen.gpus}"
    consequence = (
        "slurmd would make the node INVAL (count reported lower than configured)"
        if seen is not None and seen.gpus > len(facts.gpus)
        else "the GPUs Slurm schedules are not the box's"
    )
    return [
        check_failed(
            "slurm:gres", f"slurm.conf says Gres={said}, the box has {have}: {consequence}", said, have
        )
    ]


def affinity_lost(slurm: Slurm, line: NodeLine, gres_conf_current: bool) -> list[Change]:
    seen = controller_gres(line.gres)
    if not slurm.cores or seen is None or seen.affinity or not gres_conf_current:
        return []
    return [
        check_failed(
            "slurm:affinity",
            f"the controller holds Gres={line.gres} without (S:...): slurmctld refused gres.conf's Cores= "
            "(compare slurm.conf's Sockets, CoresPerSocket and ThreadsPerCore with the box's; after a "
            "Cores= change slurmctld must be restarted)",
        )
    ]


def layout_differs(slurm: Slurm, facts: Facts, line: NodeLine) -> list[Change]:
    if facts.machine is None:
        return []
    chosen = chosen_layout(slurm, facts.slurm)
    box = layout(facts.machine, chosen.grouping)
    held = (line.sockets, line.cores_per_socket, line.threads_per_core)
    names = ("Sockets", "CoresPerSocket", "ThreadsPerCore")
    differs = [f"{k}={h} (box: {b})" for k, h, b in zip(names, held, box, strict=True) if h not in (None, b)]
    if not differs:
        return []
    how = f" with {chosen.name} as sockets (SlurmdParameters={chosen.parameter})" if chosen.parameter else ""
    return [
        check_failed(
            "slurm:layout",
            f"slurm.conf's node line says {', '.join(differs)}{how}: Cores= are counted in its layout",
        )
    ]


def numa_parameter_missing(slurm: Slurm, state: SlurmNode) -> list[Change]:
    parameter = chosen_layout(slurm, state).parameter
    held = state.config.get("SlurmdParameters")
    if parameter is None or held is None or parameter in held.split(","):
        return []
    return [
        check_failed(
            "slurm:layout",
            f"socket_layout {chosen_layout(slurm, state).name} needs SlurmdParameters={parameter}, and the "
            f"cluster's SlurmdParameters={held} lacks it: slurmd registers physical sockets",
        )
    ]


def memory_low(state: SlurmNode, line: NodeLine) -> list[Change]:
    said = _int((state.registers or {}).get("RealMemory"))
    if said is None or line.real_memory is None or said >= line.real_memory:
        return []
    return [
        check_failed(
            "slurm:memory",
            f"slurm.conf says RealMemory={line.real_memory}, slurmd -C finds {said}: slurmctld makes the "
            "node INVAL (Low RealMemory); lower it (slurm-conf prints it less slurm.memory_headroom_percent)",
            str(line.real_memory),
            str(said),
        )
    ]


def autodetect_unsupported(slurm: Slurm, state: SlurmNode) -> list[Change]:
    have = version_tuple(state.version)
    return _failed(
        slurm.autodetect == "nvidia" and have is not None and have < (24, 11),
        "slurm:autodetect",
        f"slurmd {state.version} has no AutoDetect=nvidia (gres.conf.5: added in Slurm 24.11): set "
        "slurm.autodetect: off",
    )


def health_program(slurm: Slurm, state: SlurmNode, deadline_s: float) -> list[Change]:
    """The cluster runs the script, and gives it time for the check and its scontrol calls."""
    if slurm.health_check is None:
        return []
    found = []
    program = state.config.get("HealthCheckProgram")
    if program in ("", "(null)"):  # a different program may be a site's wrapper (NHC) that calls ours
        found.append(
            check_failed(
                "slurm:health",
                f"slurm.conf sets no HealthCheckProgram: slurmd never runs {slurm.health_script} (set "
                f"HealthCheckProgram={slurm.health_script} and HealthCheckInterval)",
                program,
                slurm.health_script,
            )
        )
    timeout = health_timeout_s(state)
    if deadline_s + 2 * scontrol_timeout_s(timeout, deadline_s) + 2 > timeout:
        found.append(
            check_failed(
                "slurm:health",
                f"slurmd ends HealthCheckProgram after {timeout} s (HealthCheckTimeout), too soon for "
                f"node_check.deadline_s {deadline_s:g} and two scontrol calls: lower the deadline",
            )
        )
    return found


def node_state(line: NodeLine) -> list[Change]:
    if "INVAL" in line.state:
        return [check_failed("slurm:state", f"node is {line.state}: {line.reason or 'no reason given'}")]
    if "DRAIN" in line.state and line.reason.startswith(APPLY_REASON):
        return [
            check_failed(
                APPLY_DRAIN,
                f"node is {line.state} by apply --drain slurm ({line.reason}): apply resumes it once the box "
                "converged, and this one has not (yet)",
            )
        ]
    if "DRAIN" in line.state and line.reason.startswith(OUR_REASON):
        return [check_failed("slurm:state", f"node is {line.state} by this tool: {line.reason}")]
    return []


def checks(
    host: Host, rig: Rig, slurm: Slurm, facts: Facts, gres_conf_current: bool, deadline_s: float = 45.0
) -> list[Change]:
    """What Slurm would refuse or silently lose, said before a restart makes it so; the controller's
    affinity is judged only once gres.conf is as generated (`gres_conf_current`)."""
    found = affinity_unknown(slurm, facts) + cores_refused(slurm, facts)
    state = facts.slurm
    if state is None:
        return found
    found += missing_devices(state) + autodetect_unsupported(slurm, state)
    if state.controller is None:
        name = slurm_name(host, facts)
        other = f" (Slurm's NodeName {name}, the rig's host {host.name})" if name != host.name else ""
        return [
            *found,
            check_failed("slurm:node", f"the controller has no line for this node{other}: {state.error}"),
        ]
    line = NodeLine.of(state.controller)
    found += gres_count(slurm.type_for(rig.gpus.model), facts, line)
    if not any(c.resource == "slurm:gres" for c in found):
        found += affinity_lost(slurm, line, gres_conf_current)
    found += layout_differs(slurm, facts, line) + numa_parameter_missing(slurm, state)
    found += memory_low(state, line) + health_program(slurm, state, deadline_s)
    return found + node_state(line)


def _cores_of(content: str | None) -> dict[str, str | None]:
    """gres.conf's Cores= per File=, for telling whether a rewrite changes them."""
    return {m[2]: m[3] for m in _CORES.finditer(content or "")}


def configless_step(host: Host, rig: Rig, slurm: Slurm, facts: Facts, how: str) -> Change:
    lines = node_gres_lines(host, rig, slurm, facts)
    return Change(
        "slurm:configless",
        "manual",
        f"slurmd reads the controller's gres.conf ({how}): the local {slurm.gres_conf} would be ignored; put "
        f"these lines in the controller's gres.conf and restart slurmctld and slurmd: {' | '.join(lines)}",
        None,
        "\n".join(lines),
    )


def configless_source(facts: Facts) -> str | None:
    """How the node's slurmd gets the controller's files, None where it reads local ones."""
    return facts.slurm.configless if facts.slurm is not None else None


class GresConf:
    """The gres.conf a node should have, and what writing it takes."""

    def __init__(self, host: Host, rig: Rig, slurm: Slurm, facts: Facts) -> None:
        self.slurm = slurm
        self.file = DesiredFile(slurm.gres_conf, gres_conf(host, rig, slurm, facts), "0644", "env")
        self.current = facts.file(slurm.gres_conf)

    def changes(self) -> list[Change]:
        """The write, slurmd's restart, and slurmctld's when the Cores= change (a person's step)."""
        written = diff_file(self.file, self.current)
        if written is None:
            return []
        command = list(self.slurm.restart_command)
        changes = [
            written,
            Change(
                "slurmd",
                "update",
                f"restart slurmd ({' '.join(command)}): it reads {self.file.path} only when it starts",
                None,
                "restarted",
                agent_step=protocol.restart_step(command),
                phase="env",
            ),
        ]
        before = _cores_of(self.current.content if self.current is not None and self.current.exists else None)
        if before and before != _cores_of(self.file.content):
            changes.append(
                Change(
                    "slurmctld",
                    "manual",
                    "restart slurmctld once this apply is done: gres.conf's Cores= change, and "
                    '"a restart of the slurmctld is needed for changes to the Cores option to take effect" '
                    "(gres.conf.5)",
                    None,
                    "restarted",
                )
            )
        return changes


def diff(ctx: HostContext) -> list[Change]:
    """gres.conf (and a slurmd restart when it changes; a manual slurmctld restart when its Cores= do) plus
    the checks against the controller. A configless node gets the lines to put on the controller."""
    host, rig, facts = ctx.host, ctx.rig, ctx.facts
    if rig.slurm is None:
        return []
    deadline_s = deadline_of(ctx.loaded)
    configless = configless_source(facts)
    scripts = [w for w in desired(ctx) if w.path != rig.slurm.gres_conf]
    if configless:
        changes = checks(host, rig, rig.slurm, facts, True, deadline_s) + diff_files(scripts, facts)
        return [*changes, configless_step(host, rig, rig.slurm, facts, configless)]
    gres = GresConf(host, rig, rig.slurm, facts).changes()
    return checks(host, rig, rig.slurm, facts, not gres, deadline_s) + diff_files(scripts, facts) + gres


def srun_options(slurm: Slurm, nproc_per_node: int) -> list[str]:
    """What a step of this tool (smoke --via srun; README's training command) asks Slurm for: the GPUs
    (without them a ConstrainDevices=yes cluster shows the step none: cgroup.conf.5), CPUs for every rank
    of its one task per node, the rig's partition, account and reservation, and the node to itself."""
    srun = slurm.srun
    options = [f"--gres=gpu:{nproc_per_node}", f"--cpus-per-task={srun.cpus_per_rank * nproc_per_node}"]
    options += ["--exclusive"] if srun.exclusive else []
    for flag, value in (
        ("partition", srun.partition),
        ("account", srun.account),
        ("reservation", srun.reservation),
    ):
        if value:
            options.append(f"--{flag}={value}")
    return options
