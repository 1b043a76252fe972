"""GPU health checks: what a fleet admin asks before a training run, answered from the same facts call.

Critical Xids since boot (and GPUs fallen off the bus without one), fatal NVSwitch SXids, the driver's
recovery action, ECC mode and uncorrectable errors (SRAM apart), memory repair (pending, or past DCGM's
limits), NVLink error rates, hardware clock slowdowns and thermal violation time and, on NVSwitch rigs, the
GPU's fabric registration and health. None of them can be fixed by apply: each is a failed check that
names the GPU, the value and what a person should do. The thresholds are the field's gates'
(health_gates.py). A value the node could not read (None) is not judged; the facts say once which values
were not checked. `health.skip` in the rig switches a check off.
"""

from __future__ import annotations

from ...facts import GpuHealth
from ..change import Change, HostContext, check_failed
from . import health_gates as gates

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
    events = [event.model_dump() for event in health.xid]
    changes = _failed(gates.xid_failures(events, checks.critical_xids)) if checks.checks("xid") else []
    if checks.checks("sxid"):
        changes += _failed(gates.sxid_failures([event.model_dump() for event in health.sxid]))
    for gpu in health.gpus:
        for name, judge in _PER_GPU:
            if checks.checks(name):
                changes += judge(ctx, gpu)
    return changes


def _failed(failures: list[gates.Failure]) -> list[Change]:
    return [check_failed(check, summary, current, desired) for check, summary, current, desired in failures]


def _recovery_action(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    found = gates.recovery_failure(gpu.model_dump())
    if found is None:
        return []
    kind, (check, summary, current, desired) = found
    if kind == "manual":
        return [Change(check, "manual", summary, current, desired)]
    return [check_failed(check, summary, current, desired)]


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


def _memory_limits(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    return _failed(gates.memory_failures(gpu.model_dump()))


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
    interval = ctx.facts.health.counters_interval_s if ctx.facts.health else None
    return _failed(gates.nvlink_failures(gpu.model_dump(), interval, ctx.rig.health.nvlink_error_max))


def _throttle(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    active = [FAILING_THROTTLE[r] for r in gpu.throttle or () if r in FAILING_THROTTLE]
    if not active:
        return []
    summary = (
        f"GPU {gpu.index} is in {', '.join(active)}: check its cooling (fans, airflow, inlet temperature) "
        "and power (PSU, cables, power brake signal)"
    )
    return [check_failed("throttle", summary, ", ".join(active), "no hardware slowdown")]


def _violation(ctx: HostContext, gpu: GpuHealth) -> list[Change]:
    health = ctx.facts.health
    if health is None:
        return []
    since, interval = health.counters_since, health.counters_interval_s
    return _failed(gates.violation_failures(gpu.model_dump(), since, interval))


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
    return _failed(gates.fabric_failures(gpu.model_dump()))


_PER_GPU = (
    ("recovery_action", _recovery_action),
    ("ecc", _ecc),
    ("memory_repair", _memory_repair),
    ("memory_repair", _memory_limits),
    ("nvlink_errors", _nvlink_errors),
    ("throttle", _throttle),
    ("throttle", _violation),
    ("fabric", _fabric),
)
