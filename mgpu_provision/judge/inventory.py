"""GPU inventory: NVML answers, the model and count the rig names, all GPUs of a box matched, PCIe links.

A box with the wrong or mixed GPUs cannot be fixed by apply. A mixed box is the classic SLI/NVLink mistake
(a 2080 beside 3090s), so the odd GPU is named rather than only counted. A GPU NVML answers GpuIsLost for
(fallen off the bus) counts as present and is its own finding: it needs a reset or a reboot, not a purchase.

A card in an x4 slot (or behind a riser that negotiates down) is a classic rig fault that nothing else
reports. PCIe width is judged as it runs now; the generation by its maximum, because GPUs drop the current
generation at idle to save power: an idle gen-4 card reads gen 1 and would fail a check on the current one.
"""

from __future__ import annotations

from ..typing_lite import TYPE_CHECKING
from .records import Expectation, Finding, gpus, nvml_ok

if TYPE_CHECKING:
    from typing import Any, Dict, List

if TYPE_CHECKING:
    Facts = Dict[str, Any]


def inventory(facts: Facts, expect: Expectation) -> List[Finding]:
    """NVML usable, GPUs present and of the rig's model and count."""
    if not nvml_ok(facts):
        driver = facts.get("driver") or {}
        detail = driver.get("message") or driver.get("nvml")
        summary = f"NVML is not usable ({driver.get('nvml')}): {detail}; GPUs not checked"
        return [Finding("gpus", summary)]
    lost = facts.get("lost_gpus") or []
    findings = [_lost(gpu) for gpu in lost]
    found = gpus(facts)
    names = [gpu["name"] for gpu in found]
    count, want = len(names) + len(lost), expect.gpu_model
    if count != expect.gpu_count:
        summary = f"{count} GPUs found, the rig expects {expect.gpu_count}"
        findings.append(Finding("gpus", summary, str(count), str(expect.gpu_count)))
    if names and want not in names:
        models = ", ".join(sorted(set(names)))
        findings.append(Finding("gpus", f"the GPUs are {models}, the rig expects {want}", models, want))
    elif len(set(names)) > 1:
        odd = ", ".join(f"GPU {g['index']} is an {g['name']}" for g in found if g["name"] != want)
        findings.append(Finding("gpus", f"GPUs are not matched: {odd}, the others are {want}"))
    return findings


def _lost(gpu: Dict[str, Any]) -> Finding:
    index, address = gpu["index"], gpu.get("pci_bus_id")
    at = f" ({address})" if address else ""
    advice = (
        f"reset it (nvidia-smi -r -i {index}) or reboot; if it happens again, check its power and seating, "
        "then replace it"
    )
    return Finding(
        "gpus", f"GPU {index}{at} is lost (NVML: {gpu['error']})", "lost", "present", index, advice=advice
    )


def pcie(facts: Facts, expect: Expectation) -> List[Finding]:
    """Each GPU's link at least as wide and as fast as the rig asks."""
    width, gen = expect.min_pcie_width, expect.min_pcie_gen
    if not nvml_ok(facts) or (width is None and gen is None):
        return []
    findings: List[Finding] = []
    for gpu in gpus(facts):
        link, index = gpu.get("pcie") or {}, gpu["index"]
        have_width, max_width, max_gen = link.get("width"), link.get("max_width"), link.get("max_gen")
        if width is not None and have_width is not None and have_width < width:
            card = f"slot gives x{have_width} of its x{max_width}" if max_width else "max unknown"
            summary = f"GPU {index} runs at x{have_width} ({card}), the rig needs x{width}"
            findings.append(Finding("pcie", summary, f"x{have_width}", f"x{width}", index))
        if gen is not None and max_gen is not None and max_gen < gen:
            summary = f"GPU {index} links at PCIe gen {max_gen} at most, the rig needs gen {gen}"
            findings.append(Finding("pcie", summary, f"gen {max_gen}", f"gen {gen}", index))
    return findings
