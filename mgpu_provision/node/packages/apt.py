"""Installing a driver with apt at one exact version, and holding every package of it there.

Pinning only the metapackage (`nvidia-driver-535=<version>`) does not resolve unless that version is the
candidate: its dependencies are versioned exactly and apt never picks a non-candidate version for a
dependency ("unmet dependencies"). So the lists are refreshed, the version is looked up (one the sources
lack fails here, naming the ones they have, before anything changes), and an apt preferences stanza pins
every package of the set at that upstream version with priority 1001, which moves the whole set up or
down. Holds are lifted on the whole set first (a held dependency blocks even
`--allow-change-held-packages`) and set afterwards on every installed package the source's patterns match.
"""

from __future__ import annotations

import fnmatch
import os
from typing import Any, Dict, List, Optional, Tuple

from ...protocol import PackageSet, branch_of
from ..core import system
from ..core.atomic import atomic_write
from ..core.errors import AgentFailure
from . import sources
from .common import Command, installed_debs, run_all, upstream, version_key

PREFERENCES = "/etc/apt/preferences.d/mgpu-provision-nvidia"
INSTALL = ["apt-get", "install", "-y", "--no-install-recommends", "--allow-downgrades"]


def madison_versions(madison: str) -> List[str]:
    """Full versions in `apt-cache madison` output (`pkg | 550.54.15-1 | source`), in apt's order."""
    found: List[str] = []
    for line in madison.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[1] and parts[1] not in found:
            found.append(parts[1])
    return found


def pick_version(available: List[str], version: Optional[str], branch: str) -> Optional[str]:
    """The full version to pin: the exact upstream version asked for, else the newest of the branch."""
    if version:
        return next((v for v in available if upstream(v) == version), None)
    of_branch = [v for v in available if branch_of(upstream(v)) == branch]
    return max(of_branch, key=lambda v: version_key(upstream(v))) if of_branch else None


def preferences(packages: List[str], version: str) -> str:
    """The pin holding the whole set at one upstream version (a glob: revisions may differ in the set)."""
    extra = [p for p in packages if not matching([p], list(sources.APT_PIN_NAMES))]
    names = " ".join(list(sources.APT_PIN_NAMES) + extra)
    return (
        "# Written by mgpu-provision: the NVIDIA driver set stays at this version.\n"
        f"Package: {names}\nPin: version {upstream(version)}-*\nPin-Priority: 1001\n"
    )


def matching(names: List[str], patterns: List[str]) -> List[str]:
    return sorted({n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)})


def install_commands(pkgset: PackageSet, held_now: List[str]) -> List[Command]:
    """Lift the set's holds, then install the pinning package (where the source has one), then the set."""
    commands = []
    release = matching(held_now, pkgset.hold + list(sources.APT_PIN_NAMES))
    if release:
        commands.append(Command(["apt-mark", "unhold", *release]))
    if pkgset.pinning:
        commands.append(Command(INSTALL + pkgset.pinning))
    commands.append(Command(INSTALL + pkgset.install))
    return commands


def install(step: Dict[str, Any], what: str) -> Tuple[bool, str]:
    """Install the step's package set (as the plan resolved it) at one version and hold it; `what` names it
    in the messages."""
    source, branch, hold = step["source"], step["branch"], step["hold"]
    pkgset = PackageSet(step["pinning"], step["packages"], step["hold_patterns"])
    run_all([Command(["apt-get", "update", "-q"])])  # stale lists say "not available"
    target = resolve_version(pkgset.install, step["version"], branch)
    pin = preferences(pkgset.install, target)
    before = installed_debs(sources.APT_PIN_NAMES)
    if _in_place(before, pkgset, target, hold) and system.read_text(PREFERENCES) == (pin if hold else None):
        return False, f"{what} {upstream(target)} already installed ({target})"
    atomic_write(PREFERENCES, pin.encode("utf-8"), 0o644)
    run_all(install_commands(pkgset, [name for name, (_, held) in before.items() if held]))
    if hold:
        held = matching(list(installed_debs(sources.APT_PIN_NAMES)), pkgset.hold)
        run_all([Command(["apt-mark", "hold", *held])] if held else [])
        kept = f"{len(held)} packages held"
    else:
        os.remove(PREFERENCES)  # no hold asked for: later upgrades may move the driver
        kept = "not held"
    reboot = "; reboot to load it" if what == "driver" else ""
    return True, f"installed {what} {upstream(target)} ({target}) from {source}, {kept}{reboot}"


def _in_place(
    installed: Dict[str, Tuple[str, bool]], pkgset: PackageSet, target: str, hold: bool
) -> bool:
    at_version = all(upstream(installed.get(p, ("", False))[0]) == upstream(target) for p in pkgset.install)
    unheld = [n for n in matching(list(installed), pkgset.hold) if not installed[n][1]]
    return at_version and not (hold and unheld)


def resolve_version(packages: List[str], version: Optional[str], branch: str) -> str:
    """The full version to pin, checked against what the sources offer for every package of the set."""
    target: Optional[str] = None
    for package in packages:
        available = madison_versions(system.run(["apt-cache", "madison", package], timeout=120).stdout)
        found = pick_version(available, upstream(target) if target else version, branch)
        if found is None:
            offered = ", ".join(sorted({upstream(v) for v in available}, key=version_key)) or "none"
            raise AgentFailure(
                "driver",
                f"{package} {version or 'of branch ' + branch} is not available from the apt sources "
                f"(they offer: {offered}); nothing was changed",
            )
        target = target or found
    if target is None:
        raise AgentFailure("driver", "the driver step names no package to install")
    return target
