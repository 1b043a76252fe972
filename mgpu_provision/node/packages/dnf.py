"""Installing a driver with dnf or yum from NVIDIA's CUDA repository (RHEL and relatives) at one version.

Driver, kernel module, Fabric Manager and NSCQ (the step's packages, as the plan resolved them) go in one
transaction at the version, so Fabric Manager can never end newer than the driver (it then refuses to
start). On RHEL 8/9 and Amazon Linux 2023 the branch's module stream is enabled first; where there are no
streams (the RHEL 10 family, Fedora) a versionlock picks the branch. EL7 and Amazon Linux 2 have yum, which
takes the same commands but has no streams, no `--allowerasing`, and moves down only with `downgrade`.
Versionlock needs its plugin (`python3-dnf-plugin-versionlock`, `yum-plugin-versionlock`), which RHEL does
not install by default, and every NVIDIA lock is deleted first: a previous branch's locks would block a
branch change. An exact version the repositories lack fails before any of that, naming the versions they
have.
"""

from __future__ import annotations

from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.errors import AgentFailure
from .common import Command, at_driver_version, listed_versions, resolve_version, version_key

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

VERSIONLOCK_PLUGIN = {"dnf": "python3-dnf-plugin-versionlock", "yum": "yum-plugin-versionlock"}


def install_argv(tool: str) -> List[str]:
    """dnf's or yum's install command (yum has no `--allowerasing`)."""
    return [tool, "-y", "install", "--allowerasing"] if tool == "dnf" else [tool, "-y", "install"]


def check_available(step: Dict[str, Any]) -> None:
    """Refuse, changing nothing, an exact version the repositories do not offer for every package."""
    tool = step["method"]

    def offered(name: str) -> List[str]:
        # The versionlock plugin hides what the current locks exclude: the version asked for may be one.
        argv = [tool, "-q", "--disableplugin=versionlock", "list", "--showduplicates", name]
        return listed_versions(system.run(argv, timeout=600).stdout, name)

    versioned, own = at_driver_version(step["packages"])
    where = f"the {tool} repositories"
    if step["version"]:
        nvidia = None if step.get("repo") else tool
        resolve_version(versioned, offered, step["version"], step["branch"], where, nvidia)
    absent = [name for name in own if not offered(name)]
    if absent:
        raise AgentFailure("driver", f"{', '.join(absent)} not available from {where}; nothing was changed")


def at_version(packages: List[str], version: str) -> List[str]:
    """`name-version` for the packages at the driver's version, the name alone for those with versions of
    their own (NVLink Subnet Manager, infiniband-diags: NVIDIA's rhel9/install.sh installs them so)."""
    versioned, own = at_driver_version(packages)
    return [f"{n}-{version}" for n in versioned] + own


def commands(step: Dict[str, Any], current: Optional[str] = None) -> List[Command]:
    """The step's command lines; `current` (the installed version) tells yum which way it moves."""
    tool, branch, version, names = step["method"], step["branch"], step["version"], step["packages"]
    result = [
        Command([tool, "-y", "install", VERSIONLOCK_PLUGIN[tool]]),
        Command([tool, "-y", "versionlock", "delete", "*nvidia*"], check=False),  # none there is fine
    ]
    modules = step["modules"] and tool == "dnf"
    if modules:
        stream = f"{branch}-open" if step["flavor"] == "open" else f"{branch}-dkms"
        result += [
            Command(["dnf", "-y", "module", "reset", "nvidia-driver"]),
            Command(["dnf", "-y", "module", "enable", f"nvidia-driver:{stream}"]),
        ]
    install = install_argv(tool)
    if version:
        if tool == "yum" and current and version_key(version) < version_key(current):
            install = ["yum", "-y", "downgrade"]
        result.append(Command([*install, *at_version(names, version)]))
    else:
        if not modules:  # no stream to follow: the lock is what keeps dnf on the branch
            result.append(Command([tool, "-y", "versionlock", "add", f"*nvidia*{branch}*"]))
        result.append(Command([*install, *names]))
    if step["hold"] and (version or modules):
        result.append(Command([tool, "-y", "versionlock", "add", f"*nvidia*{version or branch}*"]))
    return result
