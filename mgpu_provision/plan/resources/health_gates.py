"""The health gates' thresholds, as NVIDIA DCGM and the cloud health checks judge a GPU, with the advice for
each failure; pure functions over the facts' plain values.

Each default is taken from a gate that runs in the field, cited beside it: DCGM's health watch
(`modules/health/DcgmHealthWatch.cpp`, limits in `common/DcgmGPUHardwareLimits.h`), Azure's
azurehpc-health-checks (`customTests/azure_gpu_*.nhc`), leptonai/gpud and NVIDIA's Xid catalog. Counters are
judged as rates over the interval the node measured them in (`HostHealth.counters_interval_s`), as DCGM
judges the change over its watch window, never as totals since boot.

Standard library only, Python 3.8 syntax: the shipped judge uses these tables as they are.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

Failure = Tuple[str, str, str, str]  # (check, summary, current, desired)

# Critical Xids: (meaning, what to do). DCGM's "devastating" Xids (48, 74, 79, 95, 119, 120, 140 fail on
# every watch), azurehpc-health-checks' azure_gpu_xid.nhc list (48 56 57 58 62 63 64 65 68 69 73 74 79 80
# 81 92 119 120), and the NVIDIA Xid catalog's RESET_GPU / RESTART_BM resolutions (62, 143, 154, 155, 158,
# 169) and fatal NVLink5 reports (149, "NETIR ... Fatal" on GB200).
RESET = "reset the GPU (nvidia-smi -r -i {index}, no process on it) or reboot"
XID_ADVICE: Dict[int, Tuple[str, str]] = {
    48: ("double-bit ECC error", "drain the GPU and reset it or reboot; replace it if it recurs"),
    62: ("internal micro-controller (PMU) halt", RESET + "; replace it if it recurs"),
    63: ("ECC page retirement or row remap recorded", "reset the GPU or reboot to apply the repair"),
    64: ("ECC page retirement or row remap failed", "the memory cannot be repaired: replace the GPU"),
    74: ("NVLink error", "reset the GPU; reseat or replace the bridge or cable if it recurs"),
    79: (
        "GPU has fallen off the bus",
        "reboot, then check its power cables and PCIe seating; replace it if it recurs",
    ),
    92: ("high single-bit ECC error rate", "reset the GPU; replace it if the rate stays high"),
    94: ("contained ECC error", "reset the GPU or reboot (the application that hit it was stopped)"),
    95: ("uncontained ECC error", "reset the GPU or reboot: every application on it was affected"),
    119: (
        "GSP RPC timeout",
        RESET + "; if it recurs, update the driver (R525 before 525.105.17 had this bug) or report it",
    ),
    120: ("GSP error", RESET + "; if it recurs, update the driver or report it to NVIDIA"),
    140: ("ECC unrecovered error", RESET + "; replace the GPU if it recurs"),
    143: ("GPU initialization error", RESET + "; replace the GPU if it does not come back"),
    149: (
        "fatal NVLink network (NETIR) error",
        "reset the GPU or reboot the tray; check the NVLink cables and the switch tray it names",
    ),
    154: ("the driver changed the GPU's recovery action", "do what the recovery-action check says"),
    155: ("NVLink software-defined error", RESET),
    158: ("GPU fatal timeout", RESET + "; replace the GPU if it recurs"),
    169: ("internal micro-controller (SEC2) halt", RESET + "; replace it if it recurs"),
}
CRITICAL_XIDS = tuple(sorted(XID_ADVICE))
# Raised by applications, not by the GPU: the catalog's RESTART_APP/IGNORE (13 graphics exception, 31 page
# fault, 43 channel stopped, 45 preemptive cleanup after another error). Reported in facts, never a failure.
APP_XIDS = (13, 31, 43, 45)
GENERIC_XID = ("see NVIDIA's Xid catalog", "reset the GPU or reboot; look up the Xid in NVIDIA's catalog")

# nvmlDeviceGpuRecoveryAction_t (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): DCGM's health watch fails
# gpu_reset, node_reboot and drain_and_reset and warns on drain_p2p.
RECOVERY_ADVICE = {
    "gpu_reset": "reset the GPU (nvidia-smi -r -i {index}) once no process holds it",
    "node_reboot": "reboot the node",
    "drain_and_reset": "drain the GPU (stop new work), then reset it",
    "bus_reset": "reset the GPU's PCIe bus (reboot if that is not possible)",
    "system_reboot": "reboot the node",
    "recover_imex_domain": "recover the IMEX domain (restart nvidia-imex on its nodes)",
}
RECOVERY_MANUAL = ("drain_p2p",)  # DCGM: WARN; peer-to-peer traffic must stop before the GPU recovers

# DcgmGPUHardwareLimits.h: the retirement table is full at 63 pages; 512 uncorrectable row remaps mark a
# GPU in a bad state (azurehpc's azure_gpu_ecc.nhc fails above 512 too).
RETIRED_PAGES_LIMIT = 63
ROW_REMAP_UNCORRECTABLE_LIMIT = 512
# DCGM_LIMIT_MAX_NVLINK_ERROR (replay or recovery errors in a minute: fail) and _CRC_ERROR ("CRC errors
# only matter at rates of 100+ per second"); NVLink5 (Blackwell) counters fail on any rise in the minute.
NVLINK_PER_MINUTE_LIMIT = 1.0
NVLINK_CRC_PER_SECOND_LIMIT = 100.0
NVLINK_PER_MINUTE_COUNTERS = ("replay", "recovery", "recovery_events", "recovery_failed", "symbol")
# DCGM's MonitorFabric: every one of these health-mask problems fails (nvml.h nvmlGpuFabricInfo_v2+).
FABRIC_PROBLEMS = {
    "degraded_bandwidth": "its NVLink bandwidth is degraded",
    "route_recovery": "a route is in recovery",
    "route_unhealthy": "a route is unhealthy",
    "access_timeout_recovery": "an access timeout is being recovered",
    "incorrect_sysguid": "the configuration is wrong (system GUID)",
    "incorrect_chassis_sn": "the configuration is wrong (chassis serial number)",
    "no_partition": "the configuration is wrong (no partition)",
    "insufficient_nvlinks": "the configuration is wrong (too few NVLinks)",
    "incompatible_gpu_firmware": "the configuration is wrong (incompatible GPU firmware)",
    "invalid_location": "the configuration is wrong (invalid location)",
    "gpu_state_invalid": "the configuration is wrong (GPU state invalid)",
}
FABRIC_FAILING_SUMMARIES = ("unhealthy", "limited_capacity")
# DCGM's MonitorThermal warns on any thermal violation time in its window; power and board-limit time is
# what a cap is for. Judged only over a real window (a previous sample), never over the time since boot.
VIOLATIONS_JUDGED = ("thermal", "reliability")


def xid_failures(events: List[Dict[str, Any]], critical: List[int]) -> List[Failure]:
    """One failure per (GPU, critical Xid), counted; app Xids and the rest are no failure."""
    seen: Dict[Tuple[Optional[int], str, int], int] = {}
    for event in events:
        if event["code"] in critical:
            key = (event.get("gpu"), event["pci_bus_id"], event["code"])
            seen[key] = seen.get(key, 0) + 1
    failures = []
    for (gpu, address, code), times in seen.items():
        meaning, advice = XID_ADVICE.get(code, GENERIC_XID)
        advice = advice.format(index=gpu if gpu is not None else "N")
        who = "GPU %d" % gpu if gpu is not None else "the GPU at %s (no longer listed by NVML)" % address
        count = "" if times == 1 else " (%d times)" % times
        summary = "%s logged Xid %d since boot%s (%s): %s" % (who, code, count, meaning, advice)
        failures.append(("xid", summary, "Xid %d" % code, "no critical Xid"))
    return failures


def sxid_failures(events: List[Dict[str, Any]]) -> List[Failure]:
    """Fatal NVSwitch SXids fail (DCGM: DCGM_FI_DEV_SXID_FATAL_ERROR); non-fatal ones do not."""
    seen: Dict[Tuple[str, str, int], int] = {}
    for event in events:
        if event.get("fatal"):
            key = (event["switch"], event["pci_bus_id"], event["code"])
            seen[key] = seen.get(key, 0) + 1
    failures = []
    for (switch, address, code), times in seen.items():
        count = "" if times == 1 else " (%d times)" % times
        summary = (
            "NVSwitch %s (%s) logged fatal SXid %d since boot%s: the fabric needs a reset; restart "
            "nvidia-fabricmanager and reset the GPUs, or reboot; look the SXid up in the Fabric Manager "
            "guide (appendix D)" % (switch, address, code, count)
        )
        failures.append(("sxid", summary, "SXid %d" % code, "no fatal SXid"))
    return failures


def recovery_failure(gpu: Dict[str, Any]) -> Optional[Tuple[str, Failure]]:
    """(action kind, failure) for a GPU whose driver asks for recovery: "check" or "manual" (drain P2P)."""
    action = gpu.get("recovery_action")
    if action in (None, "none"):
        return None
    index = gpu["index"]
    if action in RECOVERY_MANUAL:
        summary = "the driver asks to stop peer-to-peer traffic to GPU %d before it recovers" % index
        return "manual", ("recovery-action", summary, action, "none")
    advice = RECOVERY_ADVICE.get(action, "see NVIDIA's documentation of the recovery action")
    advice = advice.format(index=index)
    summary = "the driver says GPU %d needs recovery (%s): %s" % (index, action, advice)
    return "check", ("recovery-action", summary, action, "none")


def memory_failures(gpu: Dict[str, Any]) -> List[Failure]:
    """SRAM errors (never repaired by remapping), a full retirement table, too many uncorrectable remaps."""
    index, failures = gpu["index"], []
    sram = [gpu.get("ecc_sram_volatile_uncorrectable"), gpu.get("ecc_sram_aggregate_uncorrectable")]
    found = max(count or 0 for count in sram)
    said = ["%d uncorrectable SRAM (on-chip) ECC error(s)" % found] if found else []
    if gpu.get("sram_threshold_exceeded"):
        said.append("the driver's SRAM error threshold exceeded")
    if said:
        summary = "GPU %d has %s: row remapping cannot repair SRAM; drain it and replace the GPU" % (
            index,
            " and ".join(said),
        )
        failures.append(("ecc", summary, "%d SRAM" % found, "0"))
    pages = gpu.get("retired_pages")
    if pages is not None and pages >= RETIRED_PAGES_LIMIT:
        summary = "GPU %d has %d retired pages, the limit of its retirement table (%d): replace the GPU" % (
            index,
            pages,
            RETIRED_PAGES_LIMIT,
        )
        failures.append(("memory-repair", summary, "%d pages" % pages, "< %d" % RETIRED_PAGES_LIMIT))
    rows = gpu.get("remapped_rows_uncorrectable")
    if rows is not None and rows >= ROW_REMAP_UNCORRECTABLE_LIMIT:
        summary = "GPU %d has remapped %d rows for uncorrectable errors (%d or more: a GPU in a bad " % (
            index,
            rows,
            ROW_REMAP_UNCORRECTABLE_LIMIT,
        )
        summary += "state): replace the GPU"
        failures.append(("memory-repair", summary, "%d rows" % rows, "< %d" % ROW_REMAP_UNCORRECTABLE_LIMIT))
    return failures


def nvlink_failures(gpu: Dict[str, Any], interval_s: Optional[float], total_max: int) -> List[Failure]:
    """Each link's counters as rates over the interval (replay/recovery and NVLink5 counters per minute,
    CRC per second); from an agent that sent no changes, the totals against `total_max` as before."""
    failures = []
    for link in gpu.get("nvlink_errors") or ():
        where = "GPU %d link %d" % (gpu["index"], link["link"])
        change = link.get("change")
        if change is None or not interval_s:
            over = [
                "%d %s" % (link[name], label)
                for name, label in (("crc", "CRC"), ("replay", "replay"), ("recovery", "recovery"))
                if link.get(name) is not None and link[name] > total_max
            ]
            if over:
                summary = "%s: %s errors (more than %d): reseat or replace the bridge or cable, " % (
                    where,
                    ", ".join(over),
                    total_max,
                )
                summary += "then reset the GPU"
                failures.append(("nvlink-errors", summary, ", ".join(over), "at most %d" % total_max))
            continue
        minutes = interval_s / 60.0
        over = [
            "%s %.1f/min" % (name, change[name] / minutes)
            for name in NVLINK_PER_MINUTE_COUNTERS
            if change.get(name) and change[name] / minutes >= NVLINK_PER_MINUTE_LIMIT
        ]
        crc = change.get("crc") or 0
        if crc / interval_s >= NVLINK_CRC_PER_SECOND_LIMIT:
            over.append("CRC %.0f/s" % (crc / interval_s))
        if over:
            summary = "%s: %s over the last %s: reseat or replace the bridge or cable, then reset the GPU" % (
                where,
                ", ".join(over),
                _duration(interval_s),
            )
            failures.append(
                (
                    "nvlink-errors",
                    summary,
                    ", ".join(over),
                    "< %g replay/recovery per minute, < %g CRC per second"
                    % (NVLINK_PER_MINUTE_LIMIT, NVLINK_CRC_PER_SECOND_LIMIT),
                )
            )
    return failures


def violation_failures(
    gpu: Dict[str, Any], since: Optional[str], interval_s: Optional[float]
) -> List[Failure]:
    """Thermal or reliability clock-limit time that grew over a real window (a previous sample)."""
    change = gpu.get("change") or {}
    if since != "sample" or not interval_s:
        return []
    grew = [
        "%s %d ms" % (name, change["violation_%s_ms" % name])
        for name in VIOLATIONS_JUDGED
        if change.get("violation_%s_ms" % name)
    ]
    if not grew:
        return []
    summary = "GPU %d had its clocks held down (%s) over the last %s: check its cooling and airflow" % (
        gpu["index"],
        ", ".join(grew),
        _duration(interval_s),
    )
    return [("throttle", summary, ", ".join(grew), "no thermal violation time")]


def fabric_failures(gpu: Dict[str, Any]) -> List[Failure]:
    """Problems the fabric health mask sets, and a v3 summary of unhealthy or limited capacity."""
    problems = [FABRIC_PROBLEMS[p] for p in gpu.get("fabric_health") or () if p in FABRIC_PROBLEMS]
    summary_word = gpu.get("fabric_summary")
    if summary_word in FABRIC_FAILING_SUMMARIES:
        problems.append("the fabric reports it %s" % summary_word.replace("_", " "))
    if not problems:
        return []
    summary = "GPU %d on the NVSwitch fabric: %s; check the NVLink trays and cables and the Fabric " % (
        gpu["index"],
        "; ".join(problems),
    )
    summary += "Manager log, then reset the GPUs or reboot"
    current = ", ".join(list(gpu.get("fabric_health") or []) + ([summary_word] if summary_word else []))
    return [("fabric", summary, current, "healthy")]


def _duration(seconds: float) -> str:
    if seconds < 120:
        return "%.0f s" % seconds
    if seconds < 7200:
        return "%.0f min" % (seconds / 60)
    if seconds < 172800:
        return "%.0f h" % (seconds / 3600)
    return "%.0f days" % (seconds / 86400)
