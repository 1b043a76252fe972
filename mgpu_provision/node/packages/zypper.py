"""Installing a driver with zypper (SUSE Linux Enterprise Server 15, openSUSE Leap 15) at one exact version.

NVIDIA's CUDA repositories `sles15` and `opensuse15` carry the driver as RPMs: a branch metapackage
(`cuda-drivers-<branch>`, `nvidia-open-<branch>`; from 590 unversioned, with `nvidia-driver-pinning-<branch>`
choosing the branch), the G06 pieces it pulls in, and Fabric Manager and NSCQ by name. The plan resolves the
set (`catalog.sources.zypper_set`); the node installs every package of it at `name=version` in one
transaction, so the whole set moves up or down together (`--oldpackage` allows the way down), and holds it
with `zypper addlock` on each name. A version the repository lacks fails before anything changes, naming
the versions it has; the locks of every NVIDIA package are removed first, as a previous branch's locks
would block the change.
Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Dict, List, Tuple

from ..core import system
from .common import Command, installed_rpms, resolve_version, run_all, upstream

ZYPPER = ["zypper", "--non-interactive", "--no-gpg-checks"]
# Locks of these names are NVIDIA's: cleared before an install (a previous branch's names included).
LOCK_PATTERNS = ("*nvidia*", "cuda-drivers*", "libnvidia*", "libcuda*")


def search_versions(output: str, name: str) -> List[str]:
    """Versions of `name` in `zypper search --details --match-exact` output (`S | Name | Type | Version`)."""
    found: List[str] = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) >= 4 and cells[1] == name and cells[3] not in found:
            found.append(cells[3])
    return found


def lock_names(output: str) -> List[str]:
    """Names locked in `zypper locks` output (`# | Name | Type | Repository`), in its order."""
    names: List[str] = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            names.append(cells[1])
    return names


def _offered(name: str) -> List[str]:
    result = system.run([*ZYPPER, "search", "--details", "--match-exact", name], timeout=300)
    return search_versions(result.stdout, name)


def install(step: Dict[str, Any], what: str = "driver") -> Tuple[bool, str]:
    """Install the step's set at one version and lock it; `what` names it in the messages."""
    names = list(step["pinning"]) + list(step["packages"])
    kind = "driver" if what == "driver" else "fabricmanager"  # the error kind; `what` is for the words
    run_all([Command([*ZYPPER, "refresh"])], kind)  # stale metadata says "not found"
    found = resolve_version(names, _offered, step["version"], step["branch"], "the zypper repositories")
    target = upstream(found)
    hold = bool(step["hold"])
    locked_now = lock_names(system.run([*ZYPPER, "locks"], timeout=120).stdout)
    installed = installed_rpms(names)
    at_version = all(upstream(installed.get(n, "")) == target for n in names)
    if at_version and (not hold or set(step["hold_patterns"]) <= set(locked_now)):
        return False, f"{what} {target} already installed"
    ours = [n for n in locked_now if any(fnmatch.fnmatchcase(n, p) for p in LOCK_PATTERNS)]
    commands = [Command([*ZYPPER, "removelock", *ours])] if ours else []
    commands.append(
        Command([*ZYPPER, "install", "--oldpackage", "--no-recommends", *[f"{n}={target}" for n in names]])
    )
    if hold:
        commands.append(Command([*ZYPPER, "addlock", *step["hold_patterns"]]))
    run_all(commands, kind)
    kept = f"{len(step['hold_patterns'])} packages locked" if hold else "not locked"
    reboot = "; reboot to load it" if what == "driver" else ""
    return True, f"installed {what} {target} with zypper, {kept}{reboot}"
