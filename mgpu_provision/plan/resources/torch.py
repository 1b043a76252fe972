"""Torch check: the smoke python's torch imports and sees at least the GPUs CUDA is meant to see.

Only judged when the agent ran the torch probe (facts carry `torch`): a box where torch cannot see the GPUs
fails every training job; the probe says why (a CPU-only wheel, a driver too old for the wheel's CUDA). The
probed version also decides what the env files and the launcher write (`spelling`): torchrun's hyphenated
flags came with torch 2.0, TORCH_NCCL_ASYNC_ERROR_HANDLING replaced NCCL_ASYNC_ERROR_HANDLING in torch 2.2,
and torch.distributed.run itself, which the launcher runs, exists since torch 1.9.
"""

from __future__ import annotations

import re

from ...facts import Facts
from ...typing_lite import NamedTuple
from ..change import Change, HostContext, check_failed

TORCHRUN_SINCE = (1, 9)
HYPHEN_FLAGS_SINCE = (2, 0)
TORCH_NCCL_NAMES_SINCE = (2, 2)


class Spelling(NamedTuple):
    """What the node's torch reads: the async-error variable's name and torchrun's flag style."""

    async_error_handling: str = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    underscore_flags: bool = False


def version(facts: Facts) -> tuple[int, int] | None:
    """(major, minor) of the probed torch ("2.1.2+cu121" -> (2, 1)); None when not probed or unreadable."""
    probe = facts.torch
    match = re.match(r"(\d+)\.(\d+)", probe.version or "") if probe is not None and probe.ok else None
    return (int(match.group(1)), int(match.group(2))) if match else None


def spelling(facts: Facts) -> Spelling:
    """The names the node's torch reads; today's names when its version is unknown."""
    found = version(facts)
    if found is None:
        return Spelling()
    return Spelling(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING" if found >= TORCH_NCCL_NAMES_SINCE else "NCCL_ASYNC_ERROR_HANDLING",
        underscore_flags=found < HYPHEN_FLAGS_SINCE,
    )


def diff(ctx: HostContext) -> list[Change]:
    probe = ctx.facts.torch
    if probe is None:
        return []
    if not probe.ok:
        why = probe.error or "unknown error"
        return [check_failed("torch", f"torch does not import in {probe.python}: {why}")]
    found = version(ctx.facts)
    if ctx.rig.ddp is not None and found is not None and found < TORCHRUN_SINCE:
        return [
            check_failed(
                "torch",
                f"torch {probe.version} in {probe.python} is too old for the rig's DDP launcher: "
                "torch.distributed.run needs torch 1.9 or newer",
                current=probe.version,
                desired=">= 1.9",
            )
        ]
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
