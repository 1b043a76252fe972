"""Facts the env files are rendered from: the node's network interfaces and its CPU cores.

The rig gives NCCL's interface pattern; Gloo needs one exact name, which only the node's list of interfaces
that are up can give. OMP_NUM_THREADS should give each local rank its share of the cores, which only the node
knows.
"""

from __future__ import annotations

import os

from ...typing_lite import TYPE_CHECKING
from ..core.system import read_text

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

NET_DIR = "/sys/class/net"
CPU_DIR = "/sys/devices/system/cpu"
_IFF_UP = 0x1


def interfaces(net_dir: str = NET_DIR) -> List[Dict[str, Any]]:
    """Every network interface with whether it is up (IFF_UP, what `ip link` shows as UP), in name order."""
    try:
        names = sorted(os.listdir(net_dir))
    except OSError:
        return []
    found = []
    for name in names:
        try:
            up = bool(int((read_text(os.path.join(net_dir, name, "flags")) or "0").strip(), 16) & _IFF_UP)
        except ValueError:
            up = False
        found.append({"name": name, "up": up})
    return found


def cpu(cpu_dir: str = CPU_DIR) -> Dict[str, Optional[int]]:
    """CPUs the agent may run on (`logical`) and the physical cores among them (`cores`; None: unknown)."""
    try:
        usable = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = list(range(os.cpu_count() or 1))
    cores = set()
    for index in usable:
        topology = os.path.join(cpu_dir, "cpu{}".format(index), "topology")
        package = read_text(os.path.join(topology, "physical_package_id"))
        core = read_text(os.path.join(topology, "core_id"))
        if package is None or core is None:
            return {"logical": len(usable), "cores": None}
        cores.add((package.strip(), core.strip()))
    return {"logical": len(usable), "cores": len(cores) or None}
