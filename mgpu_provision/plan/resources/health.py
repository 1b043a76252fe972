"""GPU health checks: what a fleet admin asks before a training run, answered from the same facts call.

Critical Xids since boot, ECC mode and uncorrectable errors, memory repair waiting for a reset
(retired pages before Ampere, remapped rows after), NVLink error counters, hardware clock slowdowns and, on
NVSwitch rigs, the GPU's fabric registration. None of them can be fixed by apply: each is a failed check that
names the GPU, the value and what a person should do. A value the node could not read (None) is not judged;
the facts say once which values were not checked. `health.skip` in the rig switches a check off.
"""

from __future__ import annotations

from ...facts import GpuHealth, HostHealth
from ..change import Change, HostContext, check_failed

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


def diff(ctx: HostContext) -> list[Change]:
    checks, health = ctx.rig.health, ctx.facts.health
    if health is None:
        return []
    # Xids come from the kernel log: judged even when NVML cannot start (they often say why).
    changes = _xid(health, set(checks.critical_xids)) if checks.checks("xid") else []
    for gpu in health.gpus:
        for name, judge in _PER_GPU:
            if checks.checks(name):
                changes += judge(ctx, gpu)
    return changes


def _xid(health: HostHealth, critical: set[int]) -> list[Change]:
    seen: dict[tuple[int | None, str, int], int] = {}
    for event in health.xid:
        if event.code in critical:
            key = (event.gpu, event.pci_bus_id, event.code)
            seen[key] = seen.get(key, 0) + 1
    changes = []
    for (gpu, address, code), times in seen.items():
        meaning, advice = XID_ADVICE.get(code, GENERIC_XID)
        who = f"GPU {gpu}" if gpu is not None else f"the GPU at {address} (no longer listed by NVML)"
        count = "" if times == 1 else f" ({times} times)"
        summary = f"{who} logged Xid {code} since boot{count} ({meaning}): {advice}"
        changes.append(check_failed("xid", summary, f"Xid {code}", "no critical Xid"))
    return changes


def _ecc(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    changes = []
    want = ctx.rig.health.ecc
    state = {True: "on", False: "off"}
    if want is not None and gpu.ecc_mode is not None and gpu.ecc_mode is not want:
        pending = " (a change is pending: reboot to apply it)" if gpu.ecc_pending_mode is want else ""
        summary = (
            f"ECC is {state[gpu.ecc_mode]} on GPU {gpu.index}, the rig expects {state[want]}{pending}: "
            f"nvidia-smi -i {gpu.index} -e {int(want)}, then reboot"
        )
        changes.append(check_failed("ecc", summary, state[gpu.ecc_mode], state[want]))
    if gpu.ecc_volatile_uncorrectable:
        summary = (
            f"GPU {gpu.index} has {gpu.ecc_volatile_uncorrectable} uncorrectable ECC error(s) since the "
            "driver loaded: drain it and reset it or reboot; replace it if they come back"
        )
        changes.append(check_failed("ecc", summary, str(gpu.ecc_volatile_uncorrectable), "0"))
    return changes


def _memory_repair(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    reset = f"reset required: reset GPU {gpu.index} (nvidia-smi -r -i {gpu.index}) or reboot"
    if gpu.remapped_rows_failure:
        summary = f"row remapping failed on GPU {gpu.index}: its memory cannot be repaired, replace the GPU"
        return [check_failed("memory-repair", summary, "remap failed", "no failure")]
    if gpu.remapped_rows_pending:
        return [
            check_failed(
                "memory-repair", f"GPU {gpu.index} has remapped rows pending: {reset}", "pending", "none"
            )
        ]
    if gpu.retired_pages_pending:
        return [
            check_failed(
                "memory-repair", f"GPU {gpu.index} has retired pages pending: {reset}", "pending", "none"
            )
        ]
    return []


def _nvlink_errors(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    limit = ctx.rig.health.nvlink_error_max
    changes = []
    for link in gpu.nvlink_errors:
        over = [
            f"{count} {name}"
            for name, count in (("CRC", link.crc), ("replay", link.replay), ("recovery", link.recovery))
            if count is not None and count > limit
        ]
        if over:
            summary = (
                f"GPU {gpu.index} link {link.link}: {', '.join(over)} errors (more than {limit}): "
                "reseat or replace the bridge or cable, then reset the GPU"
            )
            changes.append(check_failed("nvlink-errors", summary, ", ".join(over), f"at most {limit}"))
    return changes


def _throttle(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    active = [FAILING_THROTTLE[r] for r in gpu.throttle or () if r in FAILING_THROTTLE]
    if not active:
        return []
    summary = (
        f"GPU {gpu.index} is in {', '.join(active)}: check its cooling (fans, airflow, inlet temperature) "
        "and power (PSU, cables, power brake signal)"
    )
    return [check_failed("throttle", summary, ", ".join(active), "no hardware slowdown")]


def _fabric(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    if ctx.rig.bridge.kind != "nvswitch" or gpu.fabric_state in (None, "not_supported"):
        return []  # only NVSwitch rigs of Hopper and later register with a fabric
    if gpu.fabric_state != "completed":
        summary = (
            f"GPU {gpu.index} fabric registration is {gpu.fabric_state}: check that nvidia-fabricmanager is "
            "running and its log; CUDA cannot use the GPU until it completes"
        )
        return [check_failed("fabric", summary, gpu.fabric_state, "completed")]
    if gpu.fabric_status not in (None, "success"):
        summary = (
            f"GPU {gpu.index} fabric registration failed ({gpu.fabric_status}): restart "
            "nvidia-fabricmanager, then reset the GPUs or reboot"
        )
        return [check_failed("fabric", summary, gpu.fabric_status, "success")]
    return []


_PER_GPU = (
    ("ecc", _ecc),
    ("memory_repair", _memory_repair),
    ("nvlink_errors", _nvlink_errors),
    ("throttle", _throttle),
    ("fabric", _fabric),
)
