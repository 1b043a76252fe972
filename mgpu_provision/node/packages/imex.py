"""nvidia-imex on a node: the package's version, its unit and the IMEX channels CUDA's multi-node memory
sharing opens.

A GB200 NVL72 compute tray runs no Fabric Manager (the rack's NVLink switch trays do); for memory shared
across the trays of one NVLink domain it runs the IMEX daemon at the driver's exact version, and processes
use IMEX channels (`/dev/nvidia-caps-imex-channels/channelN`). Facts report all three and, from a running
daemon, its domain as `nvidia-imex-ctl -N -j` says it; an `imex` resource in plan compares them with the
rig.

Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import glob
import json

from ...typing_lite import TYPE_CHECKING
from ..core import system
from .common import installed_debs, rpm_provider, upstream

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

UNIT = "nvidia-imex"
CHANNELS = "/dev/nvidia-caps-imex-channels/channel*"


def version() -> Optional[str]:
    """Upstream version of the installed nvidia-imex (deb `nvidia-imex` or `nvidia-imex-<b>`, or the RPM)."""
    debs = installed_debs(("nvidia-imex", "nvidia-imex-*"))
    for name in sorted(debs):
        return upstream(debs[name][0])
    found = rpm_provider(UNIT)
    return found[1] if found else None


CTL_TIMEOUT_S = 15.0
# nvidia-imex-ctl's words for a daemon without its nodes_config.cfg (NVIDIA/DCGM
# dcgmlib/src/DcgmImexManager.cpp GetDomainStatusFromCommand reads the same line as NOT_CONFIGURED).
NOT_CONFIGURED = "Failed to read node configuration file"


def facts(unit_state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The daemon's facts from its unit's state; None when neither package nor unit is there."""
    installed = version()
    if installed is None and unit_state.get("service") == "absent":
        return None
    channels = len(glob.glob(CHANNELS)) if system.read_text("/proc/driver/nvidia/version") else None
    domain = None
    if unit_state.get("service") == "active":
        done = system.run(["nvidia-imex-ctl", "-N", "-j"], timeout=CTL_TIMEOUT_S)
        domain = imex_domain(done.stdout + done.stderr) if done.returncode != 127 else None
    return dict(unit_state, version=installed, channels=channels, domain=domain)


def imex_domain(output: str) -> Dict[str, Any]:
    """`{"status", "nodes", "error"}` from `nvidia-imex-ctl -N -j`: the domain's top-level `status` (UP, DOWN,
    DEGRADED) and each node's index, address, state and the peers it is not connected to. Its format is
    NVIDIA's (NVIDIA/DCGM dcgmlib/src/tests/DcgmImexManagerTests.cpp, "actual sample JSON from
    specification"); output that is not that JSON is UNAVAILABLE, with the reason."""
    if NOT_CONFIGURED in output:
        return {"status": "NOT_CONFIGURED", "nodes": [], "error": _first_line(output)}
    try:
        data = json.loads(output)
    except ValueError:
        return {"status": "UNAVAILABLE", "nodes": [], "error": "not JSON: " + _first_line(output)}
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        return {"status": "UNAVAILABLE", "nodes": [], "error": "no top-level status in its JSON"}
    nodes = _mapping(data.get("nodes"))
    listed: List[Dict[str, Any]] = []
    for key in sorted(nodes, key=lambda k: (len(k), k)):
        node = _mapping(nodes[key])
        links = _mapping(node.get("connections"))
        unconnected = sorted(
            str(link.get("host"))
            for link in links.values()
            if isinstance(link, dict) and str(link.get("status", "")).upper() != "CONNECTED"
        )
        listed.append(
            {
                "index": int(key) if key.isdigit() else None,
                "host": None if node.get("host") is None else str(node["host"]),
                "status": None if node.get("status") is None else str(node["status"]).upper(),
                "unconnected": unconnected,
            }
        )
    return {"status": data["status"].upper(), "nodes": listed, "error": None}


def _mapping(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else "no output"
