"""GPU interconnect checks: bridges, NVLink meshes and NVSwitch fabrics as the rig file describes them.

Two ways to say what a box must look like, both checked when both are given:
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

from ...facts import Gpu, NvLink
from ...node.nvidia.topology import TopoMatrix, nvlink_count
from ..change import Change, HostContext, check_failed

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

Pair = tuple[int, int]
# A compact-form finding and the GPU pairs it already explains, so the captured matrix does not repeat them.
Finding = tuple[Change, set[Pair]]


def diff(ctx: HostContext) -> list[Change]:
    if not ctx.nvml_ok:
        return []
    kind = ctx.rig.bridge.kind
    findings: list[Finding] = []
    if kind in CAUSE:
        findings = _pairs(ctx) if ctx.rig.bridge.pairs else _per_gpu_links(ctx)
    elif kind == "nvswitch":
        findings = _nvswitch(ctx)
    changes = [change for change, _ in findings]
    if ctx.expected_topology is not None:
        explained = set().union(*(pairs for _, pairs in findings))
        changes += _captured(ctx, ctx.expected_topology, explained)
    return changes


def _gpu(ctx: HostContext, index: int) -> Gpu | None:
    return next((g for g in ctx.facts.gpus if g.index == index), None)


def _captured_links(ctx: HostContext, a: int, b: int) -> int:
    """NVLinks the captured matrix shows between two GPUs (0 without a matrix or beyond its GPUs)."""
    matrix = ctx.expected_topology
    if matrix is None or max(a, b) >= matrix.gpu_count:
        return 0
    return nvlink_count(matrix.gpu_cell(a, b))


def _pairs_of(ctx: HostContext, index: int) -> set[Pair]:
    return {(min(index, g.index), max(index, g.index)) for g in ctx.facts.gpus if g.index != index}


def _down(gpu: Gpu, peer: Gpu | None = None) -> list[NvLink]:
    """Inactive links of `gpu`; with a peer, only those that may lead to it (remote unknown or the peer)."""
    return [
        link
        for link in gpu.nvlinks
        if not link.active and (peer is None or link.remote_pci_bus_id in (None, peer.pci_bus_id))
    ]


def _name_down(named: list[tuple[int, int]], hint: str) -> str:
    words = [f"GPU {g} link {link}" for g, link in named]
    verb = "is" if len(words) == 1 else "are"
    return f"{' and '.join(words)} {verb} inactive{hint}"


def _pairs(ctx: HostContext) -> list[Finding]:
    bridge = ctx.rig.bridge
    missing, hint = CAUSE[bridge.kind]
    findings: list[Finding] = []
    for a, b in bridge.pairs:
        ga, gb = _gpu(ctx, a), _gpu(ctx, b)
        if ga is None or gb is None:
            continue  # the GPU count check reports missing GPUs
        key = (min(a, b), max(a, b))
        pair = ctx.facts.pair(a, b)
        active = pair.nvlinks if pair else 0
        want = _captured_links(ctx, a, b) or bridge.links
        desired = f"NV{want}" if want else "NVLink"
        between = f"GPU {key[0]} and GPU {key[1]}"
        if active == 0:
            summary = f"no NVLink is active between {between}: {missing}"
            findings.append((check_failed("topology", summary, "no NVLink", desired), {key}))
        elif want and active < want:
            named = [(a, link.link) for link in _down(ga, gb)] + [(b, link.link) for link in _down(gb, ga)]
            share = f"{between} share {active} of {want} NVLinks"
            summary = f"{_name_down(named, hint)} ({share})" if named else share
            findings.append((check_failed("topology", summary, f"NV{active}", desired), {key}))
        elif want and active > want:
            summary = f"{between} share {active} NVLinks, the rig expects {want}"
            findings.append((check_failed("topology", summary, f"NV{active}", desired), {key}))
        if active and bridge.p2p and pair and pair.p2p_nvlink not in (None, "OK"):
            meaning = P2P_MEANING.get(pair.p2p_nvlink, pair.p2p_nvlink)
            summary = f"P2P over NVLink between {between} is not available ({pair.p2p_nvlink}: {meaning})"
            findings.append((check_failed("topology", summary, pair.p2p_nvlink, "OK"), set()))
        if bridge.p2p and pair and pair.p2p_read not in (None, "OK"):
            meaning = P2P_MEANING.get(pair.p2p_read, pair.p2p_read)
            summary = f"P2P reads between {between} fail ({pair.p2p_read}: {meaning}): {P2P_READ_CAUSE}"
            findings.append((check_failed("topology", summary, pair.p2p_read, "OK"), set()))
    return findings


def _per_gpu_links(ctx: HostContext) -> list[Finding]:
    """Bridge or mesh rigs that list no pairs: every GPU needs as many active NVLinks as the captured matrix
    gives it (else `links`, else one)."""
    missing, hint = CAUSE[ctx.rig.bridge.kind]
    findings: list[Finding] = []
    for gpu in ctx.facts.gpus:
        peers = sum(_captured_links(ctx, gpu.index, g.index) for g in ctx.facts.gpus if g.index != gpu.index)
        want = peers or ctx.rig.bridge.links or 1
        active = sum(1 for link in gpu.nvlinks if link.active)
        if active == 0:
            summary = f"GPU {gpu.index} has no active NVLink: {missing}"
        elif active < want:
            named = [(gpu.index, link.link) for link in _down(gpu)]
            share = f"GPU {gpu.index} has {active} of {want} NVLinks active"
            summary = f"{_name_down(named, hint)} ({share})" if named else share
        else:
            continue
        change = check_failed("topology", summary, f"{active} links", f"{want} links")
        findings.append((change, _pairs_of(ctx, gpu.index)))
    return findings


def _nvswitch(ctx: HostContext) -> list[Finding]:
    facts = ctx.facts
    to_switch = [sum(1 for k in g.nvlinks if k.active and k.remote_type == "switch") for g in facts.gpus]
    if facts.gpus and not facts.nvswitch and not any(to_switch):
        summary = "no NVSwitch found: the rig expects every GPU's NVLinks to end at a switch"
        everything = set().union(*(_pairs_of(ctx, g.index) for g in facts.gpus))
        return [(check_failed("topology", summary), everything)]
    findings: list[Finding] = []
    for gpu, active in zip(facts.gpus, to_switch, strict=True):
        want = ctx.rig.bridge.links or len(gpu.nvlinks)
        down = [link.link for link in _down(gpu)]
        elsewhere = [k.link for k in gpu.nvlinks if k.active and k.remote_type != "switch"]
        if not gpu.nvlinks:
            summary = f"GPU {gpu.index} reports no NVLinks, the rig expects {want} to the switches"
        elif down or elsewhere or active != want:
            problems = [f"{active} of {want} NVLinks reach the switches"]
            if down:
                problems.append(f"link {', '.join(map(str, down))} inactive")
            if elsewhere:
                problems.append(f"link {', '.join(map(str, elsewhere))} not ending at a switch")
            summary = f"GPU {gpu.index}: {'; '.join(problems)}"
        else:
            continue
        change = check_failed("topology", summary, f"{active} links", f"{want} links")
        findings.append((change, _pairs_of(ctx, gpu.index)))
    return findings


def _captured(ctx: HostContext, matrix: TopoMatrix, explained: set[Pair]) -> list[Change]:
    present = {g.index for g in ctx.facts.gpus}
    switched = ctx.facts.nvswitch or ctx.rig.bridge.kind == "nvswitch"
    lost = "Fabric Manager not running?" if switched else NO_BRIDGE
    changes: list[Change] = []
    for i in range(matrix.gpu_count):
        for j in range(i + 1, matrix.gpu_count):
            if i not in present or j not in present or (i, j) in explained:
                continue  # missing GPUs: the count check; explained pairs: the compact form said it
            want = matrix.gpu_cell(i, j)
            pair = ctx.facts.pair(i, j)
            have = pair.cell if pair else "?"
            problem = _cell_problem(want, nvlink_count(want), have, pair.nvlinks if pair else 0, lost)
            if problem is not None:
                summary = f"GPU {i}-GPU {j} is {have}, the captured topology has {want}{problem}"
                changes.append(check_failed("topology", summary, have, want))
    return changes


def _cell_problem(want: str, want_links: int, have: str, have_links: int, lost: str) -> str | None:
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
