"""Torch check: the smoke python's torch imports and sees at least the GPUs CUDA is meant to see.

Only judged when the agent ran the torch probe (facts carry `torch`): a box where torch cannot see the GPUs
fails every training job; the probe says why (a CPU-only wheel, a driver too old for the wheel's CUDA).
"""

from __future__ import annotations

from ..change import Change, HostContext, check_failed


def diff(ctx: HostContext) -> list[Change]:
    probe = ctx.facts.torch
    if probe is None:
        return []
    if not probe.ok:
        why = probe.error or "unknown error"
        return [check_failed("torch", f"torch does not import in {probe.python}: {why}")]
    seen = probe.device_count or 0
    # A simulated node's GPUs exist only for NVML: its real torch cannot see them, so only the import counts.
    if seen < ctx.visible_count and not ctx.facts.host.simulated:
        why = "" if probe.cuda_available else " (CUDA is not available to it)"
        return [
            check_failed(
                "torch",
                f"torch {probe.version} in {probe.python} sees {seen} GPUs, "
                f"the rig expects {ctx.visible_count}{why}",
                current=str(seen),
                desired=str(ctx.visible_count),
            )
        ]
    return []
