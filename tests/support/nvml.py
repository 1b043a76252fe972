"""A scripted pynvml: the calls the real NVML backend makes, answered as two RTX 3090s joined by four links
and a third GPU without NVLink would answer them. Tests subclass it for other drivers and failures."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

BUS = [b"00000000:01:00.0", b"00000000:21:00.0", b"00000000:41:00.0"]


class ScriptedNvml:
    """Two RTX 3090s joined by four links, and a third GPU without NVLink, as pynvml would answer."""

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA GeForce RTX 3090" if handle < 2 else "NVIDIA GeForce RTX 2080 Ti"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-0000000{handle}-0000-0000-0000-000000000000"

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(busId=BUS[handle])  # a ctypes struct field: bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=24 * 1024**3)

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return [1, 0, 2][handle]  # /dev/nvidiaN need not follow NVML's index

    def nvmlDeviceGetPersistenceMode(self, handle: int) -> int:
        if handle == 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return 3 if handle == 1 else 4  # a card that trained down a generation

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return 4

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if handle == 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # no NVLink on this GPU
        if link >= 4:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # past this GPU's links
        return int(pynvml.NVML_FEATURE_DISABLED if (handle, link) == (0, 3) else pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> Any:
        return SimpleNamespace(busId=BUS[1 - handle])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return int(pynvml.NVML_TOPOLOGY_HOSTBRIDGE if {a, b} == {0, 1} else pynvml.NVML_TOPOLOGY_SYSTEM)

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: Any) -> int:
        if type(index) is not int:  # pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,)
            raise TypeError(f"P2P index must be an int, got {index!r}")
        linked = {a, b} == {0, 1}
        return int(
            pynvml.NVML_P2P_STATUS_OK if linked or index == 0 else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=2**22 + 1, usedGpuMemory=None)] if handle == 2 else []

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: int) -> list[Any]:
        # A client of an MPS server on GPU 0; GPU 1 runs no MPS (NotSupported, as without MPS on GeForce).
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=2**22 + 2, usedGpuMemory=512 * 1024**2)] if handle == 0 else []

    # Health, as GeForce cards answer: no ECC, no memory repair, no MIG; a driver older than the fabric calls.
    def _not_supported(self, *args: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    nvmlDeviceGetEccMode = nvmlDeviceGetRetiredPagesPendingStatus = nvmlDeviceGetRemappedRows = _not_supported
    nvmlDeviceGetMigMode = _not_supported

    def _function_not_found(self, *args: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    nvmlDeviceGetGpuFabricInfoV = nvmlDeviceGetGpuFabricInfo = _function_not_found
    nvmlDeviceGetCurrentClocksEventReasons = _function_not_found  # before R535: the throttle call answers
    nvmlDeviceGetUnrepairableMemoryFlag_v1 = _function_not_found  # before NVML 13

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        slowdown = pynvml.nvmlClocksThrottleReasonHwSlowdown | pynvml.nvmlClocksThrottleReasonSwPowerCap
        return int(slowdown if handle == 1 else pynvml.nvmlClocksThrottleReasonGpuIdle)

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:
        return 300_000 if handle == 0 else 350_000

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: int) -> int:
        return 350_000

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: int) -> list[int]:
        return [100_000, 350_000]

    def nvmlDeviceGetComputeMode(self, handle: int) -> int:
        exclusive, default = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, pynvml.NVML_COMPUTEMODE_DEFAULT
        return int(exclusive if handle == 2 else default)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        return 7 if (handle, link, counter) == (0, 1, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) else 0

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return self.nvmlDeviceGetPowerManagementLimit(handle)

    nvmlDeviceGetViolationStatus = _not_supported

    def field_value(self, handle: int, field: int, scope: int) -> int | None:
        """A field's value, None for NotSupported (GeForce: no recovery action, no NVLink fields)."""
        return None

    def nvmlDeviceGetFieldValues(self, handle: int, ids: list[tuple[int, int]]) -> list[Any]:
        answers = []
        for field, scope in ids:
            value = self.field_value(handle, field, scope)
            code = pynvml.NVML_ERROR_NOT_SUPPORTED if value is None else pynvml.NVML_SUCCESS
            union = SimpleNamespace(uiVal=value or 0, ullVal=value or 0)
            kind = (
                pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                if field == 230
                else pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            )
            answers.append(
                SimpleNamespace(fieldId=field, scopeId=scope, nvmlReturn=code, valueType=kind, value=union)
            )
        return answers


# Neither pid is alive here: facts list them as dead, reclaim ends nothing.
