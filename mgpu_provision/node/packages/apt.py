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
import re

from ...catalog import names, sources
from ...protocol import PackageSet, branch_of
from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.atomic import atomic_write
from ..core.errors import AgentFailure
from . import mirror
from .common import (
    Command,
    at_driver_version,
    installed_debs,
    installed_version,
    resolve_version,
    run_all,
    upstream,
)

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

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


def preferences(packages: List[str], version: str) -> str:
    """The pin holding the whole set at one upstream version (a glob: revisions may differ in the set)."""
    extra = [p for p in packages if not matching([p], list(sources.APT_PIN_NAMES))]
    names = " ".join(list(sources.APT_PIN_NAMES) + extra)
    return (
        "# Written by mgpu-provision: the NVIDIA driver set stays at this version.\n"
        f"Package: {names}\nPin: version {upstream(version)}-*\nPin-Priority: 1001\n"
    )


def matching(packages: List[str], patterns: List[str]) -> List[str]:
    return sorted({n for n in packages if any(fnmatch.fnmatchcase(n, p) for p in patterns)})


def holdable(packages: List[str]) -> List[str]:
    """The packages a hold may freeze: never Ubuntu's prebuilt modules for one kernel (held, the next
    kernel's modules could not come in and that kernel would boot without a driver)."""
    return [n for n in packages if not matching([n], list(names.NEVER_HOLD))]


_BRANCH_IN_NAME = re.compile(r"^(?:nvidia|libnvidia|cuda-drivers)[a-z0-9-]*?-(\d{3})(?:-server)?(?:-open)?$")


def moved_branch(show: str, branch: str) -> Optional[str]:
    """The branch a package of `branch` was folded into (Ubuntu replaces retired branches with transitional
    packages that depend on the next branch's), None when it is a package of its own branch."""
    for line in show.splitlines():
        if not line.startswith(("Depends:", "Pre-Depends:")):
            continue
        for alternative in re.split(r"[,|]", line.split(":", 1)[1]):
            name = alternative.strip().split(" ")[0].split(":")[0]
            found = _BRANCH_IN_NAME.match(name)
            if found and found.group(1) != branch:
                return found.group(1)
    return None


def ubuntu_prebuilt_available(
    madison: str, branch: int, flavor: str, kernel: str, flavour: Optional[str] = None
) -> bool:
    """Whether Ubuntu's archive has signed prebuilt modules for the running kernel: the flavour's
    metapackage (`flavour`: the installed kernel metapackage's, else the one `uname -r` ends in) and the
    package for this kernel's ABI (ubuntu-drivers asks for both)."""
    flavour = flavour or names.kernel_flavour(kernel)
    if flavour is None:
        return False
    server = "server-open" if flavor.endswith("open") else "server"
    wanted = {
        "linux-modules-nvidia-{}-{}-{}".format(branch, server, flavour),
        "linux-modules-nvidia-{}-{}-{}".format(branch, server, kernel),
    }
    offered = {line.split("|")[0].strip() for line in madison.splitlines() if line.count("|") >= 2}
    return wanted <= offered


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
    if step.get("repo"):
        use_mirror(step["repo"], step["packages"])
    run_all([Command(["apt-get", "update", "-q"])])  # stale lists say "not available"
    packages, modules = ubuntu_modules(step) if what == "driver" else (step["packages"], "")
    pkgset = PackageSet(step["pinning"], packages, step["hold_patterns"])
    # The kernel's module packages carry the kernel's version, NVLink Subnet Manager its own.
    versioned, own = at_driver_version(holdable(pkgset.install))
    nvidia = "apt" if source == "cuda" and not step.get("repo") else None
    target = resolve_version(versioned, _offered, step["version"], branch, "the apt sources", nvidia)
    refuse_transitional(pkgset.install[0], target, branch)
    missing_own(own)
    pin = preferences(versioned, target)
    before = installed_debs(tuple(sources.APT_PIN_NAMES) + tuple(own))
    if _in_place(before, pkgset, target, hold) and system.read_text(PREFERENCES) == (pin if hold else None):
        return False, f"{what} {upstream(target)} already installed ({target})"
    atomic_write(PREFERENCES, pin.encode("utf-8"), 0o644)
    run_all(install_commands(pkgset, [name for name, (_, held) in before.items() if held]))
    if what == "driver":
        check_installed_branch(branch)
    if hold:
        held = holdable(matching(list(installed_debs(sources.APT_PIN_NAMES)), pkgset.hold))
        run_all([Command(["apt-mark", "hold", *held])] if held else [])
        kept = f"{len(held)} packages held"
    else:
        os.remove(PREFERENCES)  # no hold asked for: later upgrades may move the driver
        kept = "not held"
    reboot = "; reboot to load it" if what == "driver" else ""
    return True, f"installed {what} {upstream(target)} ({target}) from {source}{modules}, {kept}{reboot}"


def use_mirror(repo: Dict[str, str], packages: List[str]) -> None:
    """Check that the set resolves from the mirror alone (before anything changes), then configure it."""
    missing = mirror.check(repo, packages)
    if missing:
        raise AgentFailure(
            "driver",
            f"mirror {repo['url']} lacks {', '.join(missing)} (needed by {', '.join(packages)}); nothing "
            "was changed",
        )
    mirror.configure(repo)


def running_kernel() -> str:
    return os.uname().release


def ubuntu_modules(step: Dict[str, Any]) -> Tuple[List[str], str]:
    """(packages, how the modules come) for Ubuntu's server builds: Canonical's signed prebuilt modules for
    the running kernel's flavour when the archive has them (ubuntu-drivers' choice, and the one that loads
    under Secure Boot without a MOK), else the source's own set, which builds them with DKMS."""
    packages: List[str] = list(step["packages"])
    if not step["prebuilt"]:  # the plan's choice: not Ubuntu's server set (the rig's own, Fabric Manager's)
        return packages, ""
    branch, flavor = int(step["branch"]), step["flavor"]
    kernel = running_kernel()
    listing = system.run(["dpkg-query", "-W", "-f", KERNEL_QUERY, "linux-image-*"], timeout=60).stdout
    flavour = kernel_metapackage_flavour(listing, kernel) or names.kernel_flavour(kernel)
    if flavour is None:
        return packages, f" (DKMS: {kernel} is not an Ubuntu kernel)"
    prebuilt = names.ubuntu_prebuilt(branch, flavor, flavour)
    abi = names.ubuntu_prebuilt(branch, flavor, kernel)[-1]
    madison = system.run(["apt-cache", "madison", prebuilt[-1], abi], timeout=120).stdout
    if not ubuntu_prebuilt_available(madison, branch, flavor, kernel, flavour):
        return packages, f" (DKMS: no prebuilt modules for {kernel})"
    return prebuilt, f" (signed prebuilt modules for {kernel}, following linux-image-{flavour})"


KERNEL_QUERY = "${Package}\t${db:Status-Abbrev}\t${Depends}\n"


def kernel_metapackage_flavour(listing: str, kernel: str) -> Optional[str]:
    """The flavour of the installed kernel metapackage that pulls in the running kernel (`generic-hwe-24.04`
    of `linux-image-generic-hwe-24.04`, which depends on `linux-image-6.11.0-29-generic`), from
    `dpkg-query -W -f '${Package}\t${db:Status-Abbrev}\t${Depends}'` output; None when none does.

    ubuntu-drivers (canonical/ubuntu-drivers-common, UbuntuDrivers/detect.py get_linux_modules_metapackage,
    through kerneldetection's get_linux_metapackage) names the modules metapackage after this one, so that
    the modules follow the kernel GRUB boots next: `uname -r`'s `-generic` on an HWE kernel would pull the
    GA kernel's modules and leave the HWE kernel without a driver."""
    images = ("linux-image-" + kernel, "linux-image-unsigned-" + kernel)
    for line in listing.splitlines():
        name, _, rest = line.partition("\t")
        status, _, depends = rest.partition("\t")
        flavour = name[len("linux-image-") :]
        if (
            not name.startswith("linux-image-")
            or status[1:2] != "i"
            or kernel in name
            or flavour[:1].isdigit()
        ):
            continue
        wanted = {dep.strip().split(" ")[0] for alt in depends.split(",") for dep in alt.split("|")}
        if wanted & set(images):
            return flavour
    return None


def refuse_transitional(package: str, target: str, branch: str) -> None:
    """A package of a retired branch that only depends on another branch's set would install that branch
    unpinned and unheld, and every later plan would show it moving back: refused, naming the branch."""
    show = system.run(["apt-cache", "show", f"{package}={target}"], timeout=120).stdout
    moved = moved_branch(show, branch)
    if moved is not None:
        raise AgentFailure(
            "driver",
            f"{package} {target} is a transitional package: the archive moved branch {branch} to {moved} "
            f'(it depends on the {moved} set); set driver.branch to "{moved}"; nothing was changed',
        )


def check_installed_branch(branch: str) -> None:
    """After an install, the driver library apt put on the box is of the branch asked for."""
    version = installed_version()
    if version is not None and branch_of(version) != branch:
        raise AgentFailure(
            "driver",
            f"apt installed driver {version}, not branch {branch}: the archive's packages of branch {branch} "
            "lead to another branch; pin that branch in the rig file",
        )


def missing_own(own: List[str]) -> None:
    """Packages installed at their own version (NVLink Subnet Manager and its tools) must be on offer at
    all: one the sources lack fails before anything changes."""
    absent = [name for name in own if not _offered(name)]
    if absent:
        raise AgentFailure(
            "driver",
            f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not available from the apt sources "
            "(NVIDIA's CUDA repository has them); nothing was changed",
        )


def _in_place(installed: Dict[str, Tuple[str, bool]], pkgset: PackageSet, target: str, hold: bool) -> bool:
    present = all(p in installed for p in pkgset.install)
    versioned, _ = at_driver_version(holdable(pkgset.install))
    at_version = present and all(upstream(installed[p][0]) == upstream(target) for p in versioned)
    unheld = [n for n in holdable(matching(list(installed), pkgset.hold)) if not installed[n][1]]
    return at_version and not (hold and unheld)


def _offered(package: str) -> List[str]:
    return madison_versions(system.run(["apt-cache", "madison", package], timeout=120).stdout)
