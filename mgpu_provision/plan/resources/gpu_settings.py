"""GPU settings the rig decides: power limit and compute mode (apply sets them), MIG mode (a person does).

Power limit: the rig's `health.power_limit_w` (watts, or `default`: each GPU's default limit); a rig that
says nothing leaves the limits as they are, so a cap someone set on purpose survives every apply. A limit
enforced below the management limit (a BMC's out-of-band cap) is reported: apply cannot lift it.
Compute mode: the rig's `health.compute_mode` (`default` unless it says
otherwise). Both are NVML settings that apply carries out with one agent step for all GPUs that differ. MIG
mode needs a GPU reset with no process on it, which apply will not do on its own: a manual step.
"""

from __future__ import annotations

from ... import protocol
from ...facts import GpuHealth
from ..change import Change, HostContext, check_failed


def diff(ctx: HostContext) -> list[Change]:
    health = ctx.facts.health
    if health is None or not ctx.nvml_ok or ctx.host.os != "linux":
        return []
    checks = ctx.rig.health
    changes: list[Change] = []
    if checks.checks("power"):
        changes += _power(ctx, health.gpus)
    if checks.checks("compute_mode"):
        changes += _compute_mode(ctx, health.gpus)
    if checks.checks("mig"):
        changes += _mig(ctx, health.gpus)
    return changes


def _gpus(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)


def _power(ctx: HostContext, gpus: list[GpuHealth]) -> list[Change]:
    setting = ctx.rig.health.power_limit_w
    capped = _enforced_caps(gpus)
    if setting is None:
        return capped
    want = setting if isinstance(setting, int) else None  # None: each GPU's default
    refused = [g for g in gpus if want is not None and g.power_limit_range_w and not _within(want, g)]
    if refused:
        # NVML would refuse the setter; a failed check says why instead of a failed apply step.
        return [
            check_failed(
                "power",
                f"GPU {g.index} accepts power limits of {_range(g)}, the rig's power_limit_w is {want} W",
                f"{g.power_limit_w} W",
                f"{want} W",
            )
            for g in refused
        ]
    return capped + _set_power(gpus, want)


def _set_power(gpus: list[GpuHealth], want: int | None) -> list[Change]:
    """One step for every GPU whose limit is not `want` (None: its default); none when all are."""
    wrong: dict[int, tuple[int, int]] = {}
    for gpu in gpus:
        target = want if want is not None else gpu.default_power_limit_w
        if gpu.power_limit_w is not None and target is not None and gpu.power_limit_w != target:
            wrong[gpu.index] = (gpu.power_limit_w, target)
    if not wrong:
        return []
    now = "/".join(f"{w} W" for w in sorted({c for c, _ in wrong.values()}))
    then = "/".join(f"{w} W" for w in sorted({t for _, t in wrong.values()}))
    why = "" if want is not None else " (the default, as health.power_limit_w says)"
    return [
        Change(
            resource="power",
            action="update",
            summary=f"power limit {now} → {then}{why} on GPU {_gpus(sorted(wrong))}",
            current=now,
            desired=then,
            agent_step=protocol.power_limit_step(sorted(wrong), want),
            phase="persistence",
        )
    ]


def _enforced_caps(gpus: list[GpuHealth]) -> list[Change]:
    """GPUs held below their management limit by another cap (nvmlDeviceGetEnforcedPowerLimit): a BMC's
    out-of-band limit, which no NVML setter lifts."""
    return [
        Change(
            "power",
            "manual",
            f"GPU {g.index} is held at {g.enforced_power_limit_w} W, below its {g.power_limit_w} W power "
            "limit, by an out-of-band cap (BMC/node manager): lift it there if it is not meant",
            f"{g.enforced_power_limit_w} W enforced",
            f"{g.power_limit_w} W",
        )
        for g in gpus
        if g.enforced_power_limit_w is not None
        and g.power_limit_w is not None
        and g.enforced_power_limit_w < g.power_limit_w
    ]


def _within(watts: int, gpu: GpuHealth) -> bool:
    low, high = gpu.power_limit_range_w or (watts, watts)
    return low <= watts <= high


def _range(gpu: GpuHealth) -> str:
    low, high = gpu.power_limit_range_w or (0, 0)
    return f"{low}-{high} W"


def _compute_mode(ctx: HostContext, gpus: list[GpuHealth]) -> list[Change]:
    want = ctx.rig.health.compute_mode
    wrong = [g for g in gpus if g.compute_mode is not None and g.compute_mode != want]
    if not wrong:
        return []
    now = "/".join(sorted({str(g.compute_mode) for g in wrong}))
    indices = [g.index for g in wrong]
    return [
        Change(
            resource="compute-mode",
            action="update",
            summary=f"compute mode {now} → {want} on GPU {_gpus(indices)}",
            current=now,
            desired=want,
            agent_step=protocol.compute_mode_step(indices, want),
            phase="persistence",
        )
    ]


def _mig(ctx: HostContext, gpus: list[GpuHealth]) -> list[Change]:
    want = ctx.rig.health.mig
    state = {True: "on", False: "off"}
    changes = []
    for gpu in gpus:
        if gpu.mig is None:
            continue
        if gpu.mig is not want and gpu.mig_pending is want:
            summary = (
                f"MIG {state[want]} is pending on GPU {gpu.index}: reset it "
                f"(nvidia-smi -r -i {gpu.index}) with no process on it"
            )
        elif gpu.mig is not want:
            summary = (
                f"MIG is {state[gpu.mig]} on GPU {gpu.index}, the rig expects {state[want]}: "
                f"nvidia-smi -i {gpu.index} -mig {int(want)}, then reset the GPU with no process on it"
            )
        else:
            continue
        changes.append(Change("mig", "manual", summary, state[gpu.mig], state[want]))
    return changes
