"""GPU health: what a fleet admin asks before a training run, judged as NVIDIA DCGM and the cloud health
checks judge it, answered from the same facts call.

Xids since boot or the GPU's last reset (and GPUs fallen off the bus without an Xid line), fatal NVSwitch
SXids, the driver's own recovery action, ECC mode and uncorrectable errors (SRAM apart from DRAM), memory
repair (pending, or past DCGM's limits), NVLink error rates and NVLink5 BER, hardware clock slowdowns and
thermal violation time and, on NVSwitch rigs, the GPU's fabric registration and health; and whether the
NVIDIA module is built for the kernels a boot can pick. None of them can be fixed by apply: each finding
names the GPU, the value and what a person should do. A value the node could not read (None) is not
judged; the facts say once which values were not checked. The rig's `health.skip` switches a check off.

Each default is taken from a gate that runs in the field, cited beside it: DCGM's health watch
(`modules/health/DcgmHealthWatch.cpp`, limits in `common/DcgmGPUHardwareLimits.h`), Azure's
azurehpc-health-checks (`customTests/azure_gpu_*.nhc`), leptonai/gpud and NVIDIA's Xid catalog. Counters are
judged as rates over the interval the node measured them in (`health.counters_interval_s`), as DCGM judges
the change over its watch window, never as totals since boot. Each finding's severity (fail, warn) comes
from the one table in `records.SEVERITIES` through its kind; what brings a GPU back (`recovery`: a reset or
a reboot) from the Xid catalog (`xids.py`) and NVML's recovery action.
"""

from __future__ import annotations

import re

from ..typing_lite import TYPE_CHECKING
from . import xids
from .records import Expectation, Finding

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

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
# What `recover` does for each action: a GPU reset, or a reboot where the GPU cannot be reset alone.
RECOVERY_BY_ACTION = {
    "gpu_reset": "reset",
    "drain_and_reset": "reset",
    "node_reboot": "reboot",
    "system_reboot": "reboot",
    "bus_reset": "reboot",
}

# DcgmGPUHardwareLimits.h: the retirement table is full at 63 pages; 512 uncorrectable row remaps mark a
# GPU in a bad state (azurehpc's azure_gpu_ecc.nhc fails above 512 too).
RETIRED_PAGES_LIMIT = 63
ROW_REMAP_UNCORRECTABLE_LIMIT = 512
# DCGM_LIMIT_MAX_NVLINK_ERROR (replay or recovery errors in a minute: fail; MonitorNVLink4Fields fails any
# increase within its window) and _CRC_ERROR ("CRC errors only matter at rates of 100+ per second");
# NVLink5 (Blackwell) counters fail on any rise in the window, a failed recovery on any total.
NVLINK_PER_MINUTE_LIMIT = 1.0
NVLINK_CRC_PER_SECOND_LIMIT = 100.0
NVLINK_PER_MINUTE_COUNTERS = (
    "replay",
    "recovery",
    "recovery_events",
    "recovery_failed",
    "symbol",
    # The rest of MonitorNVLink5Fields' counters (DcgmHealthWatch.cpp 2813-2826, judged at 2929-2940).
    "malformed",
    "dropped",
    "rx_errors",
    "rx_remote",
    "rx_general",
    "integrity",
    "effective_errors",
)
# NVLink5 BER as DCGM 4.6 MonitorNVLink5Fields judges it (DcgmHealthWatch.cpp 2888-2927, FAIL): NVML packs
# the mantissa in bits 8-11 and the exponent in bits 0-7, BER = mantissa * 10^-exponent (nvml.h
# NVML_NVLINK_ERROR_COUNTER_BER_GET; DcgmUtilities.cpp NvmlBerParser). The effective BER (after FEC) fails
# above 1e-12, and 15e-255 is NVML's "no error" (DcgmUtilities.cpp 1290-1305,
# IsEffectiveBerThresholdExceeded). The symbol BER (errors FEC could not correct) fails above its healthy
# floor, 15e-238 for the GPU-wide value read on Blackwell (DcgmGPUHardwareLimits.h 36,
# DCGM_SYMBOL_BER_FLOOR_EXP_AGGREGATED; DcgmHealthWatch.cpp 55-73, IsSymbolBerThresholdExceeded); a zero
# mantissa is a zero BER.
BER_ZERO = (15, 255)
EFFECTIVE_BER_EXPONENT = 12  # 1e-12; at exponent 13 a mantissa up to 10 (10e-13 = 1e-12) passes
SYMBOL_BER_FLOOR = (15, 238)
# DCGM's MonitorFabricFields: every one of these health-mask problems fails (nvml.h nvmlGpuFabricInfo_v2+).
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


FAILING_THROTTLE = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal": "HW thermal slowdown",
    "hw_power_brake": "HW power brake",
}
RESTART_FABRIC = "restart nvidia-fabricmanager, then reset the GPUs or reboot"
REBUILD = "rebuild it (dkms autoinstall -k {k}, or install the prebuilt module package for that kernel)"
REPLACE_LINK = "reseat or replace the bridge or cable, then reset the GPU"

if TYPE_CHECKING:
    Facts = Dict[str, Any]
if TYPE_CHECKING:
    GpuHealth = Dict[str, Any]


def health(facts: Facts, expect: Expectation) -> List[Finding]:
    """Every health finding of the box: Xids and SXids first, then GPU by GPU in the order of `_PER_GPU`."""
    report = facts.get("health")
    if report is None:
        return []  # an agent that does not read health
    # Xids come from the kernel log: judged even when NVML cannot start (they often say why).
    findings = xid(report.get("xid") or (), set(expect.critical_xids)) if expect.checks("xid") else []
    if expect.checks("sxid"):
        findings += sxid(report.get("sxid") or ())
    window = (report.get("counters_since"), report.get("counters_interval_s"))
    for gpu in report.get("gpus") or ():
        for name, judge in _PER_GPU:
            if expect.checks(name):
                findings += judge(expect, gpu, window)
    return findings


def xid(events: Any, critical: Set[int]) -> List[Finding]:
    """One finding per (GPU, Xid), counted: a critical Xid fails, one the catalog calls harmless to the GPU
    (`xids.NOTED`) warns, app Xids and the rest are none. An Xid the node marked `cleared` (logged before
    the GPU's last successful reset this boot) is not judged again."""
    seen: Dict[Tuple[Optional[int], str, int], int] = {}
    for event in events:
        if not event.get("cleared") and (event["code"] in critical or event["code"] in xids.NOTED):
            key = (event.get("gpu"), event["pci_bus_id"], event["code"])
            seen[key] = seen.get(key, 0) + 1
    findings = []
    for (gpu, address, code), times in seen.items():
        known = xids.entry(code)
        who = f"GPU {gpu}" if gpu is not None else f"the GPU at {address} (no longer listed by NVML)"
        count = "" if times == 1 else f" ({times} times)"
        message = f"{who} logged Xid {code} since boot{count} ({known.meaning})"
        advice = known.advice.format(index=gpu if gpu is not None else "N")
        kind, recovery = (known.resolution, xids.recovery(code)) if code in critical else ("noted", None)
        desired = "no critical Xid"
        findings.append(
            Finding("xid", message, f"Xid {code}", desired, gpu, kind, advice=advice, recovery=recovery)
        )
    return findings


def sxid(events: Any) -> List[Finding]:
    """Fatal NVSwitch SXids fail (DCGM: DCGM_FI_DEV_SXID_FATAL_ERROR fails, non-fatal ones warn)."""
    seen: Dict[Tuple[str, str, int], int] = {}
    for event in events:
        if event.get("fatal"):
            key = (event["switch"], event["pci_bus_id"], event["code"])
            seen[key] = seen.get(key, 0) + 1
    findings = []
    for (switch, address, code), times in seen.items():
        count = "" if times == 1 else f" ({times} times)"
        message = f"NVSwitch {switch} ({address}) logged fatal SXid {code} since boot{count}"
        advice = (
            "the fabric needs a reset; restart nvidia-fabricmanager and reset the GPUs, or reboot; look the "
            "SXid up in the Fabric Manager guide (appendix D)"
        )
        findings.append(Finding("sxid", message, f"SXid {code}", "no fatal SXid", advice=advice))
    return findings


if TYPE_CHECKING:
    # (counters_since: "sample" or "boot", interval in seconds)
    Window = Tuple[Optional[str], Optional[float]]


def _recovery_action(expect: Expectation, gpu: GpuHealth, window: Window) -> List[Finding]:
    action, index = gpu.get("recovery_action"), gpu["index"]
    if action in (None, "none"):
        return []
    if action in RECOVERY_MANUAL:
        message = f"the driver asks to stop peer-to-peer traffic to GPU {index} before it recovers"
        return [Finding("recovery-action", message, action, "none", index, kind="manual")]
    advice = RECOVERY_ADVICE.get(action, "see NVIDIA's documentation of the recovery action")
    message = f"the driver says GPU {index} needs recovery ({action})"
    return [
        Finding(
            "recovery-action",
            message,
            action,
            "none",
            index,
            advice=advice.format(index=index),
            recovery=RECOVERY_BY_ACTION.get(action),
        )
    ]


def _ecc(expect: Expectation, gpu: GpuHealth, window: Window) -> List[Finding]:
    findings = []
    want, mode, index = expect.ecc, gpu.get("ecc_mode"), gpu["index"]
    state = {True: "on", False: "off"}
    if want is not None and mode is not None and mode is not want:
        pending = " (a change is pending: reboot to apply it)" if gpu.get("ecc_pending_mode") is want else ""
        message = f"ECC is {state[mode]} on GPU {index}, the rig expects {state[want]}{pending}"
        advice = f"nvidia-smi -i {index} -e {int(want)}, then reboot"
        findings.append(Finding("ecc", message, state[mode], state[want], index, advice=advice))
    errors = gpu.get("ecc_volatile_uncorrectable")
    if errors:
        message = f"GPU {index} has {errors} uncorrectable ECC error(s) since the driver loaded"
        advice = "drain it and reset it or reboot; replace it if they come back"
        findings.append(Finding("ecc", message, str(errors), "0", index, advice=advice, recovery="reset"))
    # azurehpc's azure_gpu_ecc.nhc fails on any uncorrectable SRAM error, volatile or aggregate: SRAM is
    # on-chip and row remapping (which repairs DRAM) cannot fix it. The driver's threshold verdict too.
    sram_keys = ("ecc_sram_volatile_uncorrectable", "ecc_sram_aggregate_uncorrectable")
    sram = max(gpu.get(key) or 0 for key in sram_keys)
    said = [f"{sram} uncorrectable SRAM (on-chip) ECC error(s)"] if sram else []
    if gpu.get("sram_threshold_exceeded"):
        said.append("the driver's SRAM error threshold exceeded")
    if said:
        message = f"GPU {index} has {' and '.join(said)}"
        advice = "row remapping cannot repair SRAM; drain it and replace the GPU"
        findings.append(Finding("ecc", message, f"{sram} SRAM", "0", index, advice=advice))
    return findings


def _memory_repair(expect: Expectation, gpu: GpuHealth, window: Window) -> List[Finding]:
    index = gpu["index"]
    reset = f"reset required: reset GPU {index} (nvidia-smi -r -i {index}) or reboot"
    replace = "replace the GPU"
    if gpu.get("memory_unrepairable"):  # DCGM MonitorMemUnrepairableFlag: FAIL
        message = f"GPU {index} has memory it cannot repair (NVML's unrepairable-memory flag)"
        return [Finding("memory-repair", message, "unrepairable", "repairable", index, advice=replace)]
    if gpu.get("remapped_rows_failure"):
        message, advice = (
            f"row remapping failed on GPU {index}",
            "its memory cannot be repaired, replace the GPU",
        )
        return [Finding("memory-repair", message, "remap failed", "no failure", index, advice=advice)]
    pages, rows = gpu.get("retired_pages"), gpu.get("remapped_rows_uncorrectable")
    if pages is not None and pages >= RETIRED_PAGES_LIMIT:
        message = f"GPU {index} has {pages} retired pages, the limit of its retirement table"
        desired = f"< {RETIRED_PAGES_LIMIT}"
        message = f"{message} ({RETIRED_PAGES_LIMIT})"
        return [Finding("memory-repair", message, f"{pages} pages", desired, index, advice=replace)]
    if rows is not None and rows >= ROW_REMAP_UNCORRECTABLE_LIMIT:
        message = (
            f"GPU {index} has remapped {rows} rows for uncorrectable errors "
            f"({ROW_REMAP_UNCORRECTABLE_LIMIT} or more: a GPU in a bad state)"
        )
        desired = f"< {ROW_REMAP_UNCORRECTABLE_LIMIT}"
        return [
            Finding("memory-repair", message, f"{rows} rows", desired, index, "rows-limit", advice=replace)
        ]
    for key, what in (("remapped_rows_pending", "remapped rows"), ("retired_pages_pending", "retired pages")):
        if gpu.get(key):
            message = f"GPU {index} has {what} pending"
            return [
                Finding(
                    "memory-repair",
                    message,
                    "pending",
                    "none",
                    index,
                    "pending",
                    advice=reset,
                    recovery="reset",
                )
            ]
    return []


def _nvlink_errors(expect: Expectation, gpu: GpuHealth, window: Window) -> List[Finding]:
    """Each link's counters over the interval the node measured: over a sampled window, as DCGM judges
    its one-minute window, any rise of replay, recovery or the NVLink5 counters fails (CRC: 100 per second);
    since boot (no earlier sample) the same as rates (1 per minute). A failed link recovery
    (`recovery_failed`) is lasting, as DCGM's NVLINK_RECOVERY_FAILED_TOTAL > 0 fails: its total is judged,
    whatever the window. From an agent that reports no changes, the totals against nvlink_error_max."""
    index, (since, interval) = gpu["index"], window
    findings = []
    for link in gpu.get("nvlink_errors") or ():
        where = f"GPU {index} link {link['link']}"
        failed = link.get("recovery_failed")
        if failed:
            message = f"{where}: {failed} failed link recover{'y' if failed == 1 else 'ies'} this boot"
            advice = "the link stays down until the GPU is reset; " + REPLACE_LINK
            current = f"{failed} failed"
            findings.append(
                Finding(
                    "nvlink-errors",
                    message,
                    current,
                    "0",
                    index,
                    "recovery-failed",
                    advice=advice,
                    recovery="reset",
                )
            )
        change = link.get("change")
        if change is None or not interval:
            limit = expect.nvlink_error_max
            labels = (("crc", "CRC"), ("replay", "replay"), ("recovery", "recovery"))
            counts = [(label, link.get(key)) for key, label in labels]
            over = [f"{count} {name}" for name, count in counts if count is not None and count > limit]
            if over:
                message = f"{where}: {', '.join(over)} errors (more than {limit})"
                desired = f"at most {limit}"
                findings.append(
                    Finding("nvlink-errors", message, ", ".join(over), desired, index, advice=REPLACE_LINK)
                )
            continue
        minutes = interval / 60.0
        windowed = since == "sample"
        over = [
            f"{name} +{change[name]}" if windowed else f"{name} {change[name] / minutes:.1f}/min"
            for name in NVLINK_PER_MINUTE_COUNTERS
            if name != "recovery_failed"
            and change.get(name)
            and (windowed or change[name] / minutes >= NVLINK_PER_MINUTE_LIMIT)
        ]
        crc = change.get("crc") or 0
        if crc / interval >= NVLINK_CRC_PER_SECOND_LIMIT:
            over.append(f"CRC {crc / interval:.0f}/s")
        if over:
            message = f"{where}: {', '.join(over)} over the last {_duration(interval)}"
            desired = (
                "no replay/recovery error in the window"
                if windowed
                else f"< {NVLINK_PER_MINUTE_LIMIT:g} replay/recovery per minute"
            ) + f", < {NVLINK_CRC_PER_SECOND_LIMIT:g} CRC per second"
            findings.append(
                Finding("nvlink-errors", message, ", ".join(over), desired, index, advice=REPLACE_LINK)
            )
    return findings


def ber_parts(packed: int) -> Tuple[int, int]:
    """(mantissa, exponent) of a BER field value as NVML packs it."""
    return (packed >> 8) & 0xF, packed & 0xFF


def effective_ber_exceeded(mantissa: int, exponent: int) -> bool:
    """DCGM's IsEffectiveBerThresholdExceeded: above 1e-12, compared on the packed parts."""
    if (mantissa, exponent) == BER_ZERO:
        return False
    limit = EFFECTIVE_BER_EXPONENT
    at_limit = exponent == limit and mantissa > 1
    return exponent < limit or at_limit or (exponent == limit + 1 and mantissa > 10)


def symbol_ber_exceeded(mantissa: int, exponent: int) -> bool:
    """DCGM's IsSymbolBerThresholdExceeded with the aggregated floor: worse than 15e-238."""
    floor_mantissa, floor_exponent = SYMBOL_BER_FLOOR
    if mantissa == 0:
        return False
    return exponent < floor_exponent or (exponent == floor_exponent and mantissa > floor_mantissa)


_BER_JUDGES = (
    ("effective", effective_ber_exceeded, "NVLink effective BER (after FEC)", "at most 1e-12"),
    ("symbol", symbol_ber_exceeded, "NVLink symbol BER (errors FEC could not correct)", "at most 15e-238"),
)


def _nvlink_ber(expect: Expectation, gpu: GpuHealth, window: Window) -> List[Finding]:
    """The GPU's NVLink5 BER over all its links: a value, not a counter, so judged whatever the window."""
    found, index = gpu.get("nvlink_ber") or {}, gpu["index"]
    findings = []
    for name, exceeded, what, desired in _BER_JUDGES:
        if found.get(name) is None:
            continue
        mantissa, exponent = ber_parts(found[name])
        if exceeded(mantissa, exponent):
            current = f"{mantissa}e-{exponent}"
            message = f"GPU {index}: {what} is {current}"
            advice = (
                f"find the link by its error counters (nvidia-smi nvlink -e -i {index}), reseat or replace "
                "its cable or tray, then reset the GPU"
            )
            findings.append(
                Finding("nvlink-errors", message, current, desired, index, f"{name}-ber", advice=advice)
            )
    return findings


def _throttle(expect: Expectation, gpu: GpuHealth, window: Window) -> List[Finding]:
    active = [FAILING_THROTTLE[r] for r in gpu.get("throttle") or () if r in FAILING_THROTTLE]
    index = gpu["index"]
    findings = []
    if active:
        advice = (
            "check its cooling (fans, airflow, inlet temperature) and power (PSU, cables, power brake signal)"
        )
        message = f"GPU {index} is in {', '.join(active)}"
        desired = "no hardware slowdown"
        findings.append(
            Finding("throttle", message, ", ".join(active), desired, index, "slowdown", advice=advice)
        )
    since, interval = window
    change = gpu.get("change") or {}
    if since == "sample" and interval:  # a real window, as DCGM's; never the time since boot
        grown = {name: change.get(f"violation_{name}_ms") for name in VIOLATIONS_JUDGED}
        grew = [f"{name} {ms} ms" for name, ms in grown.items() if ms]
        if grew:
            held = ", ".join(grew)
            message = f"GPU {index} had its clocks held down ({held}) over the last {_duration(interval)}"
            desired, advice = "no thermal violation time", "check its cooling and airflow"
            findings.append(Finding("throttle", message, held, desired, index, "violation", advice=advice))
    return findings


def _fabric(expect: Expectation, gpu: GpuHealth, window: Window) -> List[Finding]:
    state, status, index = gpu.get("fabric_state"), gpu.get("fabric_status"), gpu["index"]
    if expect.bridge_kind != "nvswitch" or state in (None, "not_supported"):
        return []  # only NVSwitch rigs of Hopper and later register with a fabric
    if state != "completed":
        advice = (
            "check that nvidia-fabricmanager is running and its log; "
            "CUDA cannot use the GPU until it completes"
        )
        message = f"GPU {index} fabric registration is {state}"
        return [Finding("fabric", message, state, "completed", index, advice=advice)]
    if status not in (None, "success"):
        message, advice = f"GPU {index} fabric registration failed ({status})", RESTART_FABRIC
        return [Finding("fabric", message, status, "success", index, advice=advice)]
    problems = [FABRIC_PROBLEMS[p] for p in gpu.get("fabric_health") or () if p in FABRIC_PROBLEMS]
    summary = gpu.get("fabric_summary")
    if summary in FABRIC_FAILING_SUMMARIES:
        problems.append(f"the fabric reports it {summary.replace('_', ' ')}")
    if not problems:
        return []
    message = f"GPU {index} on the NVSwitch fabric: {'; '.join(problems)}"
    advice = "check the NVLink trays and cables and the Fabric Manager log, then reset the GPUs or reboot"
    current = ", ".join(list(gpu.get("fabric_health") or []) + ([summary] if summary else []))
    return [Finding("fabric", message, current, "healthy", index, advice=advice)]


def _duration(seconds: float) -> str:
    for limit, unit, size in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / 86400:.0f} days"


_PER_GPU: Tuple[Tuple[str, Callable[[Expectation, GpuHealth, Window], List[Finding]]], ...] = (
    ("recovery_action", _recovery_action),
    ("ecc", _ecc),
    ("memory_repair", _memory_repair),
    ("nvlink_errors", _nvlink_errors),
    ("nvlink_errors", _nvlink_ber),
    ("throttle", _throttle),
    ("fabric", _fabric),
)


def kernel_key(version: str) -> Tuple[Any, ...]:
    """Orders 6.8.0-47-generic after 6.8.0-45-generic and 6.10 after 6.9 (numbers compared as numbers)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"[.\-+_~]", version))


def kernel(facts: Facts, expect: Expectation) -> List[Finding]:
    """The NVIDIA module is built for the running kernel and for the one the next boot picks, and signed
    where Secure Boot would refuse it. Only judged where a driver is installed (otherwise the driver check
    says what to install) and the node could look at its kernels.

    The classic failure after an unattended kernel upgrade is a box that reboots into a kernel DKMS never
    built the module for, and comes up without a GPU driver; this says so before the reboot.
    """
    report = facts.get("health") or {}
    found = report.get("kernel")
    driver = facts.get("driver") or {}
    if found is None or not expect.checks("kernel") or expect.os != "linux":
        return []
    if not (driver.get("installed") or driver.get("version")):
        return []
    findings: List[Finding] = []
    running, installed = found["running"], found.get("installed") or []
    built = set(found.get("nvidia_module_for") or ())
    if running not in built:
        message = f"the NVIDIA module is not built for the running kernel {running}"
        advice = REBUILD.format(k=running)
        findings.append(Finding("kernel", message, "not built", "built", kind="running", advice=advice))
    newest = max(installed, key=kernel_key) if installed else None
    following = found.get("next_boot") or newest  # the bootloader's default, else GRUB's first: the newest
    if following is not None and following != running and following not in built:
        which = "the bootloader's default" if found.get("next_boot") else "the newest installed"
        message = f"the NVIDIA module is not built for kernel {following}, {which}"
        advice = (
            "the next reboot would come up without a GPU driver; "
            f"{REBUILD.format(k=following)}, or hold the kernel"
        )
        current, desired = f"{following}: not built", f"{following}: built"
        findings.append(Finding("kernel", message, current, desired, kind="next-boot", advice=advice))
    refused = _secure_boot_refusal(found) if found.get("secure_boot") else None
    if refused is not None:
        message, advice, current, desired = refused
        findings.append(Finding("kernel", message, current, desired, kind="secure-boot", advice=advice))
    return findings


def _secure_boot_refusal(found: Dict[str, Any]) -> Optional[Tuple[str, str, str, str]]:
    """(message, advice, current, desired) when Secure Boot makes the kernel refuse the NVIDIA module."""
    if found.get("module_signed") is False:
        return (
            "Secure Boot is on and the NVIDIA module is unsigned, so the kernel refuses it",
            "sign it with an enrolled MOK key (DKMS does when mokutil has its key), or use the "
            "distribution's signed modules",
            "unsigned",
            "signed",
        )
    if found.get("module_key_enrolled") is False:
        # A signer is not enough: a DKMS module signed with a MOK that was never enrolled is refused too.
        return (
            "Secure Boot is on and the NVIDIA module is signed with a key that is not enrolled",
            "the kernel refuses it: enroll the key (mokutil --import, then confirm at the next boot) or use "
            "the distribution's signed prebuilt modules",
            "key not enrolled",
            "key enrolled",
        )
    return None
