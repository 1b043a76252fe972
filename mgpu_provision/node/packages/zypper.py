"""Installing a driver with zypper (SUSE Linux Enterprise Server 15, openSUSE Leap 15) at one exact version.

NVIDIA's CUDA repositories `sles15` and `opensuse15` carry the driver as RPMs: a branch metapackage
(`cuda-drivers-<branch>`, `nvidia-open-<branch>`; from 590 unversioned, with `nvidia-driver-pinning-<branch>`
choosing the branch), the compute utilities and SUSE's kernel module package (KMP) of the generation that
branch belongs to, and Fabric Manager and NSCQ by name. The plan resolves the set
(`catalog.sources.zypper_set`); the node
installs every package of it at its full version in one transaction, so the whole set moves up or down
together (`--oldpackage` allows the way down), and holds it with `zypper addlock` on each name. A KMP's
version carries the kernel it was built for (`580.95.05_k6.4.0_150600.23.73-1.1`), so each package is
installed at the full version the repository lists for it, matched by the driver's version before `_k`. A
version the repository lacks fails before anything changes, naming the versions it has; the locks of every
NVIDIA package are removed first, as a previous branch's locks would block the change.

Signatures are checked on every call: zypper's `--no-gpg-checks` would install kernel modules as root from
anything that answers at the repository's address (zypper's option table, src/Zypper.cc: "Ignore GPG check
failures and continue"). The repository's key is imported once, where the repository is configured
(node/packages/rpmrepo.py), as NVIDIA's installation guide does with `zypper addrepo` and its key.
Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import fnmatch
import re
import xml.etree.ElementTree as ElementTree

from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.errors import AgentFailure
from . import rpmrepo
from .common import Command, at_driver_version, installed_rpms, resolve_version, run_all, upstream

if TYPE_CHECKING:
    from typing import Any, Dict, List, Tuple

ZYPPER = ["zypper", "--non-interactive"]
# Locks of these names are NVIDIA's: cleared before an install (a previous branch's names included).
LOCK_PATTERNS = ("*nvidia*", "cuda-drivers*", "libnvidia*", "libcuda*")


def search_versions(xml: str, name: str) -> List[str]:
    """Versions (editions) of `name` in `zypper --xmlout search --details --match-exact` output, in its
    order: `<solvable name="cuda-drivers-550" edition="550.90.07-1" .../>` (zypper's xmlout schema,
    openSUSE/zypper doc/xmlout.rnc)."""
    start = xml.find("<")
    try:
        root = ElementTree.fromstring(xml[start:]) if start >= 0 else None
    except ElementTree.ParseError:
        return []
    found: List[str] = []
    for solvable in root.iter("solvable") if root is not None else []:
        edition = solvable.get("edition") or ""
        package = solvable.get("name") == name and solvable.get("kind", "package") == "package"
        if package and edition and edition not in found:
            found.append(edition)
    return found


def lock_names(output: str) -> List[str]:
    """Names locked in `zypper locks` output (`# | Name | Type | Repository`), in its order."""
    locked: List[str] = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            locked.append(cells[1])
    return locked


def _offered(name: str) -> List[str]:
    argv = [*ZYPPER, "--xmlout", "search", "--details", "--match-exact", name]
    return search_versions(system.run(argv, timeout=300).stdout, name)


def _edition_key(edition: str) -> List[int]:
    return [int(part) for part in re.findall(r"\d+", edition)]


def editions(names_: List[str], offered: Dict[str, List[str]], target: str) -> List[str]:
    """`name=edition` for each package at the driver's version `target` (the newest edition of it, a KMP's
    built for the newest kernel on offer)."""
    wanted = []
    for name in names_:
        matching = [v for v in offered[name] if upstream(v) == target]
        wanted.append(f"{name}={max(matching, key=_edition_key)}")
    return wanted


def install(step: Dict[str, Any], what: str = "driver") -> Tuple[bool, str]:
    """Install the step's set at one version and lock it; `what` names it in the messages."""
    wanted = list(step["pinning"]) + list(step["packages"])
    versioned, own = at_driver_version(wanted)
    kind = "driver" if what == "driver" else "fabricmanager"  # the error kind; `what` is for the words
    if step.get("repo"):
        rpmrepo.configure("zypper", step["repo"])  # checked before it is written; taken back if unread
    run_all([Command([*ZYPPER, "refresh"])], kind)  # stale metadata says "not found"
    offered = {name: _offered(name) for name in wanted}
    nvidia = None if step.get("repo") else "zypper"
    where = "the zypper repositories"
    found = resolve_version(versioned, offered.__getitem__, step["version"], step["branch"], where, nvidia)
    absent = [name for name in own if not offered[name]]
    if absent:
        raise AgentFailure(
            kind, f"{', '.join(absent)} not available from the zypper repositories; nothing was changed"
        )
    target = upstream(found)
    hold = bool(step["hold"])
    locked_now = lock_names(system.run([*ZYPPER, "locks"], timeout=120).stdout)
    installed = installed_rpms(wanted)
    at_version = all(upstream(installed.get(n, "")) == target for n in versioned)
    locked = not hold or set(step["hold_patterns"]) <= set(locked_now)
    if at_version and all(n in installed for n in own) and locked:
        return False, f"{what} {target} already installed"
    ours = [n for n in locked_now if any(fnmatch.fnmatchcase(n, p) for p in LOCK_PATTERNS)]
    commands = [Command([*ZYPPER, "removelock", *ours])] if ours else []
    argv = [
        *ZYPPER,
        "install",
        "--oldpackage",
        "--no-recommends",
        *editions(versioned, offered, target),
        *own,
    ]
    commands.append(Command(argv))
    if hold:
        commands.append(Command([*ZYPPER, "addlock", *step["hold_patterns"]]))
    run_all(commands, kind)
    kept = f"{len(step['hold_patterns'])} packages locked" if hold else "not locked"
    reboot = "; reboot to load it" if what == "driver" else ""
    return True, f"installed {what} {target} with zypper, {kept}{reboot}"
