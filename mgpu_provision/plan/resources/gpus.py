"""GPU inventory checks: NVML answers, the model and count the rig file names, and all GPUs of a box matched.

A box with the wrong or mixed GPUs cannot be fixed by apply; these are failed checks. A mixed box is the
classic SLI/NVLink mistake (a 2080 beside 3090s), so the odd GPU is named rather than only counted.
"""

from __future__ import annotations

from ..change import Change, HostContext, check_failed


def diff(ctx: HostContext) -> list[Change]:
    facts, want = ctx.facts, ctx.rig.gpus
    if not ctx.nvml_ok:
        detail = facts.driver.message or facts.driver.nvml
        return [check_failed("gpus", f"NVML is not usable ({facts.driver.nvml}): {detail}; GPUs not checked")]
    changes: list[Change] = []
    names = [gpu.name for gpu in facts.gpus]
    if len(names) != want.count:
        changes.append(
            check_failed(
                "gpus",
                f"{len(names)} GPUs found, the rig expects {want.count}",
                current=str(len(names)),
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

