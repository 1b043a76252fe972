"""The `facts` verb: everything the control side needs to plan one host, gathered in one call.

It walks the backend interface the same way for real and simulated nodes; an NVML that cannot start is a
fact (status plus a plain explanation), never an error of the verb. The output is plain JSON that must
validate against `mgpu_provision.facts.Facts` (the control side checks it on arrival).
"""

from __future__ import annotations

import os

from ... import __version__
from ...catalog.pci import same_pci
from ...typing_lite import TYPE_CHECKING
from ..core import archive, system
from ..host import files, hostenv, machine, procs, torch_probe
from ..nvidia.backend import (
    NVLINK_MAX_LINKS,
    P2P_NVLINK,
    P2P_READ,
    P2P_STATUS_NAMES,
    REMOTE_GPU,
    REMOTE_IBMNPU,
    REMOTE_SWITCH,
    TOPOLOGY_LEVELS,
    Backend,
    GpuLost,
    NoSuchLink,
    NvmlUnavailable,
)
from . import reclaim
from .health import health_facts

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

FACTS_SCHEMA_VERSION = 1
_MIB = 1024 * 1024
_REMOTE_NAMES = {REMOTE_GPU: "gpu", REMOTE_IBMNPU: "ibmnpu", REMOTE_SWITCH: "switch"}


def collect(args: Dict[str, Any], backend: Backend) -> Dict[str, Any]:
    facts: Dict[str, Any] = {
        "schema_version": FACTS_SCHEMA_VERSION,
        "agent_version": __version__,
        "agent_digest": archive.archive_digest(),
        "host": system.host_info(backend.simulated, backend.boot_id(), backend.distribution()),
        "board": backend.board(),
        "fabricmanager": backend.fabric_manager(),
        "persistenced": backend.persistence_daemon(),
        "imex": backend.imex(),
        "driver_mirror": backend.check_mirror(args["driver_repo"], args["driver_packages"])
        if args["driver_repo"]
        else None,
        "nvidia_repository_missing": (
            backend.nvidia_repository_missing() if args["nvidia_repository"] else None
        ),
        "units": {str(unit): backend.unit_state(str(unit)) for unit in args["units"]},
        "sli": files.read_sli(args["xorg_paths"]),
        "xorg_layouts": files.server_layouts(args["xorg_layout_paths"]),
        "files": [files.describe_file(p, bool(args["include_content"])) for p in args["files"]],
        "torch": torch_probe.probe_torch(args["python"]) if args["python"] else None,
        "interfaces": hostenv.interfaces(),
        "cpu": hostenv.cpu(),
        # Every CPU's place is only for gres.conf's Cores= and slurm.conf's node line: some 500-800 /sys
        # reads on a 256-thread box, made only when the rig has a `slurm` section.
        "machine": (backend.machine() or machine.machine()) if args["slurm"] else None,
    }
    facts.update(nvidia_facts(backend, args["state_dir"]))
    if args["containers"] is not None:
        facts["containers"] = container_facts(args["containers"], backend)
    if args["slurm"]:
        facts["slurm"] = machine.slurm(facts["host"]["hostname"], [g["minor_number"] for g in facts["gpus"]])
    return facts


def container_facts(runtimes: List[str], backend: Backend) -> Dict[str, Any]:
    """The toolkit (NVIDIA's: through the backend), the CDI specs and the runtimes' configs (the box's)."""
    from . import containers as cdi

    return {
        "toolkit": backend.container_toolkit(),
        "refresh": bool(backend.unit_state(cdi.REFRESH_UNIT)["enabled"]),
        "specs": cdi.read_specs(),
        "runtimes": cdi.read_runtimes(runtimes),
    }


def nvidia_facts(backend: Backend, state_dir: Optional[str] = None) -> Dict[str, Any]:
    """driver, gpus, pairs, nvswitch and processes, as far as NVML can answer."""
    installed, loaded = backend.installed_version(), backend.loaded_version()
    driver: Dict[str, Any] = {
        "installed": installed,
        "unheld": backend.unheld_driver_packages(installed) if installed else [],
        "loaded": loaded,
        # Nothing loaded counts too: nouveau bound, or no reboot since the install.
        "reboot_required": bool(installed and installed != loaded),
        "kernel_module": backend.kernel_module(),
        "installed_module": backend.installed_module() if installed else None,
        "nouveau": backend.nouveau_loaded(),
    }
    try:
        backend.open()
    except NvmlUnavailable as exc:
        driver.update(nvml=exc.status, message=exc.message)
        empty: Dict[str, Any] = {"gpus": [], "lost_gpus": [], "pairs": [], "nvswitch": False, "processes": []}
        # Xids and the kernel module's readiness need no NVML, and often explain why it failed.
        return dict(empty, driver=driver, health=health_facts(backend, [], []))
    try:
        cuda = backend.cuda_driver_version()
        driver.update(
            nvml="ok",
            version=backend.driver_version(),
            cuda=None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
        )
        gpus, lost = read_gpus(backend)
        holders = reclaim.gpu_holders(backend, [gpu["index"] for gpu in gpus])
        pairs = [pair_facts(backend, a, b) for n, a in enumerate(gpus) for b in gpus[n + 1 :]]
        health = health_facts(backend, gpus, lost, state_dir)
    finally:
        backend.close()
    nvswitch = any(link["remote_type"] == "switch" for gpu in gpus for link in gpu["nvlinks"])
    return {
        "driver": driver,
        "gpus": gpus,
        "lost_gpus": lost,
        "health": health,
        "pairs": pairs,
        "nvswitch": nvswitch,
        "processes": processes(holders),
    }


def processes(holders: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """GPU memory holders described from /proc, with the same classification reclaim acts on."""
    lookup = procs.proc_lookup()
    btime, hz = procs.boot_time(), os.sysconf("SC_CLK_TCK")
    described = []
    for holder in holders:
        info = lookup(holder["pid"])
        mps_server = reclaim.mps_server_of(holder, holders, lookup)
        if info is None:
            fields = {"pid": holder["pid"], "gpu": holder["gpu"], "used_mib": holder["used_mib"]}
            described.append(dict(fields, alive=False, mps_server=mps_server))
        else:
            why = reclaim.classify(info, lookup)
            described.append(reclaim.describe(holder, info, why, btime, hz, mps_server))
            described[-1]["slurm_job"] = machine.slurm_job_of(info.pid)
    return described


def read_gpus(backend: Backend) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(facts of the GPUs NVML can read, the lost ones): one GPU fallen off the bus must not hide the rest."""
    gpus, lost = [], []
    for index in range(backend.device_count()):
        try:
            gpus.append(gpu_facts(backend, index))
        except GpuLost as exc:
            lost.append({"index": index, "pci_bus_id": _lost_bus_id(backend, index), "error": str(exc)})
    return gpus, lost


def _lost_bus_id(backend: Backend, index: int) -> Optional[str]:
    try:
        return backend.pci_bus_id(index)
    except GpuLost:
        return None


def gpu_facts(backend: Backend, index: int) -> Dict[str, Any]:
    return {
        "index": index,
        "name": backend.name(index),
        "uuid": backend.uuid(index),
        "pci_bus_id": backend.pci_bus_id(index),
        "memory_mib": backend.memory_total_bytes(index) // _MIB,
        "minor_number": backend.minor_number(index),
        "cpu_affinity": backend.cpu_affinity(index),
        "persistence_mode": backend.persistence_mode(index),
        "pcie": backend.pcie_link(index),
        "nvlinks": nvlink_facts(backend, index),
        "fabric": _fabric(backend, index),
    }


def _fabric(backend: Backend, index: int) -> Optional[Dict[str, Any]]:
    clique = backend.fabric_clique(index)
    return None if clique is None else {"clique_id": clique[0], "cluster_uuid": clique[1]}


def nvlink_facts(backend: Backend, index: int) -> List[Dict[str, Any]]:
    links = []
    # NVML_NVLINK_MAX_LINKS bounds every architecture; indices this GPU lacks answer NoSuchLink.
    for link in range(NVLINK_MAX_LINKS):
        try:
            active = backend.nvlink_active(index, link)
        except NoSuchLink:
            continue
        remote_type: Optional[str] = None
        remote_bus: Optional[str] = None
        if active:
            code = backend.nvlink_remote_type(index, link)
            remote_type = None if code is None else _REMOTE_NAMES.get(code, "unknown")
            remote_bus = backend.nvlink_remote_bus_id(index, link)
        links.append(
            {"link": link, "active": active, "remote_type": remote_type, "remote_pci_bus_id": remote_bus}
        )
    return links


def pair_links(a: Dict[str, Any], b: Dict[str, Any]) -> int:
    """Active NVLinks joining GPUs a and b: direct links seen from both ends, or links to the switches."""

    def active(gpu: Dict[str, Any], remote_type: str, remote_bus: Optional[str] = None) -> int:
        return sum(
            1
            for link in gpu["nvlinks"]
            if link["active"]
            and link["remote_type"] == remote_type
            and (remote_bus is None or same_pci(link["remote_pci_bus_id"], remote_bus))
        )

    switched = min(active(a, "switch"), active(b, "switch"))
    if switched:
        return switched
    return min(active(a, "gpu", b["pci_bus_id"]), active(b, "gpu", a["pci_bus_id"]))


def pair_facts(backend: Backend, ga: Dict[str, Any], gb: Dict[str, Any]) -> Dict[str, Any]:
    a, b = ga["index"], gb["index"]
    level = backend.common_ancestor(a, b)
    return {
        "a": a,
        "b": b,
        "pcie": None if level is None else TOPOLOGY_LEVELS.get(level),
        "nvlinks": pair_links(ga, gb),
        "p2p_read": _p2p(backend.p2p_status(a, b, P2P_READ)),
        "p2p_nvlink": _p2p(backend.p2p_status(a, b, P2P_NVLINK)),
    }


def _p2p(status: Optional[int]) -> Optional[str]:
    return None if status is None else P2P_STATUS_NAMES.get(status, "U")
