"""Health answers of a simulated node, from the twin's per-GPU `health:` and top-level `kernel:`.

A value the twin leaves out reads as NVML's NotSupported would (None: not checked), except where a real GPU
always has an answer: compute mode `default`, no clock event, no Xid. Compute mode and power limit, which
apply sets, go to the twin's overlay (`<twin>.state.json`) like every other simulated change.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..core.errors import AgentFailure
from .backend import (
    AGGREGATE_ECC,
    CLOCK_EVENTS,
    COMPUTE_MODE_CODES,
    COMPUTE_MODES,
    FABRIC_STATES,
    NVLINK_CRC_FLIT,
    NVLINK_RECOVERY,
    NVLINK_REPLAY,
    GpuLost,
    XidEvent,
)
from .twin import Twin
from .twin_health import twin_xids

_STATE_CODES = {name: code for code, name in FABRIC_STATES.items()}
_COUNTER_KEYS = {NVLINK_REPLAY: "replay", NVLINK_RECOVERY: "recovery", NVLINK_CRC_FLIT: "crc"}
P2P_CHIPSET_NOT_SUPPORTED = 1


class SimulatedHealth:
    """Mixed into SimulatedBackend: the health part of the Backend interface."""

    twin: Twin

    def _health(self, gpu: int) -> Dict[str, Any]:
        health: Dict[str, Any] = self.twin.gpus[gpu]["health"]
        return health

    def alive(self, gpu: int) -> None:
        """Raise GpuLost as NVML would for a GPU the twin marks `lost`."""
        if self._health(gpu).get("lost"):
            raise GpuLost("GPU is lost")

    def p2p_read_status(self, a: int, b: int) -> Optional[int]:
        """OK unless a GPU's `p2p_ok_with` leaves the other out (then CNS, as a blocked PCIe path reads)."""
        for me, peer in ((a, b), (b, a)):
            allowed = self._health(me).get("p2p_ok_with")
            if allowed is not None and peer not in allowed:
                return P2P_CHIPSET_NOT_SUPPORTED
        return 0

    def xid_events(self) -> Tuple[Optional[str], List[XidEvent]]:
        return "twin", twin_xids(self.twin.gpus)

    def kernel_readiness(self) -> Optional[Dict[str, Any]]:
        return self.twin.kernel

    def ecc_mode(self, gpu: int) -> Optional[Tuple[bool, bool]]:
        ecc = self._health(gpu).get("ecc")
        if ecc is None or "mode" not in ecc:
            return None
        return ecc["mode"], ecc["mode"]

    def ecc_uncorrectable(self, gpu: int, counter: int) -> Optional[int]:
        ecc = self._health(gpu).get("ecc")
        key = "aggregate_uncorrectable" if counter == AGGREGATE_ECC else "volatile_uncorrectable"
        return None if ecc is None else int(ecc.get(key, 0))

    def retired_pages(self, gpu: int) -> Optional[Tuple[bool, int]]:
        pages = self._health(gpu).get("retired_pages")
        return None if pages is None else (pages.get("pending", False), pages.get("count", 0))

    def remapped_rows(self, gpu: int) -> Optional[Tuple[int, bool, bool]]:
        rows = self._health(gpu).get("remapped_rows")
        if rows is None:
            return None
        return rows.get("uncorrectable", 0), rows.get("pending", False), rows.get("failure", False)

    def nvlink_error_counter(self, gpu: int, link: int, counter: int) -> Optional[int]:
        errors: List[Dict[str, int]] = self._health(gpu).get("nvlink_errors", [])
        entry = next((e for e in errors if e["link"] == link), {})
        key = _COUNTER_KEYS.get(counter)
        return 0 if key is None else int(entry.get(key, 0))

    def clock_event_reasons(self, gpu: int) -> Optional[int]:
        active = set(self._health(gpu).get("throttle", []))
        return sum(bit for bit, name in CLOCK_EVENTS if name in active)

    def power_limits_mw(self, gpu: int) -> Optional[Tuple[int, int]]:
        health = self._health(gpu)
        limit = self.twin.state.get("power_limit_w", {}).get(str(gpu), health.get("power_limit_w"))
        if limit is None:
            return None
        return limit * 1000, health.get("default_power_limit_w", health.get("power_limit_w", limit)) * 1000

    def power_limit_range_mw(self, gpu: int) -> Optional[Tuple[int, int]]:
        return None  # the twin format has no range: every limit is accepted

    def set_power_limit_mw(self, gpu: int, milliwatts: int) -> None:
        if self.power_limits_mw(gpu) is None:
            raise AgentFailure("nvml", f"GPU {gpu} has no power limit to set (simulated: no power_limit_w)")
        self._overlay("power_limit_w", gpu, milliwatts // 1000)

    def compute_mode(self, gpu: int) -> Optional[int]:
        name = self.twin.state.get("compute_mode", {}).get(str(gpu), self._health(gpu).get("compute_mode"))
        return COMPUTE_MODE_CODES[name or "default"]

    def set_compute_mode(self, gpu: int, mode: int) -> None:
        self._overlay("compute_mode", gpu, COMPUTE_MODES[mode])

    def mig_mode(self, gpu: int) -> Optional[Tuple[bool, bool]]:
        mig = self._health(gpu).get("mig")
        return None if mig is None else (mig, mig)

    def fabric_info(self, gpu: int) -> Optional[Tuple[int, str]]:
        fabric = self._health(gpu).get("fabric")
        if fabric is None:
            return None
        return _STATE_CODES[fabric.get("state", "completed")], fabric.get("status", "success")

    def fabric_clique(self, gpu: int) -> Optional[Tuple[int, str]]:
        fabric = self._health(gpu).get("fabric") or {}
        if fabric.get("state", "completed") != "completed" or "clique_id" not in fabric:
            return None
        return int(fabric["clique_id"]), str(fabric.get("cluster_uuid") or "")

    def forget_gpu_settings(self) -> None:
        """What a driver load does to NVML's settings: every GPU back to its default power limit and to
        compute mode `default` (the caller saves the overlay)."""
        for gpu, health in enumerate(self.twin.gpus):
            default = health["health"].get("default_power_limit_w", health["health"].get("power_limit_w"))
            if default is not None:
                self.twin.state.setdefault("power_limit_w", {})[str(gpu)] = default
            self.twin.state.setdefault("compute_mode", {})[str(gpu)] = "default"

    def _overlay(self, key: str, gpu: int, value: Any) -> None:
        self.twin.state.setdefault(key, {})[str(gpu)] = value
        self.twin.save_state()
