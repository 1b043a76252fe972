"""The seam between the agent's verbs and the NVIDIA layer of a node, with its real and simulated sides.

A simulated node replaces only what NVIDIA software would answer (NVML queries, the loaded kernel module,
driver installs, Fabric Manager, reboots). Facts, apply and reclaim walk this one interface for both kinds
of node, which is what keeps the control side unable to tell them apart. NVML-shaped methods keep NVML's
granularity (one question per call, NVML integer constants) so the real side stays a thin wrapper.
"""

from __future__ import annotations

import abc

from ...typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

# NVML constants the interface speaks in (nvml.h); kept here so the simulated side needs no pynvml.
NVLINK_MAX_LINKS = 36
REMOTE_GPU, REMOTE_IBMNPU, REMOTE_SWITCH, REMOTE_UNKNOWN = 0, 1, 2, 0xFF
# nvmlGpuTopologyLevel_t -> topo -m word; INTERNAL (two GPUs on one board, e.g. K80) is the closest, as PIX.
TOPOLOGY_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_READ, P2P_NVLINK = 0, 2
P2P_STATUS_NAMES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
# Health (nvml.h): ECC counter types, NVLink error counters, clock event reason bits, compute modes, fabric.
VOLATILE_ECC, AGGREGATE_ECC = 0, 1
NVLINK_REPLAY, NVLINK_RECOVERY, NVLINK_CRC_FLIT, NVLINK_CRC_DATA = 0, 1, 2, 3
CLOCK_EVENTS = (
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
)
COMPUTE_MODES = {0: "default", 2: "prohibited", 3: "exclusive_process"}
COMPUTE_MODE_CODES = {name: code for code, name in COMPUTE_MODES.items()}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
# nvmlGpuFabricInfo_v2+ healthMask: 2-bit fields (1 = TRUE), incorrect configuration a 4-bit reason code
# (0 not supported, 1 none); v3 adds healthSummary.
FABRIC_HEALTH_BITS = (
    (0, "degraded_bandwidth"),
    (2, "route_recovery"),
    (4, "route_unhealthy"),
    (6, "access_timeout_recovery"),
)
FABRIC_INCORRECT_CONFIGURATION_SHIFT = 8
FABRIC_INCORRECT_CONFIGURATION = {
    2: "incorrect_sysguid",
    3: "incorrect_chassis_sn",
    4: "no_partition",
    5: "insufficient_nvlinks",
    6: "incompatible_gpu_firmware",
    7: "invalid_location",
    8: "gpu_state_invalid",
}
FABRIC_SUMMARIES = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}
# Field values (nvmlDeviceGetFieldValues): the driver's verdict, and the NVLink counters nvml.h names for
# GPUs whose nvmlDeviceGetNvLinkErrorCounter answers NotSupported (Blackwell).
FI_GPU_RECOVERY_ACTION = 230
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
NVLINK_FIELDS = (
    (161, "replay"),  # NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY
    (162, "recovery"),  # NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY
    (163, "crc"),  # NVML_FI_DEV_NVLINK_ERROR_DL_CRC
    (215, "recovery_events"),  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS
    (214, "recovery_failed"),  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS
    (221, "symbol"),  # NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS
    # The other counters DCGM 4.6's MonitorNVLink5Fields fails on any rise in its window
    # (modules/health/DcgmHealthWatch.cpp 2807-2943; NVML ids from dcgmlib/src/dcgm_fields.cpp):
    (206, "malformed"),  # NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS (DCGM RX_PACKET_MALFORMED)
    (207, "dropped"),  # NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS (DCGM RX_PACKET_DROPPED)
    (208, "rx_errors"),  # NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS
    (209, "rx_remote"),  # NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS
    (210, "rx_general"),  # NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS
    (211, "integrity"),  # NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS
    (219, "effective_errors"),  # NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS
)
# The NVLink5 bit error rates, read for the whole GPU as DCGM reads them on Blackwell ("NVLink5+ requires
# scopeId = UINT_MAX for aggregate data", dcgmlib/src/DcgmCacheManager.cpp 8691): each value packs a
# mantissa and an exponent, BER = mantissa * 10^-exponent (nvml.h NVML_NVLINK_ERROR_COUNTER_BER_GET).
NVLINK_BER_FIELDS = (
    (220, "effective"),  # NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER: after FEC
    (222, "symbol"),  # NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER: errors FEC could not correct
)
NVLINK_AGGREGATE_SCOPE = 0xFFFFFFFF
# nvmlPerfPolicyType_t of nvmlDeviceGetViolationStatus: the clock-limit time DCGM's health watch reads.
VIOLATION_POLICIES = ((0, "power"), (1, "thermal"), (3, "board_limit"), (5, "reliability"))
# The field values that replace nvmlDeviceGetViolationStatus (deprecated in CUDA 13's nvml.h, removed in
# 14): NVML_FI_DEV_PERF_POLICY_POWER 74, _THERMAL 75, _BOARD_LIMIT 77, _RELIABILITY 79, in ns (nvml.h).
VIOLATION_FIELDS = {0: 74, 1: 75, 3: 77, 5: 79}
MEMORY_LOCATION_DRAM, MEMORY_LOCATION_SRAM = 2, 7
if TYPE_CHECKING:
    XidEvent = Tuple[str, int]  # (PCI domain:bus:device as the kernel log prints it, Xid code)
if TYPE_CHECKING:
    SXidEvent = Tuple[str, str, int, bool]  # (nvidia-nvswitchN, its PCI address, SXid code, fatal)

# One wording per NVML failure, shared by both backends so a simulated node reads like a real one.
_NVML_MESSAGES = {
    "no-driver": "no NVIDIA driver is installed (libnvidia-ml.so.1 not found)",
    "driver-not-loaded": "the NVIDIA driver is installed but its kernel module is not loaded "
    "(nouveau bound to the GPU, Secure Boot refusing the module, or no reboot since the install)",
    "version-mismatch": "the NVIDIA driver library and the loaded kernel module differ "
    "(Driver/library version mismatch): reboot to load the installed driver",
    "no-permission": "NVML has no permission to talk to the driver (check /dev/nvidia* permissions)",
}


def nvml_message(status: str) -> str:
    return _NVML_MESSAGES[status]


class NvmlUnavailable(Exception):
    """NVML could not be initialised; `status` is a `facts.DriverInfo.nvml` value, `message` plain words."""

    def __init__(self, status: str, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


class NoSuchLink(Exception):
    """The GPU has no NVLink at this index (NVML NotSupported or InvalidArgument): the link loop ends."""


class GpuLost(Exception):
    """NVML answers GpuIsLost for this GPU (fallen off the bus): it is reported lost, the others are read."""


class Backend(abc.ABC):
    """What a node's NVIDIA layer answers. `open()` must succeed before any NVML-shaped method is used."""

    simulated = False
    # NVML names processes by their pid in the initial pid namespace, whichever namespace asks.
    reports_host_pids = True

    # --- outside NVML: driver packages, kernel module, services, machine ---
    @abc.abstractmethod
    def loaded_version(self) -> Optional[str]:
        """Version of the loaded kernel module, None when none is loaded."""

    @abc.abstractmethod
    def installed_version(self) -> Optional[str]:
        """Version of the userspace driver on disk, None when none is installed."""

    @abc.abstractmethod
    def fabric_manager(self) -> Optional[Dict[str, Any]]:
        """`{"version", "service", "enabled"}` of Fabric Manager, None when neither installed nor expected."""

    @abc.abstractmethod
    def persistence_daemon(self) -> Dict[str, Any]:
        """`{"service", "enabled"}` of nvidia-persistenced (service "absent" when not installed)."""

    @abc.abstractmethod
    def imex(self) -> Optional[Dict[str, Any]]:
        """`{"version", "service", "enabled", "channels"}` of nvidia-imex, None when it is not installed."""

    @abc.abstractmethod
    def nvidia_repository_missing(self) -> Optional[str]:
        """The repository step of NVIDIA's installation guide when the box has no NVIDIA repository
        configured; None when it has one (or installs with no package manager)."""

    def check_mirror(self, repo: Dict[str, str], packages: List[str]) -> Optional[Dict[str, Any]]:
        """`{"missing", "error"}`: whether `packages` resolve from the driver's mirror alone; None where
        there is no package manager to ask (a simulated node)."""
        return None

    def unheld_driver_packages(self, version: str) -> List[str]:
        """Packages of the installed driver set that the package manager does not hold; none by default."""
        return []

    def installed_module(self) -> Optional[str]:
        """open or proprietary: which kernel modules are installed (the next boot loads them); None when
        unknown (a simulated node: its twin switches the running type at the next boot)."""
        return None

    @abc.abstractmethod
    def kernel_module(self) -> Optional[str]:
        """open or proprietary: which kernel modules are loaded, None when none is."""

    @abc.abstractmethod
    def nouveau_loaded(self) -> bool:
        """Whether nouveau holds the GPU (the runfile installer refuses to run then)."""

    def distribution(self) -> Optional[Dict[str, object]]:
        """os_id, os_version_id, os_like to report instead of /etc/os-release's; None: the real file's."""
        return None

    def machine(self) -> Optional[Dict[str, Any]]:
        """CPU layout and memory to report instead of /sys's (node/host/machine.py shape); None: the real."""
        return None

    @abc.abstractmethod
    def board(self) -> Dict[str, Optional[str]]:
        """`{"vendor", "model"}` of the mainboard."""

    @abc.abstractmethod
    def boot_id(self) -> str:
        """Changes on every boot: the control side waits for a new one after a reboot."""

    @abc.abstractmethod
    def install_driver(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        """Carry out an apply `driver` step; return (changed, message). Raise AgentFailure on failure."""

    @abc.abstractmethod
    def install_fabric_manager(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        """Carry out a `fabricmanager` step: FM at exactly the step's version, held, its service enabled."""

    @abc.abstractmethod
    def set_persistence_daemon(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        """Carry out a `persistenced` step: the daemon installed, enabled and started, or turned off."""

    @abc.abstractmethod
    def unit_state(self, unit: str) -> Dict[str, Any]:
        """`{"service", "enabled"}` of any systemd unit, as `persistence_daemon` reports its own."""

    @abc.abstractmethod
    def switch_service(self, unit: str, enable: bool, start: bool, restart: bool = False) -> Tuple[bool, str]:
        """Enable (and start) or disable (and stop) an NVIDIA service; `restart`: a running one again."""

    @abc.abstractmethod
    def blacklist_nouveau(self) -> Tuple[bool, str]:
        """Keep nouveau from loading at the next boot."""

    # --- the NVIDIA Container Toolkit ---
    @abc.abstractmethod
    def container_toolkit(self) -> Optional[str]:
        """The toolkit's version (`nvidia-ctk --version`), None when it is not installed."""

    @abc.abstractmethod
    def install_container_toolkit(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        """Carry out a `container-toolkit` step: its packages at exactly the step's version."""

    @abc.abstractmethod
    def generate_cdi(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        """Carry out a `cdi-generate` step: `nvidia-ctk cdi generate` for the loaded driver, atomically."""

    @abc.abstractmethod
    def configure_runtime(self, runtime: str) -> Tuple[bool, str]:
        """Carry out a `runtime-configure` step: `nvidia-ctk runtime configure --runtime=<runtime>`."""

    @abc.abstractmethod
    def reboot(self) -> Optional[Callable[[], None]]:
        """Reboot the node; what must only happen after the reply is sent is returned as a callable."""

    # --- NVML ---
    @abc.abstractmethod
    def open(self) -> None:
        """Initialise NVML; raise NvmlUnavailable with a plain explanation when it cannot be."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release NVML."""

    @abc.abstractmethod
    def driver_version(self) -> str: ...

    @abc.abstractmethod
    def cuda_driver_version(self) -> Optional[int]:
        """CUDA driver API version as NVML encodes it (12040 = 12.4), None when unknown."""

    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def name(self, gpu: int) -> str: ...

    @abc.abstractmethod
    def uuid(self, gpu: int) -> str: ...

    @abc.abstractmethod
    def pci_bus_id(self, gpu: int) -> str: ...

    @abc.abstractmethod
    def memory_total_bytes(self, gpu: int) -> int: ...

    @abc.abstractmethod
    def minor_number(self, gpu: int) -> Optional[int]:
        """N of the GPU's /dev/nvidiaN (NVML's minor number), None when NVML cannot say."""

    @abc.abstractmethod
    def cpu_affinity(self, gpu: int) -> Optional[str]:
        """The OS CPUs near the GPU as a kernel CPU list ("0-3,8-11", SMT siblings included, as
        `nvidia-smi topo -m` prints them); None when unknown."""

    @abc.abstractmethod
    def persistence_mode(self, gpu: int) -> Optional[bool]: ...

    @abc.abstractmethod
    def set_persistence_mode(self, gpu: int, enabled: bool) -> None: ...

    @abc.abstractmethod
    def pcie_link(self, gpu: int) -> Dict[str, Optional[int]]:
        """`{"gen", "width", "max_gen", "max_width"}`; None where NVML cannot say."""

    @abc.abstractmethod
    def nvlink_active(self, gpu: int, link: int) -> bool:
        """State of one link; raise NoSuchLink past the GPU's last link or on GPUs without NVLink."""

    @abc.abstractmethod
    def nvlink_remote_type(self, gpu: int, link: int) -> Optional[int]: ...

    @abc.abstractmethod
    def nvlink_remote_bus_id(self, gpu: int, link: int) -> Optional[str]: ...

    @abc.abstractmethod
    def common_ancestor(self, a: int, b: int) -> Optional[int]:
        """NVML topology level of the PCIe path between two GPUs, None when NVML cannot say."""

    @abc.abstractmethod
    def p2p_status(self, a: int, b: int, index: int) -> Optional[int]: ...

    @abc.abstractmethod
    def processes(self, gpu: int) -> List[Tuple[int, Optional[int]]]:
        """(pid, used GPU memory in bytes or None) of the compute processes on a GPU."""

    @abc.abstractmethod
    def mps_processes(self, gpu: int) -> List[Tuple[int, Optional[int]]]:
        """(pid, used GPU memory in bytes or None) of the clients of an MPS server on a GPU, which
        `processes` does not list: it lists the server (nvmlDeviceGetMPSComputeRunningProcesses)."""

    @abc.abstractmethod
    def holds_gpu(self, pid: int) -> Optional[bool]:
        """Whether the process has the GPU open right now; None when the agent may not look."""

    @abc.abstractmethod
    def reset_gpus(self, gpus: List[int], together: bool) -> Optional[str]:
        """Reset these GPUs, or with `together` every GPU of the box at once (an NVSwitch box of the A100
        generation resets them together); None when it succeeded, else what the reset said. Called with
        NVML closed."""

    # --- health: None wherever the GPU or driver cannot say (NotSupported, a call the driver lacks) ---
    @abc.abstractmethod
    def kernel_events(self) -> Tuple[Optional[str], List[XidEvent], List[SXidEvent]]:
        """(where they were read, the Xids and NVSwitch SXids logged since boot); source None when no kernel
        log was readable."""

    @abc.abstractmethod
    def uptime_s(self) -> Optional[float]:
        """Seconds since boot: the interval of counters that have no earlier sample this boot."""

    @abc.abstractmethod
    def kernel_readiness(self) -> Optional[Dict[str, Any]]:
        """`facts.KernelReadiness` as a dict, None when it cannot be judged here."""

    @abc.abstractmethod
    def ecc_mode(self, gpu: int) -> Optional[Tuple[bool, bool]]:
        """(current, pending) ECC mode."""

    @abc.abstractmethod
    def ecc_uncorrectable(self, gpu: int, counter: int) -> Optional[int]:
        """Uncorrectable ECC errors, VOLATILE_ECC (since the driver loaded) or AGGREGATE_ECC (lifetime)."""

    @abc.abstractmethod
    def retired_pages(self, gpu: int) -> Optional[Tuple[bool, int]]:
        """(retirement pending, pages retired) on GPUs before Ampere."""

    @abc.abstractmethod
    def remapped_rows(self, gpu: int) -> Optional[Tuple[int, bool, bool]]:
        """(rows remapped for uncorrectable errors, remap pending, remap failed) on Ampere and later."""

    @abc.abstractmethod
    def memory_uncorrectable(self, gpu: int, counter: int, location: int) -> Optional[int]:
        """Uncorrectable ECC errors at MEMORY_LOCATION_SRAM or _DRAM (counted apart on Hopper and later)."""

    @abc.abstractmethod
    def sram_threshold_exceeded(self, gpu: int) -> Optional[bool]:
        """The driver's own verdict that SRAM uncorrectable errors passed its threshold (R550+)."""

    @abc.abstractmethod
    def memory_unrepairable(self, gpu: int) -> Optional[bool]:
        """nvmlDeviceGetUnrepairableMemoryFlag_v1: the GPU has memory it cannot repair (DCGM 4.6
        MonitorMemUnrepairableFlag: FAIL)."""

    @abc.abstractmethod
    def nvlink_error_counter(self, gpu: int, link: int, counter: int) -> Optional[int]: ...

    @abc.abstractmethod
    def nvlink_error_fields(self, gpu: int, link: int) -> Dict[str, Optional[int]]:
        """NVLINK_FIELDS names -> value of one link's field values, None where NotSupported."""

    @abc.abstractmethod
    def nvlink_ber(self, gpu: int) -> Dict[str, Optional[int]]:
        """NVLINK_BER_FIELDS names -> the GPU's packed BER value (all its links), None where NotSupported."""

    @abc.abstractmethod
    def recovery_action(self, gpu: int) -> Optional[int]:
        """A RECOVERY_ACTIONS key: what the driver says the GPU needs."""

    @abc.abstractmethod
    def violation_ns(self, gpu: int, policy: int) -> Optional[int]:
        """Total time (ns) the GPU's clocks were held below target by one VIOLATION_POLICIES reason."""

    @abc.abstractmethod
    def enforced_power_limit_mw(self, gpu: int) -> Optional[int]:
        """The limit in force: the lowest of the management limit and any out-of-band (BMC) cap."""

    @abc.abstractmethod
    def clock_event_reasons(self, gpu: int) -> Optional[int]:
        """Bit mask of CLOCK_EVENTS bits currently active."""

    @abc.abstractmethod
    def power_limits_mw(self, gpu: int) -> Optional[Tuple[int, int]]:
        """(current, default) power management limit in milliwatts."""

    @abc.abstractmethod
    def power_limit_range_mw(self, gpu: int) -> Optional[Tuple[int, int]]:
        """(lowest, highest) power limit the GPU accepts, in milliwatts."""

    @abc.abstractmethod
    def set_power_limit_mw(self, gpu: int, milliwatts: int) -> None: ...

    @abc.abstractmethod
    def compute_mode(self, gpu: int) -> Optional[int]:
        """A COMPUTE_MODES key."""

    @abc.abstractmethod
    def set_compute_mode(self, gpu: int, mode: int) -> None: ...

    @abc.abstractmethod
    def mig_mode(self, gpu: int) -> Optional[Tuple[bool, bool]]:
        """(current, pending) MIG mode."""

    @abc.abstractmethod
    def fabric_info(self, gpu: int) -> Optional[Tuple[int, str]]:
        """(FABRIC_STATES key, "success" or NVML's words for the registration's result)."""

    @abc.abstractmethod
    def fabric_health(self, gpu: int) -> Optional[Tuple[int, Optional[int]]]:
        """(healthMask, FABRIC_SUMMARIES key or None before the v3 struct) of a fabric GPU."""

    @abc.abstractmethod
    def fabric_clique(self, gpu: int) -> Optional[Tuple[int, str]]:
        """(clique id, cluster UUID) of a GPU registered with an NVLink fabric; None elsewhere. GPUs of one
        NVLink domain (a GB200 NVL72 rack) share the cluster UUID and clique id."""
