"""PCIe link checks: each GPU's link at least as wide and as fast as the rig file asks.

A card in an x4 slot (or behind a riser that negotiates down) is a classic rig fault that nothing else
reports. Width is judged as it runs now; the generation by its maximum, because GPUs drop the current
generation at idle to save power: an idle gen-4 card reads gen 1 and would fail a check on the current one.
"""

from __future__ import annotations

from ..change import Change, HostContext, check_failed


def diff(ctx: HostContext) -> list[Change]:
    want = ctx.rig.gpus
    if not ctx.nvml_ok or (want.min_pcie_width is None and want.min_pcie_gen is None):
        return []
    changes: list[Change] = []
    for gpu in ctx.facts.gpus:
        link = gpu.pcie
        if want.min_pcie_width is not None and link.width is not None and link.width < want.min_pcie_width:
            card = f"slot gives x{link.width} of its x{link.max_width}" if link.max_width else "max unknown"
            changes.append(
                check_failed(
                    "pcie",
                    f"GPU {gpu.index} runs at x{link.width} ({card}), the rig needs x{want.min_pcie_width}",
                    current=f"x{link.width}",
                    desired=f"x{want.min_pcie_width}",
                )
            )
        if want.min_pcie_gen is not None and link.max_gen is not None and link.max_gen < want.min_pcie_gen:
            changes.append(
                check_failed(
                    "pcie",
                    f"GPU {gpu.index} links at PCIe gen {link.max_gen} at most, "
                    f"the rig needs gen {want.min_pcie_gen}",
                    current=f"gen {link.max_gen}",
                    desired=f"gen {want.min_pcie_gen}",
                )
            )
    return changes
