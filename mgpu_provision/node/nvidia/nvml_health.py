"""Health answers of a real node: NVML's ECC (DRAM and SRAM apart), memory repair, NVLink error, recovery
action, clock event and violation time, power (management and enforced limit), compute, MIG and fabric
(state, health mask, summary) calls, and the kernel's Xid and SXid log and module readiness.

Each value is one documented pynvml call; where the GPU or the driver cannot answer (NotSupported, a symbol
an older libnvidia-ml lacks, NoData) the value is None, "not checked", never an error. Newer calls fall back
to the ones older drivers have (clock event reasons to throttle reasons, fabric info V to the first version).

Shipped to nodes: standard library only (plus the bundled pynvml), Python 3.8.
"""

from __future__ import annotations

import ctypes

from ...typing_lite import TYPE_CHECKING
from ..core import system
from . import kernel
from .backend import (
    FI_GPU_RECOVERY_ACTION,
    NVLINK_AGGREGATE_SCOPE,
    NVLINK_BER_FIELDS,
    NVLINK_FIELDS,
    VIOLATION_FIELDS,
)

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from .backend import SXidEvent, XidEvent


class RealHealth:
    """Mixed into RealBackend, which provides `_nvml` (pynvml, open) and `_handle(gpu)`."""

    _nvml: Any

    def _handle(self, gpu: int) -> Any:
        raise NotImplementedError  # RealBackend's

    def _optional(self, call: Callable[[], Any]) -> Any:
        raise NotImplementedError  # RealBackend's: None where NVML cannot answer

    def installed_version(self) -> Optional[str]:
        raise NotImplementedError  # RealBackend's

    def _first(self, gpu: int, names: Tuple[str, ...], *args: Any) -> Any:
        """The first of `names` (newest first) this libnvidia-ml has, called on the GPU; None if none has."""
        nvml, handle = self._nvml, self._handle(gpu)
        for name in names:
            try:
                return getattr(nvml, name)(handle, *args)
            except nvml.NVMLError_FunctionNotFound:
                continue
            except nvml.NVMLError_NotSupported:
                return None
        return None

    def kernel_events(self) -> Tuple[Optional[str], List[XidEvent], List[SXidEvent]]:
        return kernel.read_events()

    def reset_gpus(self, gpus: List[int], together: bool) -> Optional[str]:
        """`nvidia-smi -r -i N` per GPU, or with `together` one `nvidia-smi -r` for every GPU and NVSwitch of
        the box: on NVSwitch systems of the A100 generation they must be reset together (nvidia-smi(1),
        -r; the Fabric Manager user guide, "GPU Reset")."""
        targets: List[List[str]] = [[]] if together else [["-i", str(gpu)] for gpu in gpus]
        for target in targets:
            done = system.run(["nvidia-smi", "-r", *target], timeout=120)
            if done.returncode != 0:
                said = (done.stdout + done.stderr).strip().splitlines()
                return "nvidia-smi -r {}: {}".format(" ".join(target), said[-1] if said else done.returncode)
        return None

    def uptime_s(self) -> Optional[float]:
        text = system.read_text("/proc/uptime")
        return float(text.split()[0]) if text else None

    def _fields(self, gpu: int, ids: List[Tuple[int, int]]) -> List[Optional[int]]:
        """Field values (id, scope) in order; None for each the GPU answers NotSupported (or the whole call
        is missing: drivers before R450)."""
        nvml = self._nvml
        values = self._optional(lambda: nvml.nvmlDeviceGetFieldValues(self._handle(gpu), ids))
        if values is None:
            return [None] * len(ids)
        return [_field_int(value) if int(value.nvmlReturn) == nvml.NVML_SUCCESS else None for value in values]

    def recovery_action(self, gpu: int) -> Optional[int]:
        # R570+; older drivers answer the field with NotSupported.
        return self._fields(gpu, [(FI_GPU_RECOVERY_ACTION, 0)])[0]

    def nvlink_error_fields(self, gpu: int, link: int) -> Dict[str, Optional[int]]:
        return self._named_fields(gpu, NVLINK_FIELDS, link)

    def nvlink_ber(self, gpu: int) -> Dict[str, Optional[int]]:
        return self._named_fields(gpu, NVLINK_BER_FIELDS, NVLINK_AGGREGATE_SCOPE)

    def _named_fields(
        self, gpu: int, fields: Tuple[Tuple[int, str], ...], scope: int
    ) -> Dict[str, Optional[int]]:
        """{name: value} of (field id, name) pairs read at one scope (a link, or all of them)."""
        found = self._fields(gpu, [(field, scope) for field, _ in fields])
        return {name: found[position] for position, (_, name) in enumerate(fields)}

    def violation_ns(self, gpu: int, policy: int) -> Optional[int]:
        """The policy's field value (NVML_FI_DEV_PERF_POLICY_*), else the deprecated
        nvmlDeviceGetViolationStatus where the driver answers only that (CUDA 14's libnvidia-ml lacks it)."""
        field = self._fields(gpu, [(VIOLATION_FIELDS[policy], 0)])[0]
        if field is not None:
            return field
        call = getattr(self._nvml, "nvmlDeviceGetViolationStatus", None)
        found = None if call is None else self._optional(lambda: call(self._handle(gpu), policy))
        return None if found is None else int(found.violationTime)

    def enforced_power_limit_mw(self, gpu: int) -> Optional[int]:
        found = self._optional(lambda: self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle(gpu)))
        return None if found is None else int(found)

    def memory_uncorrectable(self, gpu: int, counter: int, location: int) -> Optional[int]:
        nvml = self._nvml
        kind = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        call = nvml.nvmlDeviceGetMemoryErrorCounter
        found = self._optional(lambda: call(self._handle(gpu), kind, counter, location))
        return None if found is None else int(found)

    def sram_threshold_exceeded(self, gpu: int) -> Optional[bool]:
        nvml = self._nvml
        if not hasattr(nvml, "c_nvmlEccSramErrorStatus_v1_t"):
            return None  # a bundled pynvml older than the call
        status = nvml.c_nvmlEccSramErrorStatus_v1_t()
        if self._first(gpu, ("nvmlDeviceGetSramEccErrorStatus",), ctypes.byref(status)) is None:
            return None
        return bool(status.bThresholdExceeded)

    def memory_unrepairable(self, gpu: int) -> Optional[bool]:
        if not hasattr(self._nvml, "nvmlDeviceGetUnrepairableMemoryFlag_v1"):
            return None  # a bundled pynvml older than the call
        found = self._first(gpu, ("nvmlDeviceGetUnrepairableMemoryFlag_v1",))
        return None if found is None else bool(found)

    def kernel_readiness(self) -> Optional[Dict[str, Any]]:
        # A module of another driver version does not count as built (it fails to load).
        return kernel.readiness(driver_version=self.installed_version())

    def ecc_mode(self, gpu: int) -> Optional[Tuple[bool, bool]]:
        modes = self._optional(lambda: self._nvml.nvmlDeviceGetEccMode(self._handle(gpu)))
        on = self._nvml.NVML_FEATURE_ENABLED
        return None if modes is None else (modes[0] == on, modes[1] == on)

    def ecc_uncorrectable(self, gpu: int, counter: int) -> Optional[int]:
        nvml = self._nvml
        kind = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        count: Optional[int] = self._optional(
            lambda: int(nvml.nvmlDeviceGetTotalEccErrors(self._handle(gpu), kind, counter))
        )
        return count

    def retired_pages(self, gpu: int) -> Optional[Tuple[bool, int]]:
        nvml = self._nvml
        pending = self._optional(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(self._handle(gpu)))
        if pending is None:
            return None
        causes = (
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        count = self._optional(
            lambda: sum(len(nvml.nvmlDeviceGetRetiredPages(self._handle(gpu), cause)) for cause in causes)
        )
        return pending == nvml.NVML_FEATURE_ENABLED, int(count or 0)

    def remapped_rows(self, gpu: int) -> Optional[Tuple[int, bool, bool]]:
        rows = self._optional(lambda: self._nvml.nvmlDeviceGetRemappedRows(self._handle(gpu)))
        # (correctable, uncorrectable, pending, failure occurred)
        return None if rows is None else (int(rows[1]), bool(rows[2]), bool(rows[3]))

    def nvlink_error_counter(self, gpu: int, link: int, counter: int) -> Optional[int]:
        call = self._nvml.nvmlDeviceGetNvLinkErrorCounter
        count: Optional[int] = self._optional(lambda: int(call(self._handle(gpu), link, counter)))
        return count

    def clock_event_reasons(self, gpu: int) -> Optional[int]:
        # R535 renamed throttle reasons to clock event reasons; the bits are the same.
        names = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        reasons = self._first(gpu, names)
        return None if reasons is None else int(reasons)

    def power_limits_mw(self, gpu: int) -> Optional[Tuple[int, int]]:
        nvml = self._nvml
        limit = self._optional(lambda: nvml.nvmlDeviceGetPowerManagementLimit(self._handle(gpu)))
        default = self._optional(lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(self._handle(gpu)))
        return None if limit is None or default is None else (int(limit), int(default))

    def power_limit_range_mw(self, gpu: int) -> Optional[Tuple[int, int]]:
        call = self._nvml.nvmlDeviceGetPowerManagementLimitConstraints
        found = self._optional(lambda: call(self._handle(gpu)))
        return None if found is None else (int(found[0]), int(found[1]))

    def set_power_limit_mw(self, gpu: int, milliwatts: int) -> None:
        self._nvml.nvmlDeviceSetPowerManagementLimit(self._handle(gpu), milliwatts)

    def compute_mode(self, gpu: int) -> Optional[int]:
        mode = self._optional(lambda: self._nvml.nvmlDeviceGetComputeMode(self._handle(gpu)))
        return None if mode is None else int(mode)

    def set_compute_mode(self, gpu: int, mode: int) -> None:
        self._nvml.nvmlDeviceSetComputeMode(self._handle(gpu), mode)

    def mig_mode(self, gpu: int) -> Optional[Tuple[bool, bool]]:
        modes = self._optional(lambda: self._nvml.nvmlDeviceGetMigMode(self._handle(gpu)))
        on = self._nvml.NVML_DEVICE_MIG_ENABLE
        return None if modes is None else (modes[0] == on, modes[1] == on)

    def fabric_health(self, gpu: int) -> Optional[Tuple[int, Optional[int]]]:
        """The v3 struct (R560+) has the summary, the V one (R550+) only the mask; older drivers neither."""
        nvml = self._nvml
        for struct, summary in (("c_nvmlGpuFabricInfo_v3_t", True), ("c_nvmlGpuFabricInfo_v2_t", False)):
            if not hasattr(nvml, struct):
                continue
            info = getattr(nvml, struct)()
            try:
                if self._first(gpu, ("nvmlDeviceGetGpuFabricInfoV",), ctypes.byref(info)) is None:
                    return None
            except nvml.NVMLError_ArgumentVersionMismatch:
                continue  # a driver that knows only the older struct version
            return int(info.healthMask), (int(info.healthSummary) or None) if summary else None
        return None

    def fabric_info(self, gpu: int) -> Optional[Tuple[int, str]]:
        info = self._fabric(gpu)
        if info is None:
            return None
        status = int(info.status)
        return int(info.state), "success" if status == 0 else str(self._nvml.NVMLError(status))

    def fabric_clique(self, gpu: int) -> Optional[Tuple[int, str]]:
        """The clique id and cluster UUID the fabric gave the GPU, once its registration completed."""
        info = self._fabric(gpu)
        if info is None or int(info.state) != self._nvml.NVML_GPU_FABRIC_STATE_COMPLETED:
            return None
        import uuid  # only a GPU in an NVLink fabric needs it (and it loads `platform`)

        return int(info.cliqueId), str(uuid.UUID(bytes=bytes(bytearray(info.clusterUuid))))

    def _fabric(self, gpu: int) -> Any:
        """Hopper and later on NVSwitch systems; `...InfoV` since R550, the first version since R530."""
        nvml = self._nvml
        for name, struct in (
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
            ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
        ):
            info = getattr(nvml, struct)()  # the V struct's constructor sets its version field
            if self._first(gpu, (name,), ctypes.byref(info)) is None:
                continue  # not in this driver (or not supported: then the older call says so too)
            return info
        return None


# nvmlValueType_t -> the member of the value union NVML filled in
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_int(field: Any) -> int:
    return int(getattr(field.value, _VALUE_MEMBERS.get(int(field.valueType), "ullVal")))
