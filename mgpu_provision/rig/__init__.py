"""Rig file: models, loading with line numbers, cross-field rules."""

from .loader import LoadedRig, load_rig
from .select import select_hosts

__all__ = ["LoadedRig", "load_rig", "select_hosts"]
