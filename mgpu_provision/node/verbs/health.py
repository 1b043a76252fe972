"""The `health` part of facts: ECC (DRAM and SRAM), memory repair, NVLink errors and NVLink5 BER, the
driver's recovery action, clock events and violation time, power (management and enforced limit), compute
and MIG modes and fabric state and health per GPU, the Xids and NVSwitch SXids logged since boot (those
before a GPU's recorded reset marked `cleared`: resets.py), and the kernel module's readiness.

Counters are judged as rates, not totals: each one's change since the node's previous sample this boot
(kept in the state folder, health_rates.py) comes with it, and with the interval it covers.

Every value is what NVML (or the kernel) answers, or None where the GPU or driver cannot say: None means
"not checked". Each value nobody could read is named once in `not_checked`, with the GPUs it concerns, so a
consumer GPU without ECC gives one line instead of a failure per GPU.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

import time

from ...catalog.pci import same_slot
from ...typing_lite import TYPE_CHECKING
from ..nvidia import backend as nv  # NVML's codes and names, read by each health reader
from ..nvidia.backend import Backend
from . import health_rates, resets

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    Gpu = Dict[str, Any]


class NotChecked:
    """Values nobody could read, each with the GPUs it concerns, said once per value."""

    def __init__(self) -> None:
        self.gpus: Dict[str, List[int]] = {}
        self.host: List[str] = []

    def read(self, value: str, index: int, call: Callable[[], Any]) -> Any:
        answer = call()
        if answer is None:
            self.gpus.setdefault(value, []).append(index)
        return answer

    def lines(self) -> List[str]:
        per_gpu = [
            "{}: not supported on GPU {}".format(value, ", ".join(str(i) for i in gpus))
            for value, gpus in self.gpus.items()
        ]
        return per_gpu + self.host


def health_facts(
    backend: Backend, gpus: List[Gpu], lost: List[Gpu], state_dir: Optional[str] = None
) -> Dict[str, Any]:
    """Health of the GPUs NVML could read (with their NVLinks as facts found them) and of the host; with a
    state folder, each counter's change since the previous sample (else since boot)."""
    skipped = NotChecked()
    source, events, switch_events = backend.kernel_events()
    if source is None:
        skipped.host.append("xid: no kernel log could be read (journalctl, /dev/kmsg, dmesg)")
    kernel = backend.kernel_readiness()
    if kernel is None:
        skipped.host.append("kernel: not read (no /lib/modules, or a twin without `kernel`)")
    known = [(g["index"], g["pci_bus_id"]) for g in gpus + lost if g.get("pci_bus_id")]
    xids: List[Dict[str, Any]] = [
        {"gpu": _gpu_at(address, known), "pci_bus_id": address, "code": code} for address, code in events
    ]
    cleared, note = resets.read(state_dir, backend.boot_id())
    resets.mark_cleared(xids, cleared)
    if note:
        skipped.host.append(note)
    found: Dict[str, Any] = {
        "gpus": [gpu_health(backend, gpu, skipped) for gpu in gpus],
        "xid": xids,
        "sxid": [
            {"switch": switch, "pci_bus_id": address, "code": code, "fatal": fatal}
            for switch, address, code, fatal in switch_events
        ],
        "xid_source": source,
        "kernel": kernel,
        "not_checked": skipped.lines(),
    }
    uuids = {g["index"]: g["uuid"] for g in gpus}
    health_rates.add_changes(found, uuids, state_dir, backend.boot_id(), time.time(), backend.uptime_s())
    return found


def _gpu_at(address: str, known: List[Tuple[int, str]]) -> Optional[int]:
    return next((index for index, bus in known if same_slot(address, bus)), None)


def gpu_health(backend: Backend, gpu: Gpu, skipped: NotChecked) -> Dict[str, Any]:
    index = gpu["index"]
    ecc = skipped.read("ecc", index, lambda: backend.ecc_mode(index))
    pages = backend.retired_pages(index)
    rows = backend.remapped_rows(index)
    if pages is None and rows is None:
        skipped.gpus.setdefault("memory repair", []).append(index)
    reasons = skipped.read("clock event reasons", index, lambda: backend.clock_event_reasons(index))
    power = skipped.read("power limit", index, lambda: backend.power_limits_mw(index))
    power_range = backend.power_limit_range_mw(index) if power is not None else None
    enforced = backend.enforced_power_limit_mw(index) if power is not None else None
    mode = skipped.read("compute mode", index, lambda: backend.compute_mode(index))
    mig = backend.mig_mode(index)  # NotSupported on every GPU without MIG: not worth a line
    fabric = backend.fabric_info(index)  # likewise on every GPU outside an NVSwitch fabric
    fabric_health = backend.fabric_health(index) if fabric is not None else None
    action = skipped.read("recovery action", index, lambda: backend.recovery_action(index))
    violation = {name: backend.violation_ns(index, policy) for policy, name in nv.VIOLATION_POLICIES}
    if all(v is None for v in violation.values()):
        skipped.gpus.setdefault("violation time", []).append(index)
    memory = memory_locations(backend, index) if ecc else {}
    return {
        "index": index,
        "ecc_mode": None if ecc is None else ecc[0],
        "ecc_pending_mode": None if ecc is None else ecc[1],
        "ecc_volatile_uncorrectable": backend.ecc_uncorrectable(index, nv.VOLATILE_ECC) if ecc else None,
        "ecc_aggregate_uncorrectable": backend.ecc_uncorrectable(index, nv.AGGREGATE_ECC) if ecc else None,
        "retired_pages_pending": None if pages is None else pages[0],
        "retired_pages": None if pages is None else pages[1],
        "remapped_rows_uncorrectable": None if rows is None else rows[0],
        "remapped_rows_pending": None if rows is None else rows[1],
        "remapped_rows_failure": None if rows is None else rows[2],
        "memory_unrepairable": backend.memory_unrepairable(index),
        "nvlink_errors": nvlink_errors(backend, gpu, skipped),
        # NotSupported on every GPU before NVLink5 (Blackwell): not worth a line
        "nvlink_ber": {k: v for k, v in backend.nvlink_ber(index).items() if v is not None} or None,
        "throttle": None if reasons is None else [name for bit, name in nv.CLOCK_EVENTS if reasons & bit],
        "power_limit_w": None if power is None else round(power[0] / 1000),
        "default_power_limit_w": None if power is None else round(power[1] / 1000),
        "power_limit_range_w": None if power_range is None else [round(mw / 1000) for mw in power_range],
        "compute_mode": None if mode is None else nv.COMPUTE_MODES.get(mode, "unknown"),
        "mig": None if mig is None else mig[0],
        "mig_pending": None if mig is None else mig[1],
        "fabric_state": None if fabric is None else nv.FABRIC_STATES.get(fabric[0], "unknown"),
        "fabric_status": None if fabric is None else fabric[1],
        "fabric_health": None if fabric_health is None else fabric_problems(fabric_health[0]),
        "fabric_summary": None if fabric_health is None else nv.FABRIC_SUMMARIES.get(fabric_health[1] or 0),
        "recovery_action": None if action is None else nv.RECOVERY_ACTIONS.get(action, "unknown"),
        "violation_ms": {n: v // 1_000_000 for n, v in violation.items() if v is not None} or None,
        "enforced_power_limit_w": None if enforced is None else round(enforced / 1000),
        **memory,
    }


def memory_locations(backend: Backend, index: int) -> Dict[str, Any]:
    """SRAM and DRAM uncorrectable counts apart (Hopper and later; None before) and the driver's SRAM
    threshold verdict."""
    found: Dict[str, Any] = {}
    for where, location in (("sram", nv.MEMORY_LOCATION_SRAM), ("dram", nv.MEMORY_LOCATION_DRAM)):
        for kind, counter in (("volatile", nv.VOLATILE_ECC), ("aggregate", nv.AGGREGATE_ECC)):
            found[f"ecc_{where}_{kind}_uncorrectable"] = backend.memory_uncorrectable(
                index, counter, location
            )
    found["sram_threshold_exceeded"] = backend.sram_threshold_exceeded(index)
    return found


def fabric_problems(mask: int) -> List[str]:
    """The health mask's set problems, by name (2-bit fields: 1 = true; configuration: a reason code)."""
    problems = [name for shift, name in nv.FABRIC_HEALTH_BITS if (mask >> shift) & 0x3 == 1]
    wrong = (mask >> nv.FABRIC_INCORRECT_CONFIGURATION_SHIFT) & 0xF
    if wrong in nv.FABRIC_INCORRECT_CONFIGURATION:
        problems.append(nv.FABRIC_INCORRECT_CONFIGURATION[wrong])
    return problems


def nvlink_errors(backend: Backend, gpu: Gpu, skipped: NotChecked) -> List[Dict[str, Any]]:
    """Error counters of the GPU's active links: the counter call, or where it answers NotSupported
    (Blackwell, as nvml.h says) the link's field values; a link neither can read is left out (and the GPU
    named once in `not_checked`). An inactive link is listed only with its failed recoveries."""
    found = []
    for link in gpu["nvlinks"]:
        if not link["active"]:
            # The link a failed recovery took down is inactive: its field values (NVLink5) still say so.
            fields = backend.nvlink_error_fields(gpu["index"], link["link"])
            if fields.get("recovery_failed"):
                found.append(
                    {"link": link["link"], "recovery_failed": fields["recovery_failed"], "source": "fields"}
                )
            continue
        read = [
            backend.nvlink_error_counter(gpu["index"], link["link"], counter)
            for counter in (nv.NVLINK_CRC_FLIT, nv.NVLINK_CRC_DATA, nv.NVLINK_REPLAY, nv.NVLINK_RECOVERY)
        ]
        if all(count is not None for count in read):
            flit, data, replay, recovery = (int(count or 0) for count in read)
            found.append({"link": link["link"], "crc": flit + data, "replay": replay, "recovery": recovery})
            continue
        fields = backend.nvlink_error_fields(gpu["index"], link["link"])
        fields = {name: value for name, value in fields.items() if value is not None}
        if fields:
            found.append(dict(fields, link=link["link"], source="fields"))
        elif gpu["index"] not in skipped.gpus.get("nvlink errors", []):
            skipped.gpus.setdefault("nvlink errors", []).append(gpu["index"])
    return found
