"""Which NVIDIA layer answers for this node: the twin's (a simulated node) or the machine's own.

Kept apart from the interface in `backend.py` so that neither back end imports its chooser: each is imported
only when chosen, and a real node never loads the twin reader (nor a simulated one pynvml).
"""

from __future__ import annotations

import os

from ...protocol import SIMULATE_ENV
from ...typing_lite import TYPE_CHECKING
from .backend import Backend

if TYPE_CHECKING:
    from typing import Any, Dict, Optional


def simulation_target(request_simulate: Optional[str], login_simulate: Optional[str] = None) -> Optional[str]:
    """The twin this call simulates: the request's field, else the login shell's variable (passed as an
    argument, because `sudo` resets the environment), else this process's own environment variable."""
    return request_simulate or login_simulate or os.environ.get(SIMULATE_ENV) or None


def state_folder(request: Dict[str, Any]) -> Optional[str]:
    """The node's state folder a request names, where a simulated node keeps its overlay: the facts'
    `state_dir`, the folder of apply's and reboot's `lock`, or the request's own `state_dir` (the node
    check's facts, which must not move the health sample); None for the verbs that name none."""
    args = request.get("args") or {}
    lock = args.get("lock")
    found = request.get("state_dir") or args.get("state_dir") or (os.path.dirname(lock) if lock else None)
    return found if isinstance(found, str) and found else None


def select_backend(twin_path: Optional[str], state_dir: Optional[str] = None) -> Backend:
    """The simulated backend for a twin path (its overlay in `state_dir`), else the real one; each imported
    only when chosen."""
    if twin_path:
        from .nvml_sim import SimulatedBackend

        return SimulatedBackend(twin_path, state_dir)
    from .nvml_real import RealBackend

    return RealBackend()
