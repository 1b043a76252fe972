"""The `path_prepend` rule, defined once for every place that applies it.

A rig's `path_prepend: {PATH: [/usr/local/cuda/bin]}` reaches a process three ways: the profile.d script
(sh code that does the same as `prepend` here, tested against it), the systemd EnvironmentFile (rendered on
the control side with `prepend` over systemd's default PATH) and smoke's own processes on the node (the torch
probe and the DataParallel check take the node's environment and apply `prepend` to it). One rule: entries
come first in the order given; an entry the variable already holds stays where it is and is not added
again, so re-sourcing changes nothing; an unset or empty variable gets the entries alone, never an empty
element (which PATH would read as the current directory).

Stdlib only, Python 3.8: this module runs on the nodes inside the agent zipapp.
"""

from __future__ import annotations

from ..typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Optional, Sequence


def prepend(current: Optional[str], entries: Sequence[str]) -> str:
    """`current` (a colon-separated list, None when unset) with `entries` in front, each at most once."""
    value = current or ""
    for entry in reversed(entries):
        if entry not in value.split(":"):
            value = entry + ":" + value if value else entry
    return value
