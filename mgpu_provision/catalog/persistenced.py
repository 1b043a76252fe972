"""What nvidia-persistenced's unit asks for, read from its text: the ExecStart systemd runs (the unit and its
drop-ins in order), whether that command line turns persistence mode on, and the drop-in that does.

Ubuntu's unit starts the daemon with `--no-persistence-mode`, so an enabled, active daemon is not yet
persistence (node/packages/persistenced.py says why that matters). The node reads the unit files and writes
the drop-in; the plan reads the reported ExecStart with `persistence_on` and names the flag in its Changes:
one spelling of the flags for both.

Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import shlex

from ..typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import List, Optional

ON, OFF = "--persistence-mode", "--no-persistence-mode"


def exec_start_of(texts: List[str]) -> Optional[str]:
    """The ExecStart a unit file and its drop-ins (in the order systemd reads them) leave: each line adds
    a command, an empty `ExecStart=` clears the ones before; the last one stands (a forking daemon has
    one)."""
    commands: List[str] = []
    for text in texts:
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line
            elif section == "[Service]" and line.startswith("ExecStart="):
                value = line[len("ExecStart=") :].strip()
                commands = [value] if value else []
    return commands[-1] if commands else None


def persistence_on(exec_start: Optional[str]) -> bool:
    """Whether the daemon's command line asks for persistence mode (and does not turn it off)."""
    if exec_start is None:
        return False
    words = shlex.split(exec_start)
    return ON in words and OFF not in words


def drop_in(exec_start: str) -> str:
    """The override: the unit's own command with `--no-persistence-mode` replaced by, or else followed by,
    `--persistence-mode`."""
    words = [ON if word == OFF else word for word in shlex.split(exec_start)]
    if ON not in words:
        words.append(ON)
    command = " ".join(shlex.quote(word) for word in words)
    return (
        "# Written by mgpu-provision: persistence mode on at every boot (the unit's own command turns\n"
        "# it off or does not ask for it).\n"
        f"[Service]\nExecStart=\nExecStart={command}\n"
    )
