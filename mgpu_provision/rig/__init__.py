"""Rig file: models, loading with line numbers, cross-field rules.

Nothing is imported here until it is asked for: `validate` answers from the rig cache (`cache.py`) without
the models (pydantic), and a command whose rig comes from the cache never imports the loader (the YAML
parser, the rules).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loader import load_rig
    from .rig import LoadedRig
    from .select import select_hosts

__all__ = ["LoadedRig", "load_rig", "select_hosts"]
_HOME = {"LoadedRig": ".rig", "load_rig": ".loader", "select_hosts": ".select"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name], __name__), name)
