"""The control machine's cache folder of mgpu-provision, named in one place.

What a run can build again but should not have to (loaded rigs, the agent zipapp, compiled templates) is
kept under `${XDG_CACHE_HOME:-~/.cache}/mgpu-provision/`, one sub-folder per kind; the nodes' own cache
folder (`~/.cache/mgpu-provision` of the login user) is the agent's business (fleet/session.py).
"""

from __future__ import annotations

import os
from pathlib import Path


def control_cache_dir() -> Path:
    """The control machine's cache of mgpu-provision (XDG_CACHE_HOME is honoured)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mgpu-provision"
