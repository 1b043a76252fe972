"""GPU health: what a fleet admin asks before a training run, answered from the same facts call.

Critical Xids since boot, ECC mode and uncorrectable errors, memory repair waiting for a reset (retired pages
before Ampere, remapped rows after), NVLink error counters, hardware clock slowdowns and, on NVSwitch rigs,
the GPU's fabric registration; and whether the NVIDIA module is built for the kernels a boot can pick. None of
them can be fixed by apply: each finding names the GPU, the value and what a person should do. A value the
node could not read (None) is not judged; the facts say once which values were not checked. The rig's
`health.skip` switches a check off.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .records import Expectation, Finding

# Xids that mean the GPU needs a person: ECC/memory (48, 63, 64, 92, 94, 95), NVLink (74), off the bus (79).
# The rig file's default `health.critical_xids` (rig/models.py) is this list.
CRITICAL_XIDS = (48, 63, 64, 74, 79, 92, 94, 95)
# What each critical Xid means and what to do, after NVIDIA's Xid catalog and GPU debug guidelines.
XID_ADVICE = {
    48: ("double-bit ECC error", "drain the GPU and reset it or reboot; replace it if it recurs"),
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
}
GENERIC_XID = ("see NVIDIA's Xid catalog", "reset the GPU or reboot; look up the Xid in NVIDIA's catalog")
FAILING_THROTTLE = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal": "HW thermal slowdown",
    "hw_power_brake": "HW power brake",
}
RESTART_FABRIC = "restart nvidia-fabricmanager, then reset the GPUs or reboot"
REBUILD = "rebuild it (dkms autoinstall -k {k}, or install the prebuilt module package for that kernel)"

Facts = Dict[str, Any]
GpuHealth = Dict[str, Any]


def health(facts: Facts, expect: Expectation) -> List[Finding]:
    """Every health finding of the box, Xids first, then GPU by GPU in the order of `_PER_GPU`."""
    report = facts.get("health")
    if report is None:
        return []  # an agent that does not read health
    # Xids come from the kernel log: judged even when NVML cannot start (they often say why).
    findings = xid(report.get("xid") or (), set(expect.critical_xids)) if expect.checks("xid") else []
    for gpu in report.get("gpus") or ():
        for name, judge in _PER_GPU:
            if expect.checks(name):
                findings += judge(expect, gpu)
    return findings


def xid(events: Any, critical: Set[int]) -> List[Finding]:
    seen: Dict[Tuple[Optional[int], str, int], int] = {}
    for event in events:
        if event["code"] in critical:
            key = (event.get("gpu"), event["pci_bus_id"], event["code"])
            seen[key] = seen.get(key, 0) + 1
    findings = []
    for (gpu, address, code), times in seen.items():
        meaning, advice = XID_ADVICE.get(code, GENERIC_XID)
        who = f"GPU {gpu}" if gpu is not None else f"the GPU at {address} (no longer listed by NVML)"
        count = "" if times == 1 else f" ({times} times)"
        message = f"{who} logged Xid {code} since boot{count} ({meaning})"
        findings.append(Finding("xid", message, f"Xid {code}", "no critical Xid", gpu, advice=advice))
    return findings


def _ecc(expect: Expectation, gpu: GpuHealth) -> List[Finding]:
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
        findings.append(Finding("ecc", message, str(errors), "0", index, advice=advice))
    return findings


def _memory_repair(expect: Expectation, gpu: GpuHealth) -> List[Finding]:
    index = gpu["index"]
    reset = f"reset required: reset GPU {index} (nvidia-smi -r -i {index}) or reboot"
    if gpu.get("remapped_rows_failure"):
        message, advice = (
            f"row remapping failed on GPU {index}",
            "its memory cannot be repaired, replace the GPU",
        )
        return [Finding("memory-repair", message, "remap failed", "no failure", index, advice=advice)]
    for key, what in (("remapped_rows_pending", "remapped rows"), ("retired_pages_pending", "retired pages")):
        if gpu.get(key):
            message = f"GPU {index} has {what} pending"
            return [Finding("memory-repair", message, "pending", "none", index, advice=reset)]
    return []


def _nvlink_errors(expect: Expectation, gpu: GpuHealth) -> List[Finding]:
    limit, index = expect.nvlink_error_max, gpu["index"]
    findings = []
    for link in gpu.get("nvlink_errors") or ():
        counts = (("CRC", link["crc"]), ("replay", link["replay"]), ("recovery", link["recovery"]))
        over = [f"{count} {name}" for name, count in counts if count > limit]
        if over:
            message = f"GPU {index} link {link['link']}: {', '.join(over)} errors (more than {limit})"
            advice = "reseat or replace the bridge or cable, then reset the GPU"
            finding = Finding(
                "nvlink-errors", message, ", ".join(over), f"at most {limit}", index, advice=advice
            )
            findings.append(finding)
    return findings


def _throttle(expect: Expectation, gpu: GpuHealth) -> List[Finding]:
    active = [FAILING_THROTTLE[r] for r in gpu.get("throttle") or () if r in FAILING_THROTTLE]
    if not active:
        return []
    index = gpu["index"]
    advice = (
        "check its cooling (fans, airflow, inlet temperature) and power (PSU, cables, power brake signal)"
    )
    message = f"GPU {index} is in {', '.join(active)}"
    return [Finding("throttle", message, ", ".join(active), "no hardware slowdown", index, advice=advice)]


def _fabric(expect: Expectation, gpu: GpuHealth) -> List[Finding]:
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
    return []


_PER_GPU: Tuple[Tuple[str, Callable[[Expectation, GpuHealth], List[Finding]]], ...] = (
    ("ecc", _ecc),
    ("memory_repair", _memory_repair),
    ("nvlink_errors", _nvlink_errors),
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
        findings.append(Finding("kernel", message, "not built", "built", advice=REBUILD.format(k=running)))
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
        findings.append(Finding("kernel", message, current, desired, advice=advice))
    refused = _secure_boot_refusal(found) if found.get("secure_boot") else None
    if refused is not None:
        message, advice, current, desired = refused
        findings.append(Finding("kernel", message, current, desired, advice=advice))
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
