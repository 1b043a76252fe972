"""nvidia-persistenced with persistence mode actually on: the unit's effective command line, and a drop-in
where it turns persistence off or does not ask for it.

A daemon that is enabled and active is not yet persistence: Ubuntu's unit starts it with
`--no-persistence-mode`, so the GPUs are torn down between clients after every boot, and what the boot unit
set with NVML (power limit, compute mode) is lost with them (nvml.h: a power limit does not survive a driver
unload without persistence). NVIDIA's Ansible role therefore overrides ExecStart with `--persistence-mode`;
apply writes the same override as a systemd drop-in, and facts report the ExecStart systemd will run.

Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import os

from ...catalog.persistenced import ON, drop_in, exec_start_of, persistence_on
from ...typing_lite import TYPE_CHECKING
from ..core import system

if TYPE_CHECKING:
    from typing import List, Optional, Tuple

UNIT = "nvidia-persistenced.service"
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
DROP_IN = "/etc/systemd/system/nvidia-persistenced.service.d/mgpu-provision-persistence.conf"


def unit_texts(unit: str = UNIT, dirs: Tuple[str, ...] = UNIT_DIRS) -> List[str]:
    """The unit file systemd would load and its drop-ins in systemd's order (by file name; a drop-in in an
    earlier folder hides one of the same name in a later folder)."""
    main = next((os.path.join(d, unit) for d in dirs if os.path.isfile(os.path.join(d, unit))), None)
    if main is None:
        return []
    drop_ins = {}
    for folder in reversed(dirs):
        path = os.path.join(folder, unit + ".d")
        for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
            if name.endswith(".conf"):
                drop_ins[name] = os.path.join(path, name)
    texts = [system.read_text(main) or ""]
    return texts + [system.read_text(drop_ins[name]) or "" for name in sorted(drop_ins)]


def effective_exec_start(unit: str = UNIT) -> Optional[str]:
    """What systemd runs: the running manager's answer (it merged the drop-ins), else the files read as it
    would (a box whose manager has not reloaded yet, or a root without a running systemd)."""
    shown = system.run(["systemctl", "show", "-p", "ExecStart", "--value", unit], timeout=20)
    argv = _shown_argv(shown.stdout) if shown.returncode == 0 else None
    return argv if argv else exec_start_of(unit_texts(unit))


def _shown_argv(text: str) -> Optional[str]:
    # `{ path=/usr/bin/nvidia-persistenced ; argv[]=/usr/bin/nvidia-persistenced --user nvpd ; ... }`
    for part in text.split(";"):
        part = part.strip().lstrip("{").strip()
        if part.startswith("argv[]="):
            return part[len("argv[]=") :].strip()
    return None


def ensure_persistence_mode() -> Tuple[bool, str]:
    """Write the drop-in where the effective command line lacks persistence mode; reload systemd."""
    current = effective_exec_start()
    if current is None:
        return False, "{} has no ExecStart to override".format(UNIT)
    if persistence_on(current):
        return False, "{} runs with {}".format(UNIT, ON)
    from ..core.atomic import atomic_write  # only a change writes: facts never pays for it

    atomic_write(DROP_IN, drop_in(current).encode("utf-8"), 0o644)
    # Without a running manager (a root being prepared) the reload fails; the next boot reads the file.
    system.run(["systemctl", "daemon-reload"], timeout=60)
    return True, "{} drop-in {}: ExecStart with {}".format(UNIT, DROP_IN, ON)
