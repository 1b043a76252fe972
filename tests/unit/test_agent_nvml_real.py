"""The real NVML backend against a scripted pynvml: init failures as facts, the link loop's two endings,
bytes bus ids, and plain-int P2P indices (pynvml's own constant for it is a tuple)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from mgpu_provision import protocol
from mgpu_provision.facts import DriverInfo, Gpu, GpuPair, HostHealth
from mgpu_provision.node.nvidia.nvml_real import RealBackend
from mgpu_provision.node.verbs.facts import nvidia_facts
from tests.support.nvml import BUS, ScriptedNvml

HOLDERS = [
    {"pid": 2**22 + 2, "gpu": 0, "used_mib": 512, "alive": False, "mps_server": None},
    {"pid": 2**22 + 1, "gpu": 2, "used_mib": None, "alive": False, "mps_server": None},
]


def real_facts(
    monkeypatch: pytest.MonkeyPatch, nvml: ScriptedNvml, driver: str = "550.54.15"
) -> dict[str, Any]:
    """nvidia_facts of the real backend over a scripted pynvml, with the driver installed and loaded."""
    nvml.install(monkeypatch)
    monkeypatch.setattr(RealBackend, "kernel_events", lambda self: ("journal", [("0000:21:00", 79)], []))
    monkeypatch.setattr(RealBackend, "kernel_readiness", lambda self: None)
    monkeypatch.setattr(RealBackend, "installed_version", lambda self: driver)
    monkeypatch.setattr(RealBackend, "loaded_version", lambda self: driver)
    return nvidia_facts(RealBackend())


def test_facts_from_a_scripted_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = real_facts(monkeypatch, ScriptedNvml())
    driver = DriverInfo.model_validate(raw["driver"])
    assert (driver.nvml, driver.version, driver.cuda, driver.reboot_required) == (
        "ok",
        "550.54.15",
        "12.4",
        False,
    )
    gpus = [Gpu.model_validate(g) for g in raw["gpus"]]
    assert [g.pci_bus_id for g in gpus] == [b.decode() for b in BUS]
    assert [len(g.nvlinks) for g in gpus] == [4, 4, 0]
    assert [link.active for link in gpus[0].nvlinks] == [True, True, True, False]
    assert gpus[1].nvlinks[0].remote_pci_bus_id == "00000000:01:00.0"
    assert gpus[1].nvlinks[0].remote_type == "gpu"
    assert (gpus[1].pcie.gen, gpus[1].pcie.max_gen, gpus[1].pcie.max_width) == (3, 4, None)
    assert [g.persistence_mode for g in gpus] == [True, True, None]
    assert [g.minor_number for g in gpus] == [1, 0, 2]
    pairs = {(p.a, p.b): p for p in (GpuPair.model_validate(p) for p in raw["pairs"])}
    assert pairs[(0, 1)].cell == "NV3"  # one of the four links is down on GPU0's side
    assert (pairs[(0, 1)].pcie, pairs[(0, 1)].p2p_read, pairs[(0, 1)].p2p_nvlink) == ("PHB", "OK", "OK")
    assert (pairs[(0, 2)].cell, pairs[(1, 2)].p2p_nvlink) == ("SYS", "NS")
    assert raw["nvswitch"] is False
    assert raw["processes"] == HOLDERS


@pytest.mark.parametrize(
    "code, status, words",
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no-driver", "no NVIDIA driver is installed"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver-not-loaded", "kernel module is not loaded"),
        (
            pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            "version-mismatch",
            "reboot to load the installed driver",
        ),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no-permission", "/dev/nvidia* permissions"),
        (pynvml.NVML_ERROR_UNKNOWN, "error", "NVML could not be initialised: Unknown Error"),
    ],
)
def test_init_failures_become_driver_facts(
    monkeypatch: pytest.MonkeyPatch, code: int, status: str, words: str
) -> None:
    def fail() -> None:
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    monkeypatch.setattr(RealBackend, "installed_version", lambda self: "550.90.07")
    monkeypatch.setattr(RealBackend, "loaded_version", lambda self: "550.54.15")
    raw = nvidia_facts(RealBackend())
    driver = DriverInfo.model_validate(raw["driver"])
    assert driver.nvml == status and driver.message is not None and words in driver.message
    assert driver.reboot_required and raw["gpus"] == []


def test_loaded_module_version_is_read_from_proc() -> None:
    from mgpu_provision.node.core.system import parse_nvrm_version

    line = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024\n"
    assert parse_nvrm_version(line) == "550.90.07"
    open_line = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build\n"
    assert parse_nvrm_version(open_line) == "570.124.06"
    assert parse_nvrm_version("") is None and parse_nvrm_version(None) is None


class PreR510Nvml(ScriptedNvml):
    """A driver older than R510: libnvidia-ml has no `_v3` running-processes symbol, so pynvml's unversioned
    call raises NVMLLibraryMismatchError (not an NVMLError); the `_v2` call answers."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version ...")

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: int) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int) -> list[Any]:
        return super().nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: int) -> list[Any]:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version ...")

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, handle: int) -> list[Any]:
        return super().nvmlDeviceGetMPSComputeRunningProcesses(handle)


class NoMpsCallNvml(PreR510Nvml):
    """A driver older than the MPS call itself: neither symbol exists."""

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, handle: int) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def test_a_driver_without_the_mps_call_lists_no_mps_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = real_facts(monkeypatch, NoMpsCallNvml(), driver="418.226.00")
    assert raw["processes"] == HOLDERS[1:]


def test_running_processes_fall_back_to_v2_on_drivers_before_r510(monkeypatch: pytest.MonkeyPatch) -> None:
    from mgpu_provision.node.verbs import reclaim

    raw = real_facts(monkeypatch, PreR510Nvml(), driver="470.256.02")
    assert raw["processes"] == HOLDERS
    result = reclaim.run(
        protocol.check_args("reclaim", {"policy": "orphans", "dry_run": True}), RealBackend()
    )
    # The holder's pid is not alive: nothing to end.
    assert result == {"processes": [], "freed_mib": 0, "not_holders": []}


class LostGpuNvml(ScriptedNvml):
    """GPU 1 fell off the bus: NVML still enumerates it and knows its PCI address, every other question
    about it answers GpuIsLost."""

    def nvmlDeviceGetName(self, handle: int) -> str:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super().nvmlDeviceGetName(handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super().nvmlDeviceGetComputeRunningProcesses(handle)


def test_a_lost_gpu_is_reported_and_the_others_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = real_facts(monkeypatch, LostGpuNvml())
    assert [g["index"] for g in raw["gpus"]] == [0, 2]
    assert raw["lost_gpus"] == [{"index": 1, "pci_bus_id": "00000000:21:00.0", "error": "GPU is lost"}]
    assert [(p["a"], p["b"]) for p in raw["pairs"]] == [(0, 2)]
    assert raw["processes"] == HOLDERS
    from mgpu_provision.node.verbs import reclaim

    result = reclaim.run(
        protocol.check_args("reclaim", {"policy": "orphans", "dry_run": True}), RealBackend()
    )
    assert result == {"processes": [], "freed_mib": 0, "not_holders": []}
    assert raw["pairs"][0]["nvlinks"] == 0  # GPU 0's links led to the lost GPU


class SessionNvml(ScriptedNvml):
    """Handles die with the NVML session that made them, as real `nvmlDevice_t` handles do."""

    def __init__(self) -> None:
        self.session = 0

    def nvmlInit(self) -> None:
        self.session += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return (self.session, index)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        session, index = handle
        if session != self.session:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return super().nvmlDeviceGetName(index)


def test_handles_do_not_outlive_the_nvml_session(monkeypatch: pytest.MonkeyPatch) -> None:
    SessionNvml().install(monkeypatch)
    backend = RealBackend()
    for _ in range(2):  # e.g. facts, then reclaim, in one agent process
        backend.open()
        assert backend.name(0) == "NVIDIA GeForce RTX 3090"
        backend.close()


def test_health_from_a_scripted_geforce_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    health = HostHealth.model_validate(real_facts(monkeypatch, ScriptedNvml())["health"])
    gpu0, gpu1, gpu2 = health.gpus
    assert (gpu0.throttle, gpu1.throttle) == ([], ["sw_power_cap", "hw_slowdown"])  # via the pre-R535 call
    assert (gpu0.power_limit_w, gpu0.default_power_limit_w, gpu1.power_limit_w) == (300, 350, 350)
    assert gpu0.power_limit_range_w == (100, 350)
    assert [g.compute_mode for g in health.gpus] == ["default", "default", "exclusive_process"]
    assert (gpu0.ecc_mode, gpu0.remapped_rows_pending, gpu0.mig, gpu0.fabric_state) == (None,) * 4
    assert [(e.link, e.crc) for e in gpu0.nvlink_errors] == [(0, 0), (1, 7), (2, 0)]  # link 3 is down
    assert gpu2.nvlink_errors == []
    assert [(x.gpu, x.code) for x in health.xid] == [(1, 79)]
    # NotSupported is said once per value, naming the GPUs, and is no failure.
    assert health.not_checked == [
        "ecc: not supported on GPU 0, 1, 2",
        "memory repair: not supported on GPU 0, 1, 2",
        "recovery action: not supported on GPU 0, 1, 2",
        "violation time: not supported on GPU 0, 1, 2",
        "kernel: not read (no /lib/modules, or a twin without `kernel`)",
    ]
    assert gpu0.enforced_power_limit_w == 300 and gpu0.ecc_sram_volatile_uncorrectable is None


class DatacenterNvml(ScriptedNvml):
    """A100s on an NVSwitch baseboard with a driver before R550 (no `...FabricInfoV`)."""

    def nvmlDeviceGetEccMode(self, handle: int) -> list[int]:
        return [pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED if handle == 1 else 1]

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        assert kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return {pynvml.NVML_VOLATILE_ECC: 2, pynvml.NVML_AGGREGATE_ECC: 5}[counter] if handle == 0 else 0

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return (0, 3, 1, 0) if handle == 2 else (0, 0, 0, 0)

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        return [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE if handle == 1 else 0]

    def nvmlDeviceGetGpuFabricInfo(self, handle: int, info: Any) -> int:
        info._obj.state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS if handle == 1 else 3
        info._obj.status = pynvml.NVML_ERROR_NOT_READY if handle == 2 else pynvml.NVML_SUCCESS
        return int(pynvml.NVML_SUCCESS)

    def field_value(self, handle: int, field: int, scope: int) -> int | None:
        if field == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return int(pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET if handle == 1 else 0)
        return None

    def nvmlDeviceGetViolationStatus(self, handle: int, policy: int) -> Any:
        thermal = policy == pynvml.NVML_PERF_POLICY_THERMAL and handle == 0
        return SimpleNamespace(referenceTime=0, violationTime=2_500_000_000 if thermal else 0)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return 250_000 if handle == 2 else self.nvmlDeviceGetPowerManagementLimit(handle)  # a BMC cap

    def nvmlDeviceGetMemoryErrorCounter(self, handle: int, kind: int, counter: int, location: int) -> int:
        if location == pynvml.NVML_MEMORY_LOCATION_SRAM:
            return 4 if handle == 0 and counter == pynvml.NVML_AGGREGATE_ECC else 0
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # A100: DRAM is not counted apart

    nvmlDeviceGetSramEccErrorStatus = ScriptedNvml._function_not_found


def test_health_from_a_scripted_datacenter_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    health = HostHealth.model_validate(real_facts(monkeypatch, DatacenterNvml())["health"])
    gpu0, gpu1, gpu2 = health.gpus
    ecc = (gpu0.ecc_mode, gpu0.ecc_volatile_uncorrectable, gpu0.ecc_aggregate_uncorrectable)
    assert ecc == (True, 2, 5)
    assert (gpu1.ecc_mode, gpu1.ecc_pending_mode) == (True, False)
    rows = (gpu2.remapped_rows_pending, gpu2.remapped_rows_uncorrectable, gpu2.retired_pages)
    assert rows == (True, 3, None)
    assert (gpu1.mig, gpu1.mig_pending) == (False, True)
    assert [(g.fabric_state, g.fabric_status) for g in health.gpus] == [
        ("completed", "success"),
        ("in_progress", "success"),
        ("completed", "NVML Error with code 27"),  # pynvml's words without a libnvidia-ml to ask
    ]
    assert health.not_checked == ["kernel: not read (no /lib/modules, or a twin without `kernel`)"]
    assert [g.recovery_action for g in health.gpus] == ["none", "drain_and_reset", "none"]
    assert gpu0.violation_ms == {"power": 0, "thermal": 2500, "board_limit": 0, "reliability": 0}
    assert [g.enforced_power_limit_w for g in health.gpus] == [300, 350, 250]
    assert (gpu0.ecc_sram_aggregate_uncorrectable, gpu0.ecc_dram_aggregate_uncorrectable) == (4, None)
    assert gpu0.sram_threshold_exceeded is None and gpu0.fabric_health is None  # R535: neither call


class BlackwellNvml(DatacenterNvml):
    """B200s with R570: the NVLink counter call answers NotSupported, the field values answer per link;
    the v3 fabric info carries the health mask and summary; the SRAM status call answers."""

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def field_value(self, handle: int, field: int, scope: int) -> int | None:
        if field == pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS:
            return 9 if (handle, scope) == (0, 2) else 0
        if field == pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS:
            return 1
        if field in (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC):
            return None  # not on this GPU: the others still count
        ber_fields = (
            pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER,
            pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER,
        )
        if field in ber_fields:
            # The GPU's value over all its links answers only to scope UINT_MAX (DcgmCacheManager.cpp 8691);
            # NVML's zero is 15e-255, a healthy aggregate symbol BER 15e-238 (DCGM's test: raw 73710).
            if scope != 0xFFFFFFFF:
                return None
            if field == pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER:
                return 73710
            return (3 << 8) | 11 if handle == 1 else (15 << 8) | 255
        if field == pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS:
            return 4 if (handle, scope) == (0, 1) else 0
        return super().field_value(handle, field, scope) if field == 230 else 0

    def nvmlDeviceGetGpuFabricInfoV(self, handle: int, info: Any) -> int:
        info._obj.state, info._obj.status = 3, pynvml.NVML_SUCCESS
        degraded = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE if handle == 1 else 2
        wrong = 5 if handle == 1 else 1  # insufficient NVLinks / none
        info._obj.healthMask = degraded | (
            wrong << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION
        )
        info._obj.healthSummary = 3 if handle == 1 else 1
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetSramEccErrorStatus(self, handle: int, status: Any) -> int:
        status._obj.bThresholdExceeded = int(handle == 2)
        return int(pynvml.NVML_SUCCESS)


def test_health_of_blackwell_reads_nvlink_field_values(monkeypatch: pytest.MonkeyPatch) -> None:
    health = HostHealth.model_validate(real_facts(monkeypatch, BlackwellNvml())["health"])
    gpu0, gpu1, _ = health.gpus
    links = [(e.link, e.source, e.crc, e.recovery, e.symbol, e.recovery_events) for e in gpu0.nvlink_errors]
    assert links == [(0, "fields", None, 0, 0, 1), (1, "fields", None, 0, 0, 1), (2, "fields", None, 0, 9, 1)]
    assert [e.malformed for e in gpu0.nvlink_errors] == [0, 4, 0]
    assert (gpu0.nvlink_ber, gpu1.nvlink_ber) == (
        {"effective": (15 << 8) | 255, "symbol": 73710},
        {"effective": (3 << 8) | 11, "symbol": 73710},
    )
    assert "nvlink errors: not supported on GPU 0, 1" not in health.not_checked
    assert (gpu0.fabric_health, gpu0.fabric_summary) == ([], "healthy")
    assert (gpu1.fabric_health, gpu1.fabric_summary) == (
        ["degraded_bandwidth", "insufficient_nvlinks"],
        "limited_capacity",
    )
    assert [g.sram_threshold_exceeded for g in health.gpus] == [False, False, True]


class VoltaNvml(DatacenterNvml):
    """V100s: page retirement instead of row remapping; a driver that cannot count NVLink errors."""

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        return int(pynvml.NVML_FEATURE_ENABLED if handle == 0 else pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> list[int]:
        double_bit = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        return [0x7F000] if handle == 0 and double_bit else []


def test_health_of_pre_ampere_gpus_reads_retired_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    health = HostHealth.model_validate(real_facts(monkeypatch, VoltaNvml())["health"])
    pages = [(g.retired_pages_pending, g.retired_pages) for g in health.gpus]
    assert pages == [(True, 1), (False, 0), (False, 0)]
    assert {g.remapped_rows_pending for g in health.gpus} == {None}
    assert health.gpus[0].nvlink_errors == []
    assert "nvlink errors: not supported on GPU 0, 1" in health.not_checked  # GPU 2 has no NVLink


class Cuda14Nvml(DatacenterNvml):
    """A libnvidia-ml of CUDA 14: nvmlDeviceGetViolationStatus is gone (deprecated in 13's nvml.h), the
    NVML_FI_DEV_PERF_POLICY_* field values (74 power, 75 thermal, 77 board limit, 79 reliability) answer."""

    nvmlDeviceGetViolationStatus = None  # gone from the library

    def field_value(self, handle: int, field: int, scope: int) -> int | None:
        if field == pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL:
            return 7_000_000_000 if handle == 1 else 0
        if field in (74, 77, 79):
            return 0
        return super().field_value(handle, field, scope)


def test_violation_time_comes_from_field_values_where_the_old_call_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    health = HostHealth.model_validate(real_facts(monkeypatch, Cuda14Nvml())["health"])
    assert [g.violation_ms for g in health.gpus][:2] == [
        {"power": 0, "thermal": 0, "board_limit": 0, "reliability": 0},
        {"power": 0, "thermal": 7000, "board_limit": 0, "reliability": 0},
    ]
