"""The `facts` verb: everything the control side needs to plan one host, gathered in one call.

It walks the backend interface the same way for real and simulated nodes; an NVML that cannot start is a
fact (status plus a plain explanation), never an error of the verb. The output is plain JSON that must
validate against `mgpu_provision.facts.Facts` (the control side checks it on arrival).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from .. import __version__
from . import files, hostenv, procs, reclaim, system, torch_probe
from .backend import (
    NVLINK_MAX_LINKS,
    P2P_NVLINK,
    P2P_READ,
    P2P_STATUS_NAMES,
    REMOTE_GPU,
    REMOTE_IBMNPU,
    REMOTE_SWITCH,
    TOPOLOGY_LEVELS,
    Backend,
    NoSuchLink,
    NvmlUnavailable,
)

FACTS_SCHEMA_VERSION = 1
_MIB = 1024 * 1024
_REMOTE_NAMES = {REMOTE_GPU: "gpu", REMOTE_IBMNPU: "ibmnpu", REMOTE_SWITCH: "switch"}


def collect(args: Dict[str, Any], backend: Backend) -> Dict[str, Any]:
    facts: Dict[str, Any] = {
        "schema_version": FACTS_SCHEMA_VERSION,
        "agent_version": __version__,
        "host": system.host_info(backend.simulated, backend.boot_id()),
        "board": backend.board(),
        "fabricmanager": backend.fabric_manager(),
        "sli": files.read_sli(args.get("xorg_paths") or []),
        "xorg_layouts": files.server_layouts(args.get("xorg_layout_paths") or []),
        "files": [
            files.describe_file(p, bool(args.get("include_content"))) for p in args.get("files") or ()
        ],
        "torch": torch_probe.probe_torch(args["python"]) if args.get("python") else None,
        "interfaces": hostenv.interfaces(),
        "cpu": hostenv.cpu(),
    }
    facts.update(nvidia_facts(backend))
    return facts


def nvidia_facts(backend: Backend) -> Dict[str, Any]:
    """driver, gpus, pairs, nvswitch and processes, as far as NVML can answer."""
    installed, loaded = backend.installed_version(), backend.loaded_version()
    driver: Dict[str, Any] = {
        "installed": installed,
        "loaded": loaded,
        "reboot_required": bool(installed and loaded and installed != loaded),
    }
    try:
        backend.open()
    except NvmlUnavailable as exc:
        driver.update(nvml=exc.status, message=exc.message)
        return {"driver": driver, "gpus": [], "pairs": [], "nvswitch": False, "processes": []}
    try:
        cuda = backend.cuda_driver_version()
        driver.update(
            nvml="ok",
            version=backend.driver_version(),
            cuda=None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
        )
        gpus = [gpu_facts(backend, index) for index in range(backend.device_count())]
        holders = [
            # Rounded up, as reclaim does: any memory held must not read as none.
            {"pid": pid, "gpu": index, "used_mib": None if used is None else -(-used // _MIB)}
            for index in range(len(gpus))
            for pid, used in backend.processes(index)
        ]
        pairs = [pair_facts(backend, gpus, a, b) for a in range(len(gpus)) for b in range(a + 1, len(gpus))]
    finally:
        backend.close()
    nvswitch = any(link["remote_type"] == "switch" for gpu in gpus for link in gpu["nvlinks"])
    return {
        "driver": driver,
        "gpus": gpus,
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
        if info is None:
            described.append(dict(holder, alive=False))
        else:
            described.append(reclaim.describe(holder, info, reclaim.classify(info, lookup), btime, hz))
    return described


def gpu_facts(backend: Backend, index: int) -> Dict[str, Any]:
    return {
        "index": index,
        "name": backend.name(index),
        "uuid": backend.uuid(index),
        "pci_bus_id": backend.pci_bus_id(index),
        "memory_mib": backend.memory_total_bytes(index) // _MIB,
        "persistence_mode": backend.persistence_mode(index),
        "pcie": backend.pcie_link(index),
        "nvlinks": nvlink_facts(backend, index),
    }


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


def pair_links(gpus: List[Dict[str, Any]], a: int, b: int) -> int:
    """Active NVLinks joining GPU a and b: direct links seen from both ends, or links to the switches."""

    def active(gpu: Dict[str, Any], remote_type: str, remote_bus: Optional[str] = None) -> int:
        return sum(
            1
            for link in gpu["nvlinks"]
            if link["active"]
            and link["remote_type"] == remote_type
            and (remote_bus is None or _same_bus(link["remote_pci_bus_id"], remote_bus))
        )

    switched = min(active(gpus[a], "switch"), active(gpus[b], "switch"))
    if switched:
        return switched
    return min(active(gpus[a], "gpu", gpus[b]["pci_bus_id"]), active(gpus[b], "gpu", gpus[a]["pci_bus_id"]))


def _same_bus(x: Optional[str], y: str) -> bool:
    # NVML pads the domain to 8 digits in some calls and 4 in others; compare the bus/device/function part.
    return x is not None and x.upper().split(":", 1)[-1] == y.upper().split(":", 1)[-1]


def pair_facts(backend: Backend, gpus: List[Dict[str, Any]], a: int, b: int) -> Dict[str, Any]:
    level = backend.common_ancestor(a, b)
    return {
        "a": a,
        "b": b,
        "pcie": None if level is None else TOPOLOGY_LEVELS.get(level),
        "nvlinks": pair_links(gpus, a, b),
        "p2p_read": _p2p(backend.p2p_status(a, b, P2P_READ)),
        "p2p_nvlink": _p2p(backend.p2p_status(a, b, P2P_NVLINK)),
    }


def _p2p(status: Optional[int]) -> Optional[str]:
    return None if status is None else P2P_STATUS_NAMES.get(status, "U")
