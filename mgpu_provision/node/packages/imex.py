"""nvidia-imex on a node: the package's version, its unit and the IMEX channels CUDA's multi-node memory
sharing opens.

A GB200 NVL72 compute tray runs no Fabric Manager (the rack's NVLink switch trays do); for memory shared
across the trays of one NVLink domain it runs the IMEX daemon at the driver's exact version, and processes
use IMEX channels (`/dev/nvidia-caps-imex-channels/channelN`). Facts report all three; an `imex` resource
in plan compares them with the rig.

Shipped to nodes: Python 3.8, standard library only.
"""

import glob
from typing import Any, Dict, Optional

from ..core import system
from .common import installed_debs, rpm_provider, upstream

UNIT = "nvidia-imex"
CHANNELS = "/dev/nvidia-caps-imex-channels/channel*"


def version() -> Optional[str]:
    """Upstream version of the installed nvidia-imex (deb `nvidia-imex` or `nvidia-imex-<b>`, or the RPM)."""
    debs = installed_debs(("nvidia-imex", "nvidia-imex-*"))
    for name in sorted(debs):
        return upstream(debs[name][0])
    found = rpm_provider(UNIT)
    return found[1] if found else None


def facts(unit_state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The daemon's facts from its unit's state; None when neither package nor unit is there."""
    installed = version()
    if installed is None and unit_state.get("service") == "absent":
        return None
    channels = len(glob.glob(CHANNELS)) if system.read_text("/proc/driver/nvidia/version") else None
    return dict(unit_state, version=installed, channels=channels)
