"""GPU interconnect: bridges, NVLink meshes and NVSwitch fabrics as the rig describes them.

Two ways to say what a box must look like, both judged when both are given:
- the compact form (`bridge.kind`, `pairs`, `links`, `p2p`): bridged pairs or a direct mesh must share
  exactly `links` active NVLinks, or the count of the captured matrix where one is given (so a DGX-1 mesh of
  NV1 and NV2 pairs can be listed); an NVSwitch box must have every GPU's `links` active and ending at a
  switch; `none` (PCIe only) requires nothing: NVLink on a PCIe rig harms no job, so it is not a failure;
- a captured `nvidia-smi topo -m` of a known-good box, compared GPU pair by GPU pair (NIC columns ignored):
  NV# counts must match exactly (NV0 included); a PCIe class may be the same or nearer (PIX < PXB < PHB <
  NODE < SYS), but a farther one fails, because it means a GPU moved to a slot behind another bridge or
  socket, which slows P2P and NCCL; nearer is accepted since boards of one model differ in PCIe switches
  without harm.
Missing links are named by GPU and link, in words that point at the cause (a bridge that is loose or absent).
With `p2p` (the default) a bridged pair must also allow P2P over NVLink and P2P reads; a failing read is
almost always the platform (IOMMU translation, ACS on a PCIe switch), so the message says so.
"""

from __future__ import annotations

import re

from ..typing_lite import TYPE_CHECKING
from .records import Expectation, Finding, gpus, nvml_ok

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set, Tuple

PCIE_DISTANCE = {"PIX": 1, "PSB": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SOC": 5, "SYS": 5}
P2P_MEANING = {
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "DR": "disabled by regkey",
    "NS": "not supported",
    "U": "unknown",
}
P2P_READ_CAUSE = "usually the IOMMU is not in passthrough (iommu=pt) or ACS is enabled on a PCIe switch"
NO_BRIDGE = "the bridge is missing or loose (NVLink bridges are sold separately)"
# What a missing link most likely means, by rig kind: (no link at all, some links down).
CAUSE = {
    "nvlink-bridge": (NO_BRIDGE, ": a loose bridge?"),
    "nvlink": ("an NVLink failed or is disabled", ""),
}
_NV = re.compile(r"^NV([1-9][0-9]*)$")

if TYPE_CHECKING:
    Pair = Tuple[int, int]
if TYPE_CHECKING:
    Gpu = Dict[str, Any]
# A compact-form finding and the GPU pairs it already explains, so the captured matrix does not repeat them.
if TYPE_CHECKING:
    Explained = Tuple[Finding, Set[Pair]]


def nvlink_count(cell: str) -> int:
    """Bonded NVLinks a `nvidia-smi topo -m` cell names (NV4: 4), 0 for a PCIe class."""
    match = _NV.match(cell)
    return int(match.group(1)) if match else 0


class _Box:
    """The facts the topology checks read, indexed once: GPUs by index, pairs by (a, b)."""

    def __init__(self, facts: Dict[str, Any], expect: Expectation) -> None:
        self.gpus = gpus(facts)
        self.by_index = {g["index"]: g for g in self.gpus}
        self.pairs = {(p["a"], p["b"]): p for p in facts.get("pairs") or ()}
        self.nvswitch = bool(facts.get("nvswitch"))
        self.expect = expect

    def pair(self, a: int, b: int) -> Optional[Dict[str, Any]]:
        return self.pairs.get((min(a, b), max(a, b)))

    def captured_links(self, a: int, b: int) -> int:
        """NVLinks the captured matrix shows between two GPUs (0 without a matrix or beyond its GPUs)."""
        matrix = self.expect.topology
        if matrix is None or max(a, b) >= len(matrix):
            return 0
        return nvlink_count(matrix[a][b])

    def pairs_of(self, index: int) -> Set[Pair]:
        return {(min(index, g["index"]), max(index, g["index"])) for g in self.gpus if g["index"] != index}


def topology(facts: Dict[str, Any], expect: Expectation) -> List[Finding]:
    if not nvml_ok(facts):
        return []
    box, kind = _Box(facts, expect), expect.bridge_kind
    explained: List[Explained] = []
    if kind in CAUSE:
        explained = _pairs(box) if expect.bridge_pairs else _per_gpu_links(box)
    elif kind == "nvswitch":
        explained = _nvswitch(box)
    findings = [finding for finding, _ in explained]
    if expect.topology is not None:
        findings += _captured(box, set().union(*(pairs for _, pairs in explained)))
    return findings


def _down(gpu: Gpu, peer: Optional[Gpu] = None) -> List[Dict[str, Any]]:
    """Inactive links of `gpu`; with a peer, only those that may lead to it (remote unknown or the peer)."""
    return [
        link
        for link in gpu.get("nvlinks") or ()
        if not link["active"]
        and (peer is None or link.get("remote_pci_bus_id") in (None, peer["pci_bus_id"]))
    ]


def _name_down(named: List[Tuple[int, int]], hint: str) -> str:
    words = [f"GPU {g} link {link}" for g, link in named]
    verb = "is" if len(words) == 1 else "are"
    return f"{' and '.join(words)} {verb} inactive{hint}"


def _pairs(box: _Box) -> List[Explained]:
    expect = box.expect
    missing, hint = CAUSE[expect.bridge_kind]
    found: List[Explained] = []
    for a, b in expect.bridge_pairs:
        ga, gb = box.by_index.get(a), box.by_index.get(b)
        if ga is None or gb is None:
            continue  # the GPU count check reports missing GPUs
        key = (min(a, b), max(a, b))
        pair = box.pair(a, b)
        active = pair.get("nvlinks", 0) if pair else 0
        want = box.captured_links(a, b) or expect.bridge_links
        desired = f"NV{want}" if want else "NVLink"
        between = f"GPU {key[0]} and GPU {key[1]}"
        if active == 0:
            summary = f"no NVLink is active between {between}: {missing}"
            found.append((Finding("topology", summary, "no NVLink", desired), {key}))
        elif want and active < want:
            named = [(a, k["link"]) for k in _down(ga, gb)] + [(b, k["link"]) for k in _down(gb, ga)]
            share = f"{between} share {active} of {want} NVLinks"
            summary = f"{_name_down(named, hint)} ({share})" if named else share
            found.append((Finding("topology", summary, f"NV{active}", desired), {key}))
        elif want and active > want:
            summary = f"{between} share {active} NVLinks, the rig expects {want}"
            found.append((Finding("topology", summary, f"NV{active}", desired), {key}))
        if not (expect.bridge_p2p and pair):
            continue
        over_nvlink, read = pair.get("p2p_nvlink"), pair.get("p2p_read")
        if active and over_nvlink not in (None, "OK"):
            meaning = P2P_MEANING.get(over_nvlink, over_nvlink)
            summary = f"P2P over NVLink between {between} is not available ({over_nvlink}: {meaning})"
            found.append((Finding("topology", summary, over_nvlink, "OK"), set()))
        if read not in (None, "OK"):
            meaning = P2P_MEANING.get(read, read)
            summary = f"P2P reads between {between} fail ({read}: {meaning}): {P2P_READ_CAUSE}"
            found.append((Finding("topology", summary, read, "OK"), set()))
    return found


def _per_gpu_links(box: _Box) -> List[Explained]:
    """Bridge or mesh rigs that list no pairs: every GPU needs as many active NVLinks as the captured matrix
    gives it (else `links`, else one)."""
    missing, hint = CAUSE[box.expect.bridge_kind]
    found: List[Explained] = []
    for gpu in box.gpus:
        index = gpu["index"]
        peers = sum(box.captured_links(index, g["index"]) for g in box.gpus if g["index"] != index)
        want = peers or box.expect.bridge_links or 1
        active = sum(1 for link in gpu.get("nvlinks") or () if link["active"])
        if active == 0:
            summary = f"GPU {index} has no active NVLink: {missing}"
        elif active < want:
            named = [(index, link["link"]) for link in _down(gpu)]
            share = f"GPU {index} has {active} of {want} NVLinks active"
            summary = f"{_name_down(named, hint)} ({share})" if named else share
        else:
            continue
        finding = Finding("topology", summary, f"{active} links", f"{want} links", index)
        found.append((finding, box.pairs_of(index)))
    return found


def _to_switch(gpu: Gpu) -> int:
    return sum(1 for k in gpu.get("nvlinks") or () if k["active"] and k.get("remote_type") == "switch")


def _nvswitch(box: _Box) -> List[Explained]:
    to_switch = [_to_switch(g) for g in box.gpus]
    if box.gpus and not box.nvswitch and not any(to_switch):
        summary = "no NVSwitch found: the rig expects every GPU's NVLinks to end at a switch"
        everything = set().union(*(box.pairs_of(g["index"]) for g in box.gpus))
        return [(Finding("topology", summary), everything)]
    found: List[Explained] = []
    for gpu in box.gpus:
        active = _to_switch(gpu)
        links, index = gpu.get("nvlinks") or [], gpu["index"]
        want = box.expect.bridge_links or len(links)
        down = [link["link"] for link in _down(gpu)]
        elsewhere = [k["link"] for k in links if k["active"] and k.get("remote_type") != "switch"]
        if not links:
            summary = f"GPU {index} reports no NVLinks, the rig expects {want} to the switches"
        elif down or elsewhere or active != want:
            problems = [f"{active} of {want} NVLinks reach the switches"]
            if down:
                problems.append(f"link {', '.join(map(str, down))} inactive")
            if elsewhere:
                problems.append(f"link {', '.join(map(str, elsewhere))} not ending at a switch")
            summary = f"GPU {index}: {'; '.join(problems)}"
        else:
            continue
        finding = Finding("topology", summary, f"{active} links", f"{want} links", index)
        found.append((finding, box.pairs_of(index)))
    return found


def _captured(box: _Box, explained: Set[Pair]) -> List[Finding]:
    matrix = box.expect.topology or ()
    switched = box.nvswitch or box.expect.bridge_kind == "nvswitch"
    lost = "Fabric Manager not running?" if switched else NO_BRIDGE
    findings: List[Finding] = []
    for i in range(len(matrix)):
        for j in range(i + 1, len(matrix)):
            if i not in box.by_index or j not in box.by_index or (i, j) in explained:
                continue  # missing GPUs: the count check; explained pairs: the compact form said it
            want = matrix[i][j]
            pair = box.pair(i, j)
            have = _cell(pair) if pair else "?"
            have_links = pair.get("nvlinks", 0) if pair else 0
            problem = _cell_problem(want, nvlink_count(want), have, have_links, lost)
            if problem is not None:
                summary = f"GPU {i}-GPU {j} is {have}, the captured topology has {want}{problem}"
                findings.append(Finding("topology", summary, have, want))
    return findings


def _cell(pair: Dict[str, Any]) -> str:
    """The pair's cell as `nvidia-smi topo -m` prints it."""
    links = pair.get("nvlinks", 0)
    return f"NV{links}" if links else (pair.get("pcie") or "?")


def _cell_problem(want: str, want_links: int, have: str, have_links: int, lost: str) -> Optional[str]:
    """Why an actual cell fails the captured one ("" for a plain mismatch), or None when it is acceptable."""
    if want_links or have_links:
        if want_links == have_links:
            return None
        return f": {lost}" if want_links and not have_links else ""
    if have not in PCIE_DISTANCE or want not in PCIE_DISTANCE:
        return None  # NVML could not say; nothing to judge
    if PCIE_DISTANCE[have] > PCIE_DISTANCE[want]:
        return " (a GPU in another slot, behind another bridge or socket?)"
    return None
