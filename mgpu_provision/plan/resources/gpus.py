"""GPU inventory checks: NVML answers, the model and count the rig file names, and all GPUs of a box matched.

A box with the wrong or mixed GPUs cannot be fixed by apply; these are failed checks. A mixed box is the
classic SLI/NVLink mistake (a 2080 beside 3090s), so the odd GPU is named rather than only counted.
A GPU NVML answers GpuIsLost for (fallen off the bus) counts as present and is its own failed check: it
needs a reset or a reboot, not a purchase.
"""

from __future__ import annotations

from ...facts import LostGpu
from ..change import Change, HostContext, check_failed


def diff(ctx: HostContext) -> list[Change]:
    facts, want = ctx.facts, ctx.rig.gpus
    if not ctx.nvml_ok:
        detail = facts.driver.message or facts.driver.nvml
        return [check_failed("gpus", f"NVML is not usable ({facts.driver.nvml}): {detail}; GPUs not checked")]
    changes = [_lost(gpu) for gpu in facts.lost_gpus]
    names = [gpu.name for gpu in facts.gpus]
    count = len(names) + len(facts.lost_gpus)
    if count != want.count:
        changes.append(
            check_failed(
                "gpus",
                f"{count} GPUs found, the rig expects {want.count}",
                current=str(count),
                desired=str(want.count),
            )
        )
    if names and want.model not in names:
        found = ", ".join(sorted(set(names)))
        changes.append(
            check_failed("gpus", f"the GPUs are {found}, the rig expects {want.model}", found, want.model)
        )
    elif len(set(names)) > 1:
        odd = ", ".join(f"GPU {g.index} is an {g.name}" for g in facts.gpus if g.name != want.model)
        changes.append(check_failed("gpus", f"GPUs are not matched: {odd}, the others are {want.model}"))
    return changes


def _lost(gpu: LostGpu) -> Change:
    at = f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else ""
    summary = (
        f"GPU {gpu.index}{at} is lost (NVML: {gpu.error}): reset it (nvidia-smi -r -i {gpu.index}) or "
        "reboot; if it happens again, check its power and seating, then replace it"
    )
    return check_failed("gpus", summary, "lost", "present")
