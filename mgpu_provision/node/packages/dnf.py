"""Installing a driver with dnf from NVIDIA's CUDA repository (RHEL and relatives) at one exact version.

Driver, kernel module, Fabric Manager and NSCQ go in one transaction at the version, so Fabric Manager
can never end newer than the driver (it then refuses to start). On RHEL 8/9 the branch's module stream is
enabled first; where streams are gone (RHEL 10, Fedora) a versionlock picks the branch. Versionlock needs
`python3-dnf-plugin-versionlock`, which RHEL 9 does not install by default, and every NVIDIA lock is
deleted first: a previous branch's locks would block a branch change.
"""

from __future__ import annotations

from typing import Any, Dict, List

from .common import Command

VERSIONLOCK_PLUGIN = "python3-dnf-plugin-versionlock"


def commands(step: Dict[str, Any]) -> List[Command]:
    branch, version, names = step["branch"], step["version"], step["packages"]
    result = [
        Command(["dnf", "-y", "install", VERSIONLOCK_PLUGIN]),
        Command(["dnf", "-y", "versionlock", "delete", "*nvidia*"], check=False),  # none there is fine
    ]
    modules = step["modules"]
    if modules:
        stream = f"{branch}-open" if step["flavor"] == "open" else f"{branch}-dkms"
        result += [
            Command(["dnf", "-y", "module", "reset", "nvidia-driver"]),
            Command(["dnf", "-y", "module", "enable", f"nvidia-driver:{stream}"]),
        ]
    if version:
        result.append(Command(["dnf", "-y", "install", "--allowerasing", *[f"{n}-{version}" for n in names]]))
    else:
        if not modules:  # no stream to follow: the lock is what keeps dnf on the branch
            result.append(Command(["dnf", "-y", "versionlock", "add", f"*nvidia*{branch}*"]))
        result.append(Command(["dnf", "-y", "install", "--allowerasing", *names]))
    if step["hold"] and (version or modules):
        result.append(Command(["dnf", "-y", "versionlock", "add", f"*nvidia*{version or branch}*"]))
    return result
