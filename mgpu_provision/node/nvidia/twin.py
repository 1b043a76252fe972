"""Reading a simulated node's twin file and the overlay of what installs and reboots changed on it.

The twin (docs/ARCHITECTURE.md "Simulated nodes", `schemas/twin.schema.json`) is a public contract written by
people, so it is read leniently (YAML or JSON, optional fields filled with stable defaults) and checked with
messages that name the field. The twin itself is never written: driver installs and reboots land in an
overlay in the node's state folder (`state_file`), written atomically like every other file the agent writes.
The overlay lives with the node, not beside the twin: a twin is often a file of a checkout (examples/twins/),
shared by several simulated nodes, and each of them has a state of its own.
"""

from __future__ import annotations

import json
import os

from ...catalog.topology import TopologyParseError, TopoMatrix, parse_topology, read_topology_text
from ...typing_lite import TYPE_CHECKING
from ..core.digest import sha256_hex
from ..core.errors import AgentFailure
from ..host.machine import simulated_machine
from .miniyaml import MiniYamlError, loads
from .twin_health import read_gpu_health, read_kernel, read_sxids, read_uptime

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

DEFAULT_OS_RELEASE = {
    "id": "ubuntu",
    "version_id": "22.04",
    "like": ["debian"],
    "pretty_name": "Ubuntu 22.04 LTS",
}
DEFAULT_PCIE = {"gen": 4, "width": 16, "max_gen": 4, "max_width": 16}
# files.state_dir's default: where a verb whose request names no state folder (smoke, reclaim) looks.
DEFAULT_STATE_DIR = "/var/lib/mgpu-provision"


def state_file(twin_path: str, state_dir: Optional[str] = None) -> str:
    """Where the overlay of the twin `twin_path` lives in the state folder `state_dir`: one file per twin
    (a folder may hold the state of several rehearsed twins), named after the twin and its absolute path."""
    path = os.path.abspath(twin_path)
    stem = os.path.splitext(os.path.basename(path))[0]
    digest = sha256_hex(path.encode("utf-8"))[:12]
    return os.path.join(state_dir or DEFAULT_STATE_DIR, "twin-state", f"{stem}-{digest}.json")


class Twin:
    """A twin file read, checked and completed with defaults; `state` is its overlay (mutable)."""

    def __init__(self, path: str, state_dir: Optional[str] = None) -> None:
        self.path = os.path.abspath(path)
        data = _read_document(self.path)
        self.driver: Dict[str, Any] = _mapping(data.get("driver") or {}, "driver")
        self.gpus: List[Dict[str, Any]] = [
            _complete_gpu(self.path, index, gpu) for index, gpu in enumerate(_list(data.get("gpus"), "gpus"))
        ]
        self.board: Optional[Dict[str, Any]] = data.get("board")
        self.nvswitch = bool(data.get("nvswitch", False))
        self.fabricmanager: Optional[str] = data.get("fabricmanager")
        self.imex: Optional[str] = data.get("imex")
        self.imex_channels = int(data.get("imex_channels", 1))
        # What `nvidia-imex-ctl -N -j` says while the simulated daemon runs: its JSON as NVIDIA writes it.
        domain = data.get("imex_domain") or {"status": "UP"}
        self.imex_domain: Dict[str, Any] = _mapping(domain, "imex_domain")
        self.nvidia_repository = bool(data.get("nvidia_repository", True))
        self.boot_id: Optional[str] = data.get("boot_id")
        self.nouveau = bool(data.get("nouveau", False))
        self.services: Dict[str, Any] = _mapping(data.get("services") or {}, "services")
        # Whose NVIDIA packages the simulated box has (it decides the driver source); Ubuntu unless told.
        # All of it comes from the twin, the name too: the machine's own os-release never mixes in.
        # `os_release: null` or one without an `id` is a box without an os-release file.
        given = data.get("os_release", DEFAULT_OS_RELEASE)
        release = _mapping(given or {}, "os_release")
        os_id = None if release.get("id") is None else str(release["id"])
        version = None if release.get("version_id") is None else str(release["version_id"])
        self.os_release: Dict[str, object] = {
            "os_id": os_id,
            "os_version_id": version,
            "os_like": [str(x) for x in _list(release.get("like"), "os_release.like")],
            "os": str(release.get("pretty_name") or f"{os_id or 'unknown'} {version or ''}".strip()),
        }
        drivers = _list(data.get("available_drivers"), "available_drivers")
        self.available_drivers: List[str] = [str(v) for v in drivers]
        self.topology = self._topology(data)
        self.machine = _machine(self.path, data.get("machine"))
        self.kernel = read_kernel(self.path, data.get("kernel"))
        self.sxids = read_sxids(self.path, data.get("sxid"))
        self.uptime_s = read_uptime(self.path, data.get("uptime_s"))
        self.nvlink_down = {
            (_int(d, "gpu", "nvlink_down[]"), _int(d, "link", "nvlink_down[]"))
            for d in _list(data.get("nvlink_down"), "nvlink_down")
        }
        self.processes: List[Dict[str, Any]] = [
            _mapping(p, "processes[]") for p in _list(data.get("processes"), "processes")
        ]
        # The NVIDIA Container Toolkit (`containers.toolkit`: its installed version) and where the driver's
        # stand-in files live (`containers.driver_root`): installs keep its libraries at the driver's version.
        containers = _mapping(data.get("containers") or {}, "containers")
        toolkit = containers.get("toolkit")
        self.toolkit: Optional[str] = None if toolkit is None else str(toolkit)
        root = containers.get("driver_root")
        self.driver_root: Optional[str] = None if root is None else str(root)
        self.state_path = state_file(self.path, state_dir)
        self.state: Dict[str, Any] = _read_state(self.state_path)

    def _topology(self, data: Dict[str, Any]) -> Optional[TopoMatrix]:
        text = data.get("topology")
        where = "topology"
        if text is None and data.get("topology_file"):
            where = os.path.join(os.path.dirname(self.path), str(data["topology_file"]))
            try:
                text = read_topology_text(where)
            except OSError as exc:
                raise _bad(self.path, f"topology_file: cannot read {where}: {exc.strerror}") from None
        if text is None:
            return None
        try:
            matrix = parse_topology(str(text))
        except TopologyParseError as exc:
            raise _bad(self.path, f"{where}: {exc}") from None
        if matrix.gpu_count != len(self.gpus):
            raise _bad(self.path, f"{where} has {matrix.gpu_count} GPUs, gpus lists {len(self.gpus)}")
        return matrix

    # Effective values: the overlay wins over the twin.
    def driver_version(self) -> Optional[str]:
        return self.state.get("driver_version", self.driver.get("version"))

    def loaded_version(self) -> Optional[str]:
        return self.state.get("loaded", self.driver.get("loaded", self.driver.get("version")))

    def toolkit_version(self) -> Optional[str]:
        return self.state.get("container_toolkit", self.toolkit)

    def fabricmanager_version(self) -> Optional[str]:
        return self.state.get("fabricmanager", self.fabricmanager)

    def service(self, unit: str) -> Dict[str, bool]:
        """`{"enabled", "running"}` of a simulated unit; Fabric Manager runs unless the twin says not."""
        default = {"enabled": True, "running": True} if unit == "nvidia-fabricmanager" else {}
        base = dict({"enabled": False, "running": False}, **default)
        given = _mapping(self.services.get(unit) or {}, f"services.{unit}")
        base.update({key: value for key, value in given.items() if key in ("enabled", "running")})
        base.update(self.state.get("services", {}).get(unit, {}))
        return {"enabled": bool(base["enabled"]), "running": bool(base["running"])}

    def exec_start(self, unit: str) -> Optional[str]:
        """The unit's effective ExecStart the twin gives (`services.<unit>.exec_start`), as apply left it."""
        given = _mapping(self.services.get(unit) or {}, f"services.{unit}").get("exec_start")
        found = self.state.get("exec_start", {}).get(unit, given)
        return None if found is None else str(found)

    def set_exec_start(self, unit: str, command: str) -> None:
        self.state.setdefault("exec_start", {})[unit] = command

    def set_service(self, unit: str, **values: bool) -> None:
        self.state.setdefault("services", {}).setdefault(unit, {}).update(values)

    def restarted(self, unit: str) -> None:
        """A running unit started again: counted in the overlay (`restarts`), which tests read."""
        restarts = self.state.setdefault("restarts", {})
        restarts[unit] = int(restarts.get(unit, 0)) + 1

    def persistence(self, gpu: int) -> bool:
        override = self.state.get("persistence", {}).get(str(gpu))
        return bool(self.gpus[gpu].get("persistence", False) if override is None else override)

    def save_state(self) -> None:
        from ..core.atomic import atomic_write  # only simulated changes write: facts never pays for it

        text = json.dumps(self.state, indent=2, sort_keys=True) + "\n"
        atomic_write(self.state_path, text.encode("utf-8"), 0o644)


def _read_document(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise AgentFailure("twin", f"cannot read twin file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else loads(text)
    except (ValueError, MiniYamlError) as exc:
        raise _bad(path, str(exc)) from None
    if not isinstance(data, dict):
        raise _bad(path, "the document must be a mapping (driver, gpus, topology, ...)")
    return data


def _read_state(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise AgentFailure("twin", f"cannot read simulated state {path}: {exc}") from None
    return state if isinstance(state, dict) else {}


def _complete_gpu(path: str, index: int, raw: Any) -> Dict[str, Any]:
    where = f"gpus[{index}]"
    gpu = dict(_mapping(raw, where))
    if not isinstance(gpu.get("name"), str):
        raise _bad(path, f"{where}.name must be a string (the exact NVML name)")
    _int(gpu, "memory_mib", where)
    gpu.setdefault("uuid", stable_uuid(path, index, gpu["name"]))
    gpu.setdefault("pci_bus_id", default_bus_id(index))
    gpu.setdefault("minor", index)
    _int(gpu, "minor", where)
    if gpu.get("cpu_affinity") is not None and not isinstance(gpu["cpu_affinity"], str):
        raise _bad(path, f'{where}.cpu_affinity must be a CPU list string such as "0-3,8-11"')
    gpu["pcie"] = dict(DEFAULT_PCIE, **_mapping(gpu.get("pcie") or {}, f"{where}.pcie"))
    gpu["health"] = read_gpu_health(path, f"{where}.health", gpu.get("health"))
    hang = gpu.setdefault("nvml_hang_s", 0)
    if not isinstance(hang, (int, float)) or isinstance(hang, bool) or hang < 0:
        raise _bad(path, f"{where}.nvml_hang_s must be a number of seconds (0 or more)")
    return gpu


def _machine(path: str, raw: Any) -> Optional[Dict[str, Any]]:
    """The twin's `machine` (sockets, cores_per_socket, threads_per_core, memory_mib, optional
    numa_per_socket); None: the real's."""
    if raw is None:
        return None
    given = _mapping(raw, "machine")
    sizes = [_int(given, key, "machine") for key in _MACHINE_KEYS]
    if "numa_per_socket" in given:
        sizes.append(_int(given, "numa_per_socket", "machine"))
    if any(size < 1 for size in sizes):
        keys = ", ".join(_MACHINE_KEYS)
        raise _bad(path, "machine: " + keys + " (and numa_per_socket) must each be 1 or more")
    return simulated_machine(*sizes)


_MACHINE_KEYS = ("sockets", "cores_per_socket", "threads_per_core", "memory_mib")


def stable_uuid(path: str, index: int, name: str) -> str:
    """A GPU UUID that stays the same for one twin file, so UUID-based settings converge."""
    digest = sha256_hex(f"{path}\0{index}\0{name}".encode())
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def default_bus_id(index: int) -> str:
    """Bus ids in ascending order of index, as NVML enumerates GPUs by PCI bus id."""
    return f"{index // 15:08X}:{(index % 15 + 1) * 16 + 1:02X}:00.0"


def _bad(path: str, message: str) -> AgentFailure:
    return AgentFailure("twin", f"twin {path}: {message}")


def _mapping(value: Any, where: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise AgentFailure("twin", f"twin: {where} must be a mapping")
    return value


def _list(value: Any, where: str) -> List[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise AgentFailure("twin", f"twin: {where} must be a list")
    return value


def _int(item: Dict[str, Any], key: str, where: str) -> int:
    value = item.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise AgentFailure("twin", f"twin: {where}.{key} must be an integer")
    return value


def link_plan(twin: Twin) -> Dict[Tuple[int, int], Tuple[Optional[int], bool]]:
    """Every simulated NVLink as (gpu, link) -> (remote GPU or None for a switch, active).

    On a bridged or meshed box the matrix's `NV<n>` between GPU i and j becomes n links on each side, given
    out in order of the peer's index; a down link takes its other end down too, as a loose bridge does.
    On an NVSwitch box each GPU has as many links as its largest `NV<n>`, all ending at switches.
    """
    matrix = twin.topology
    if matrix is None:
        return {}
    count = len(twin.gpus)
    links: Dict[Tuple[int, int], Tuple[Optional[int], bool]] = {}
    if twin.nvswitch:
        for i in range(count):
            width = max((matrix.nvlinks(i, j) for j in range(count) if j != i), default=0)
            for link in range(width):
                links[(i, link)] = (None, (i, link) not in twin.nvlink_down)
        return links
    blocks: Dict[Tuple[int, int], List[int]] = {}
    for i in range(count):
        next_link = 0
        for j in range(count):
            if j == i:
                continue
            width = matrix.nvlinks(i, j)
            blocks[(i, j)] = list(range(next_link, next_link + width))
            next_link += width
    for (i, j), block in blocks.items():
        for ordinal, link in enumerate(block):
            peer_link = blocks[(j, i)][ordinal]
            down = (i, link) in twin.nvlink_down or (j, peer_link) in twin.nvlink_down
            links[(i, link)] = (j, not down)
    return links
