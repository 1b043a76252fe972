"""Carrying out a `driver` step on a real node: which source and flavor, then the apt, dnf or yum, zypper or
runfile path.

The control side decides the source (from the node's os-release or the rig), the flavor, the branch, apt's
package set and, for a runfile, the kernel module type; this module defaults none of them: it checks that
the source and flavor are ones it knows and hands the step to the path that knows the package manager
(node/packages/apt.py, node/packages/dnf.py, node/packages/zypper.py, node/packages/runfile.py).
"""

from __future__ import annotations

from ...catalog import sources
from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.errors import AgentFailure
from .common import installed_debs, installed_version, run_all, upstream, version_key

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

__all__ = ["install", "installed_version", "unheld_packages", "version_key"]


def check_source(step: Dict[str, Any]) -> None:
    """A package install's source and flavor must be ones this agent knows (the plan resolved both)."""
    source, flavor = step["source"], step["flavor"]
    if source not in sources.SOURCES:
        raise AgentFailure("driver", f"unknown driver source {source!r} ({', '.join(sources.SOURCES)})")
    if flavor not in sources.FLAVORS[source]:
        have = ", ".join(sources.FLAVORS[source])
        raise AgentFailure("driver", f"the {source} source has no {flavor!r} driver flavor ({have})")


def install(step: Dict[str, Any], current: Optional[str]) -> Tuple[bool, str]:
    """Install the step's driver unless the exact version is already there; return (changed, message)."""
    from . import apt, dnf, rpmrepo, runfile, zypper  # only an install needs them: facts reads through here

    method, branch, version = step["method"], step["branch"], step["version"]
    if method != "runfile":
        check_source(step)
    if method in ("dnf", "yum") and step["repo"]:
        rpmrepo.configure(method, step["repo"])  # read once before any package moves; taken back if not
    if method == "apt":
        return apt.install(step, "driver")
    if method == "zypper":
        return zypper.install(step, "driver")
    if version and current == version:
        return False, f"driver {version} already installed"
    if method in ("dnf", "yum"):
        dnf.check_available(step)
        run_all(dnf.commands(step, current))
    else:
        runfile.install(step)
    return True, f"installed driver {version or 'branch ' + branch} with {method}; reboot to load it"


def installed_module() -> Optional[str]:
    """open or proprietary: the nvidia module installed for the running kernel, by its license (the open
    modules are `Dual MIT/GPL`, NVIDIA's proprietary ones `NVIDIA`: kernel-open/nvidia/nv.c and
    kernel/nvidia/nv.c of the driver's sources); None without one or without modinfo."""
    found = system.run(["modinfo", "-F", "license", "nvidia"], timeout=30)
    if found.returncode != 0:
        return None
    license_ = found.stdout.strip()
    return "open" if "GPL" in license_ else ("proprietary" if license_ else None)


def unheld_packages(version: str) -> List[str]:
    """Installed packages of the driver set at `version` that apt does not hold (unattended upgrades or a
    hand's `apt-mark unhold` would let them move); none on RPM systems, where versionlock is asked."""
    debs = installed_debs(sources.APT_PIN_NAMES)
    return sorted(name for name, (deb, held) in debs.items() if not held and upstream(deb) == version)
