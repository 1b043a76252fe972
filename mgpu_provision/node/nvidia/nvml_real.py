"""The real NVIDIA layer: NVML through the bundled pynvml, packages through apt/dnf, reboots through systemd.

NVML's traps are handled here: nvmlInit's failures are facts to report, not crashes;
the NVLink loop ends on NotSupported (no NVLink) or InvalidArgument (past this GPU's links); struct bus ids
are bytes; pynvml's P2P read index constant is a tuple, so the interface passes plain ints.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess

from ... import protocol
from ...catalog.pci import sysfs_name
from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.errors import AgentFailure
from ..host import procs
from ..packages import driver, imex, persistenced, runfile, services, toolkit
from .backend import Backend, GpuLost, NoSuchLink, NvmlUnavailable, nvml_message
from .nvml_health import RealHealth

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
_LIB_VERSION = re.compile(r"libnvidia-ml\.so\.([0-9]+\.[0-9]+(?:\.[0-9]+)?)$")


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _LostAware:
    """pynvml with `NVMLError_GpuIsLost` raised as `GpuLost`, so facts report one lost GPU and read the
    others. Only the `nvml*` functions are wrapped: the `NVMLError_*` classes pass through for `except`."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not name.startswith("nvml") or not callable(value):
            return value
        lost = self._module.NVMLError_GpuIsLost

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except lost as exc:
                raise GpuLost(str(exc)) from None

        return call


class RealBackend(RealHealth, Backend):
    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: Dict[int, Any] = {}

    # --- outside NVML ---
    def loaded_version(self) -> Optional[str]:
        return system.parse_nvrm_version(system.read_text("/proc/driver/nvidia/version"))

    def installed_version(self) -> Optional[str]:
        return driver.installed_version() or _library_version()

    def fabric_manager(self) -> Optional[Dict[str, Any]]:
        version = services.fabric_manager_version()
        state = services.state(protocol.FABRICMANAGER_UNIT)
        if version is None and state["service"] == "absent":
            return None
        return {"version": version, **state}

    def persistence_daemon(self) -> Dict[str, Any]:
        state = services.state(protocol.PERSISTENCED_UNIT)
        if state["service"] in ("absent", "unknown"):
            return state
        return dict(state, exec_start=persistenced.effective_exec_start())

    def nvidia_repository_missing(self) -> Optional[str]:
        from ..packages import common

        return common.nvidia_repository_missing(system.os_release(system.os_release_text()))

    def check_mirror(self, repo: Dict[str, str], packages: List[str]) -> Optional[Dict[str, Any]]:
        from ..packages import mirror  # only a rig with driver.repo asks

        try:
            return {"missing": mirror.check(repo, packages), "error": None}
        except AgentFailure as exc:
            return {"missing": [], "error": exc.message}

    def imex(self) -> Optional[Dict[str, Any]]:
        return imex.facts(services.state(imex.UNIT))

    def unheld_driver_packages(self, version: str) -> List[str]:
        return driver.unheld_packages(version)

    def installed_module(self) -> Optional[str]:
        return driver.installed_module()

    def kernel_module(self) -> Optional[str]:
        return system.parse_module_type(system.read_text("/proc/driver/nvidia/version"))

    def nouveau_loaded(self) -> bool:
        return runfile.nouveau_loaded()

    def install_fabric_manager(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        return services.install_fabric_manager(step)

    def set_persistence_daemon(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        return services.persistence_daemon(step)

    def unit_state(self, unit: str) -> Dict[str, Any]:
        return services.state(unit)

    def switch_service(self, unit: str, enable: bool, start: bool, restart: bool = False) -> Tuple[bool, str]:
        return services.switch(unit, enable, start, restart)

    def blacklist_nouveau(self) -> Tuple[bool, str]:
        return runfile.blacklist_nouveau()

    def board(self) -> Dict[str, Optional[str]]:
        return system.dmi_board()

    def boot_id(self) -> str:
        return system.boot_id()

    def install_driver(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        return services.install_driver(step, self.installed_version())

    def container_toolkit(self) -> Optional[str]:
        return toolkit.installed_version()

    def install_container_toolkit(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        return toolkit.install(step)

    def generate_cdi(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        return toolkit.generate(step)

    def configure_runtime(self, runtime: str) -> Tuple[bool, str]:
        return toolkit.configure_runtime(runtime)

    def reboot(self) -> Optional[Callable[[], None]]:
        def later() -> None:
            # Detached and delayed a little so the SSH session can carry the reply out before it goes down.
            subprocess.Popen(
                ["sh", "-c", "sleep 1; exec systemctl reboot"],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        return later

    # --- NVML ---
    def open(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable("error", "the pynvml module is missing from the agent bundle") from None
        status_of = {
            "NVMLError_LibraryNotFound": "no-driver",
            "NVMLError_DriverNotLoaded": "driver-not-loaded",
            "NVMLError_LibRmVersionMismatch": "version-mismatch",
            "NVMLError_NoPermission": "no-permission",
        }
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            status = status_of.get(type(exc).__name__)
            if status is None:
                raise NvmlUnavailable("error", f"NVML could not be initialised: {exc}") from None
            raise NvmlUnavailable(status, nvml_message(status)) from None
        self._nvml = _LostAware(pynvml)
        self._handles = {}

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None
        self._handles = {}  # a handle is only valid in the NVML session that made it

    def _handle(self, gpu: int) -> Any:
        if gpu not in self._handles:
            self._handles[gpu] = self._nvml.nvmlDeviceGetHandleByIndex(gpu)
        return self._handles[gpu]

    def _optional(self, call: Callable[[], Any]) -> Any:
        """Ask NVML something this GPU or driver may not answer: None on NotSupported, on a call this
        libnvidia-ml lacks (FunctionNotFound) and on NoData."""
        nvml = self._nvml
        try:
            return call()
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NoData):
            return None

    def driver_version(self) -> str:
        return _decode(self._nvml.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> Optional[int]:
        return self._optional(self._nvml.nvmlSystemGetCudaDriverVersion)  # type: ignore[no-any-return]

    def device_count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def name(self, gpu: int) -> str:
        return _decode(self._nvml.nvmlDeviceGetName(self._handle(gpu)))

    def uuid(self, gpu: int) -> str:
        return _decode(self._nvml.nvmlDeviceGetUUID(self._handle(gpu)))

    def pci_bus_id(self, gpu: int) -> str:
        return _decode(self._nvml.nvmlDeviceGetPciInfo(self._handle(gpu)).busId)

    def memory_total_bytes(self, gpu: int) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle(gpu)).total)

    def minor_number(self, gpu: int) -> Optional[int]:
        minor = self._optional(lambda: self._nvml.nvmlDeviceGetMinorNumber(self._handle(gpu)))
        return None if minor is None else int(minor)

    def cpu_affinity(self, gpu: int) -> Optional[str]:
        # The kernel's own list for the GPU's PCI device: what nvidia-smi prints in topo -m's column.
        name = sysfs_name(self.pci_bus_id(gpu))
        text = (
            None if name is None else system.read_text("/sys/bus/pci/devices/{}/local_cpulist".format(name))
        )
        return None if text is None else text.strip() or None

    def persistence_mode(self, gpu: int) -> Optional[bool]:
        mode = self._optional(lambda: self._nvml.nvmlDeviceGetPersistenceMode(self._handle(gpu)))
        return None if mode is None else mode == self._nvml.NVML_FEATURE_ENABLED

    def set_persistence_mode(self, gpu: int, enabled: bool) -> None:
        nvml = self._nvml
        mode = nvml.NVML_FEATURE_ENABLED if enabled else nvml.NVML_FEATURE_DISABLED
        nvml.nvmlDeviceSetPersistenceMode(self._handle(gpu), mode)

    def pcie_link(self, gpu: int) -> Dict[str, Optional[int]]:
        handle, nvml = self._handle(gpu), self._nvml
        calls = {
            "gen": nvml.nvmlDeviceGetCurrPcieLinkGeneration,
            "width": nvml.nvmlDeviceGetCurrPcieLinkWidth,
            "max_gen": nvml.nvmlDeviceGetMaxPcieLinkGeneration,
            "max_width": nvml.nvmlDeviceGetMaxPcieLinkWidth,
        }
        return {key: self._optional(lambda call=call: call(handle)) for key, call in calls.items()}  # type: ignore[misc]

    def nvlink_active(self, gpu: int, link: int) -> bool:
        nvml = self._nvml
        try:
            state = nvml.nvmlDeviceGetNvLinkState(self._handle(gpu), link)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            raise NoSuchLink() from None
        return bool(state == nvml.NVML_FEATURE_ENABLED)

    def nvlink_remote_type(self, gpu: int, link: int) -> Optional[int]:
        call = self._nvml.nvmlDeviceGetNvLinkRemoteDeviceType
        return self._optional(lambda: call(self._handle(gpu), link))  # type: ignore[no-any-return]

    def nvlink_remote_bus_id(self, gpu: int, link: int) -> Optional[str]:
        info = self._optional(lambda: self._nvml.nvmlDeviceGetNvLinkRemotePciInfo(self._handle(gpu), link))
        return None if info is None else _decode(info.busId)

    def common_ancestor(self, a: int, b: int) -> Optional[int]:
        call = self._nvml.nvmlDeviceGetTopologyCommonAncestor
        return self._optional(lambda: call(self._handle(a), self._handle(b)))  # type: ignore[no-any-return]

    def p2p_status(self, a: int, b: int, index: int) -> Optional[int]:
        call = self._nvml.nvmlDeviceGetP2PStatus
        return self._optional(lambda: call(self._handle(a), self._handle(b), index))  # type: ignore[no-any-return]

    def processes(self, gpu: int) -> List[Tuple[int, Optional[int]]]:
        return self._running(gpu, "nvmlDeviceGetComputeRunningProcesses")

    def mps_processes(self, gpu: int) -> List[Tuple[int, Optional[int]]]:
        nvml = self._nvml
        try:
            return self._running(gpu, "nvmlDeviceGetMPSComputeRunningProcesses")
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return []  # a GPU or driver without MPS, or a driver older than the call: no clients to list

    def _running(self, gpu: int, call: str) -> List[Tuple[int, Optional[int]]]:
        nvml, handle = self._nvml, self._handle(gpu)
        try:
            found = getattr(nvml, call)(handle)
        except (nvml.NVMLLibraryMismatchError, nvml.NVMLError_FunctionNotFound):
            # Drivers before R510 lack the `_v3` symbol the unversioned call uses; `_v2` has the same answer.
            found = getattr(nvml, call + "_v2")(handle)
        return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in found]

    def holds_gpu(self, pid: int) -> Optional[bool]:
        return procs.holds_device(pid)


def _library_version() -> Optional[str]:
    """The version in the NVML library's real file name, for drivers no package manager knows (runfile).

    `libnvidia-ml.so.1` itself is often a link (Debian: through /etc/alternatives to
    `nvidia/current/libnvidia-ml.so.<version>`), so its real path counts as well as the files beside it.
    """
    paths = [
        path
        for folder in _LIB_DIRS
        for path in [
            *glob.glob(os.path.join(folder, "libnvidia-ml.so.*")),
            os.path.realpath(os.path.join(folder, "libnvidia-ml.so.1")),
        ]
    ]
    versions = [match.group(1) for path in paths for match in [_LIB_VERSION.search(path)] if match]
    return max(versions, key=driver.version_key) if versions else None
