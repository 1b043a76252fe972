"""Health answers of a simulated node, from the twin's per-GPU `health:` and top-level `kernel:`.

A value the twin leaves out reads as NVML's NotSupported would (None: not checked), except where a real GPU
always has an answer: compute mode `default`, no clock event, no Xid. Compute mode and power limit, which
apply sets, go to the twin's overlay (in the node's state folder) like every other simulated change.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.errors import AgentFailure
from .backend import (
    AGGREGATE_ECC,
    CLOCK_EVENTS,
    COMPUTE_MODE_CODES,
    COMPUTE_MODES,
    FABRIC_HEALTH_BITS,
    FABRIC_INCORRECT_CONFIGURATION,
    FABRIC_INCORRECT_CONFIGURATION_SHIFT,
    FABRIC_STATES,
    FABRIC_SUMMARIES,
    MEMORY_LOCATION_SRAM,
    NVLINK_BER_FIELDS,
    NVLINK_CRC_FLIT,
    NVLINK_FIELDS,
    NVLINK_RECOVERY,
    NVLINK_REPLAY,
    RECOVERY_ACTIONS,
    VIOLATION_POLICIES,
    GpuLost,
)
from .twin import Twin
from .twin_health import twin_xids

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from .backend import SXidEvent, XidEvent

_STATE_CODES = {name: code for code, name in FABRIC_STATES.items()}
_RECOVERY_CODES = {name: code for code, name in RECOVERY_ACTIONS.items()}
_SUMMARY_CODES = {name: code for code, name in FABRIC_SUMMARIES.items()}
_INCORRECT_CODES = {name: code for code, name in FABRIC_INCORRECT_CONFIGURATION.items()}
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

    def kernel_events(self) -> Tuple[Optional[str], List[XidEvent], List[SXidEvent]]:
        """The twin's Xids, less those a simulated reboot left in the previous boot's log."""
        earlier = [tuple(x) for x in self.twin.state.get("xids_before_boot", [])]
        events = []
        for event in twin_xids(self.twin.gpus):
            if event in earlier:
                earlier.remove(event)
            else:
                events.append(event)
        return "twin", events, list(self.twin.sxids)

    def reset_gpus(self, gpus: List[int], together: bool) -> Optional[str]:
        """A reset fails where the twin says so (`health.reset: fails`) or the GPU is lost; a success clears
        the GPU's recovery action and volatile ECC count as the twin has them now."""
        chosen = range(len(self.twin.gpus)) if together else gpus
        for gpu in chosen:
            health = self._health(gpu)
            if health.get("lost") or health.get("reset") == "fails":
                return f"GPU {gpu}: Unable to reset this GPU (simulated: the twin's health.reset is fails)"
        for gpu in chosen:
            self._mark_recovered(gpu)
        self.twin.save_state()
        return None

    def reboot_health(self) -> None:
        """What a simulated reboot does to health: a new kernel log, every GPU reset."""
        self.twin.state["xids_before_boot"] = [list(event) for event in twin_xids(self.twin.gpus)]
        for gpu in range(len(self.twin.gpus)):
            self._mark_recovered(gpu)

    def _mark_recovered(self, gpu: int) -> None:
        health = self._health(gpu)
        volatile = (health.get("ecc") or {}).get("volatile_uncorrectable")
        seen = {"recovery_action": health.get("recovery_action"), "volatile_uncorrectable": volatile}
        self.twin.state.setdefault("recovered", {})[str(self.twin.gpus[gpu]["uuid"])] = seen

    def _recovered(self, gpu: int, key: str, value: Any) -> bool:
        """Whether a reset since cleared this value (the twin still says what it said at the reset)."""
        seen = self.twin.state.get("recovered", {}).get(str(self.twin.gpus[gpu]["uuid"]))
        return seen is not None and value is not None and seen.get(key) == value

    def uptime_s(self) -> Optional[float]:
        if self.twin.uptime_s is not None:
            return self.twin.uptime_s
        text = system.read_text("/proc/uptime")
        return float(text.split()[0]) if text else None

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
        if ecc is None:
            return None
        return 0 if self._recovered(gpu, key, ecc.get(key)) else int(ecc.get(key, 0))

    def memory_uncorrectable(self, gpu: int, counter: int, location: int) -> Optional[int]:
        ecc = self._health(gpu).get("ecc") or {}
        where = "sram" if location == MEMORY_LOCATION_SRAM else "dram"
        kind = "aggregate" if counter == AGGREGATE_ECC else "volatile"
        found = ecc.get(f"{where}_{kind}_uncorrectable")
        return None if found is None else int(found)

    def sram_threshold_exceeded(self, gpu: int) -> Optional[bool]:
        found = (self._health(gpu).get("ecc") or {}).get("sram_threshold_exceeded")
        return None if found is None else bool(found)

    def memory_unrepairable(self, gpu: int) -> Optional[bool]:
        found = self._health(gpu).get("memory_unrepairable")
        return None if found is None else bool(found)

    def retired_pages(self, gpu: int) -> Optional[Tuple[bool, int]]:
        pages = self._health(gpu).get("retired_pages")
        return None if pages is None else (pages.get("pending", False), pages.get("count", 0))

    def remapped_rows(self, gpu: int) -> Optional[Tuple[int, bool, bool]]:
        rows = self._health(gpu).get("remapped_rows")
        if rows is None:
            return None
        return rows.get("uncorrectable", 0), rows.get("pending", False), rows.get("failure", False)

    def _link_errors(self, gpu: int, link: int) -> Dict[str, int]:
        errors: List[Dict[str, int]] = self._health(gpu).get("nvlink_errors", [])
        return next((e for e in errors if e["link"] == link), {})

    def _fields_api(self, gpu: int) -> bool:
        return bool(self._health(gpu).get("nvlink_error_api") == "fields")

    def nvlink_error_counter(self, gpu: int, link: int, counter: int) -> Optional[int]:
        if self._fields_api(gpu):
            return None  # Blackwell: the counter call answers NotSupported
        key = _COUNTER_KEYS.get(counter)
        return 0 if key is None else int(self._link_errors(gpu, link).get(key, 0))

    def nvlink_error_fields(self, gpu: int, link: int) -> Dict[str, Optional[int]]:
        if not self._fields_api(gpu):
            return {name: None for _, name in NVLINK_FIELDS}
        entry = self._link_errors(gpu, link)
        return {name: int(entry.get(name, 0)) for _, name in NVLINK_FIELDS}

    def nvlink_ber(self, gpu: int) -> Dict[str, Optional[int]]:
        given = self._health(gpu).get("nvlink_ber") or {}
        # Packed as NVML packs it (nvml.h NVML_NVLINK_BER_MANTISSA_SHIFT 8, NVML_NVLINK_BER_EXP_SHIFT 0).
        return {
            name: None if name not in given else (given[name][0] << 8) | given[name][1]
            for _, name in NVLINK_BER_FIELDS
        }

    def recovery_action(self, gpu: int) -> Optional[int]:
        name = self._health(gpu).get("recovery_action")
        if self._recovered(gpu, "recovery_action", name):
            name = "none"
        return None if name is None else _RECOVERY_CODES[name]

    def violation_ns(self, gpu: int, policy: int) -> Optional[int]:
        found = self._health(gpu).get("violation_ms")
        if found is None:
            return None
        name = dict(VIOLATION_POLICIES)[policy]
        return int(found.get(name, 0)) * 1_000_000

    def enforced_power_limit_mw(self, gpu: int) -> Optional[int]:
        health = self._health(gpu)
        limits = self.power_limits_mw(gpu)
        if limits is None:
            return None
        cap = health.get("enforced_power_limit_w")  # an out-of-band (BMC) cap below the management limit
        return limits[0] if cap is None else min(limits[0], cap * 1000)

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

    def fabric_health(self, gpu: int) -> Optional[Tuple[int, Optional[int]]]:
        fabric = self._health(gpu).get("fabric")
        if fabric is None or ("health" not in fabric and "summary" not in fabric):
            return None
        problems = set(fabric.get("health", []))
        mask = 0
        for shift, name in FABRIC_HEALTH_BITS:
            mask |= (1 if name in problems else 2) << shift  # 1 TRUE, 2 FALSE
        wrong = next((_INCORRECT_CODES[name] for name in problems if name in _INCORRECT_CODES), 1)
        mask |= wrong << FABRIC_INCORRECT_CONFIGURATION_SHIFT
        summary = fabric.get("summary")
        return mask, None if summary is None else _SUMMARY_CODES[summary]

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
