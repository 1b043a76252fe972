"""Persistence mode: keep the driver loaded between jobs so each job does not pay GPU initialisation.

One Change for all GPUs that differ, carried out by the agent's `persistence` step. Linux only (NVML's setter
is Linux-only), and only when the rig file asks for a value.
"""

from __future__ import annotations

from ... import protocol
from ..change import Change, HostContext


def diff(ctx: HostContext) -> list[Change]:
    wanted = ctx.rig.gpus.persistence_mode
    if wanted is None or ctx.host.os != "linux" or not ctx.nvml_ok:
        return []
    wrong = [gpu.index for gpu in ctx.facts.gpus if gpu.persistence_mode is not wanted]
    if not wrong:
        return []
    state = {True: "on", False: "off"}
    listed = ", ".join(str(i) for i in wrong)
    return [
        Change(
            resource="persistence",
            action="update",
            summary=f"persistence mode {state[not wanted]} → {state[wanted]} (GPU {listed})",
            current=state[not wanted],
            desired=state[wanted],
            agent_step=protocol.persistence_step(wrong, wanted),
            phase="persistence",
        )
    ]
