"""What smoke reads besides the ranks' results: the transport NCCL chose, and the GPUs while they are busy.

NCCL prints how each channel connects two ranks when asked (`NCCL_DEBUG=INFO`, subsystems INIT and GRAPH):
"NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read". On a box whose GPUs are joined by NVLink or
NVSwitch, ranks of one node that talk `via SHM` (through host memory: P2P refused by ACS/IOMMU or a
virtualised PCIe path) or `via NET` reach a fraction of the bandwidth and pass every collective check, so
smoke fails them and quotes the line. Clock slowdowns and the trained PCIe link are read while the ranks
run: idle GPUs almost never assert slowdown, and drop their PCIe generation to save power.

Stdlib only, Python 3.8: this module runs on the nodes inside the agent zipapp.
"""

from __future__ import annotations

import re

from ...typing_lite import TYPE_CHECKING
from ..nvidia.backend import CLOCK_EVENTS, Backend, NvmlUnavailable

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set

NCCL_LOG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH"}
# Ring/tree channels of current NCCL ("0[0]": rank[cuda device]) and of NCCL 2.x before 2.12 ("0[1a000]":
# rank[bus id]); collnet and NVLS lines have no "->" pair and are not transports between two ranks.
_CHANNEL = re.compile(
    r"NCCL INFO Channel \d+(?:/\d+)? ?: (\d+)\[[0-9a-fA-F]+\] -> (\d+)\[[0-9a-fA-F]+\]"
    r"(?: \[(?:send|receive)\])? via (\S+)"
)
SLOW_TRANSPORTS = ("SHM", "NET")


def channels(log: str) -> List[Dict[str, Any]]:
    """Every channel connection NCCL logged: the two ranks, the transport, and the line itself."""
    found = []
    for match in _CHANNEL.finditer(log):
        start = log.rfind("\n", 0, match.start()) + 1
        end = log.find("\n", match.end())
        line = log[start : end if end >= 0 else len(log)].strip()
        found.append(
            {"from": int(match.group(1)), "to": int(match.group(2)), "via": match.group(3), "line": line}
        )
    return found


def transport(log: str, local_ranks: Set[int]) -> Optional[Dict[str, Any]]:
    """The transports of channels between this node's ranks and to other nodes' ranks; None when NCCL
    logged no channel (one rank per node, or the env files set NCCL_DEBUG below INFO)."""
    found = channels(log)
    if not found:
        return None
    inside = [c for c in found if c["from"] in local_ranks and c["to"] in local_ranks]
    slow = [c for c in inside if c["via"].split("/")[0] in SLOW_TRANSPORTS]
    outside: Dict[str, str] = {}
    for c in found:
        if c not in inside:
            outside.setdefault(c["via"], c["line"])
    return {
        "intra_node": sorted({c["via"] for c in inside}),
        "inter_node": sorted(outside),
        "inter_lines": outside,  # one line NCCL logged for each transport to other nodes, to quote
        "slow_line": slow[0]["line"] if slow else None,
    }


def transport_problem(found: Optional[Dict[str, Any]], interconnect: Optional[str]) -> Optional[str]:
    """Why the transport fails a rig whose GPUs are joined by NVLink or NVSwitch; None when it does not."""
    if found is None or interconnect not in ("nvlink", "nvswitch") or not found["slow_line"]:
        return None
    return (
        f"the rig's GPUs are joined by {interconnect}, but NCCL connected ranks of this node through host "
        f"memory or the network (P2P refused: ACS, IOMMU or a virtualised PCIe path?): {found['slow_line']}"
    )


class LoadSampler:
    """Clock events and the PCIe link of every GPU, sampled while the ranks run: the union of the clock
    events seen and the highest generation and width the link trained to."""

    def __init__(self, backend: Optional[Backend]) -> None:
        self.backend = backend
        self.gpus: List[Dict[str, Any]] = []
        self.note: Optional[str] = None
        if backend is None:
            return
        try:
            backend.open()
        except NvmlUnavailable as exc:
            self.backend, self.note = None, f"not read under load: {exc.message}"
            return
        self.gpus = [
            {"index": index, "samples": 0, "throttle": [], "pcie_gen": None, "pcie_width": None}
            for index in range(backend.device_count())
        ]

    def sample(self) -> None:
        if self.backend is None:
            return
        for gpu in self.gpus:
            index = gpu["index"]
            try:
                reasons = self.backend.clock_event_reasons(index)
                link = self.backend.pcie_link(index)
            except Exception as exc:  # a GPU lost mid-run: the ranks' own errors say more; keep the others
                self.note = f"GPU {index} not read under load: {exc}"
                continue
            gpu["samples"] += 1
            if reasons is not None:
                seen = set(gpu["throttle"]) | {name for bit, name in CLOCK_EVENTS if reasons & bit}
                gpu["throttle"] = [name for _, name in CLOCK_EVENTS if name in seen]
            for key, value in (("pcie_gen", link.get("gen")), ("pcie_width", link.get("width"))):
                if value is not None and (gpu[key] is None or value > gpu[key]):
                    gpu[key] = value
            gpu["pcie_max_gen"], gpu["pcie_max_width"] = link.get("max_gen"), link.get("max_width")

    def close(self) -> List[Dict[str, Any]]:
        """The readings per GPU (none without a backend, or when no sample was taken)."""
        if self.backend is not None:
            self.backend.close()
        return [gpu for gpu in self.gpus if gpu["samples"]]
