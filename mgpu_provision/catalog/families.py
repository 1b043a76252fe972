"""Which package manager installs NVIDIA's driver on each distribution, read from /etc/os-release alone.

Plan resolves the method from a node's facts and puts it in the driver step; the node never guesses, so a
SUSE box is never driven with apt nor an EL7 box with dnf module streams. The table follows NVIDIA's Driver
Installation Guide (docs.nvidia.com/datacenter/tesla/driver-installation-guide, "Kernel Modules", table
"Open GPU kernel module installation", release 620): `dnf module enable nvidia-driver:<branch>-open` on
RHEL, Rocky, AlmaLinux and Oracle Linux 8/9 and on Amazon Linux 2023; `dnf versionlock` in place of streams on
the RHEL 10 family, Fedora and Azure Linux; zypper on SUSE Linux Enterprise Server 15 and openSUSE Leap 15
(NVIDIA's repositories `sles15` and `opensuse15`). EL7 (CentOS, RHEL, Oracle Linux 7) and Amazon Linux 2 have
yum and no NVIDIA module streams: yum with the versionlock plugin. Arch and every family NVIDIA publishes no
packages for get a manual step naming it, never another family's tool.
Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import re

from ..protocol import branch_of
from ..typing_lite import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import List, Optional, Tuple


class Family(NamedTuple):
    """What a distribution is, for installing NVIDIA's driver."""

    name: str  # "RHEL 9 family", "SUSE Linux Enterprise Server 15", …: what plan prints
    method: Optional[str]  # apt, dnf, yum or zypper; None: no package path (a manual step says why)
    source: Optional[str]  # the driver source its os-release suggests (catalog/sources.py)
    modules: bool = False  # NVIDIA serves the driver as dnf module streams
    problem: Optional[str] = None  # why the tool cannot install here


RHEL_IDS = ("rhel", "rocky", "almalinux", "ol", "centos", "circle", "eurolinux", "virtuozzo")
SUSE_IDS = ("sles", "sles_sap", "sled", "opensuse-leap")
ARCH_IDS = ("arch", "archarm", "manjaro", "endeavouros", "garuda", "artix")
# Releases NVIDIA's zypper repositories serve (sles15, opensuse15); the guide lists no other SUSE release.
SUSE_SUPPORTED_MAJOR = ("15",)
SUSE_SUPPORTED = "SUSE Linux Enterprise Server 15 and openSUSE Leap 15"
# Package methods and the sources each can install (CUDA's repository exists for every family).
METHOD_SOURCES = {
    "apt": ("ubuntu", "debian", "cuda"),
    "dnf": ("rhel", "cuda"),
    "yum": ("rhel", "cuda"),
    "zypper": ("cuda",),
}
_SUSE_NAMES = {"opensuse-leap": "openSUSE Leap"}
NO_OS_RELEASE = (
    "the box has no /etc/os-release (nor /usr/lib/os-release): its distribution, and so the package manager "
    "and the driver source, cannot be decided; give it its os-release (os-release(5)), or set driver.method: "
    "runfile"
)
_EL_PLATFORM = re.compile(r"^platform:el(\d+)$")


def _major(version_id: Optional[str]) -> str:
    return branch_of(version_id or "")


def family_of(
    os_id: Optional[str], version_id: Optional[str], os_like: List[str], platform_id: Optional[str] = None
) -> Family:
    """The family of an os-release's ID, VERSION_ID and ID_LIKE (its own ID first, then what it is like).

    A RHEL rebuild whose VERSION_ID is its vendor's own (TencentOS 3.1: `VERSION_ID="3.1"`, `ID_LIKE` naming
    rhel) says which RHEL it follows in PLATFORM_ID (`platform:el8`, the key dnf itself reads): that major
    wins for the RHEL family."""
    ids: Tuple[str, ...] = tuple(i for i in [os_id or "", *os_like] if i)
    major = _major(version_id)
    platform = _EL_PLATFORM.match(platform_id or "")
    for candidate in ids:
        if platform and candidate in RHEL_IDS:
            return _enterprise_linux(platform.group(1))
        found = _by_id(candidate, os_id or candidate, major)
        if found is not None:
            return found
    if not ids:
        return Family("a box without os-release", None, None, problem=NO_OS_RELEASE)
    what = os_id or "a distribution without an os-release ID"
    return Family(
        what,
        None,
        None,
        problem=f"{what}: no NVIDIA driver packages for this distribution; install it by hand or set "
        "driver.method: runfile",
    )


def _by_id(family_id: str, os_id: str, major: str) -> Optional[Family]:
    if family_id == "ubuntu":
        return Family("Ubuntu", "apt", "ubuntu")
    if family_id == "debian":
        return Family("Debian", "apt", "debian")
    if family_id == "amzn":
        if major == "2":
            return Family("Amazon Linux 2", "yum", "rhel")
        return Family(f"Amazon Linux {major}", "dnf", "rhel", modules=major == "2023")
    if family_id in RHEL_IDS:
        return _enterprise_linux(major)
    if family_id == "fedora":
        return Family("Fedora", "dnf", "rhel")
    if family_id in ("suse", "opensuse") or family_id in SUSE_IDS:
        return _suse(os_id, major)
    if family_id in ARCH_IDS:
        return Family(
            "Arch Linux",
            None,
            None,
            problem="Arch Linux: NVIDIA publishes no packages for it; install the driver with pacman by hand "
            "or set driver.method: runfile",
        )
    return None


def _enterprise_linux(major: str) -> Family:
    """RHEL and its rebuilds: yum on 7, dnf module streams on 8 and 9, versionlock alone from 10 on."""
    if not major.isdigit() or int(major) < 7:
        return Family(
            f"RHEL {major or '?'} family",
            None,
            None,
            problem=f"RHEL {major or '(no VERSION_ID)'} family: NVIDIA's repositories start at 7",
        )
    number = int(major)
    if number == 7:
        return Family("RHEL 7 family", "yum", "rhel")
    return Family(f"RHEL {number} family", "dnf", "rhel", modules=number in (8, 9))


def _suse(os_id: str, major: str) -> Family:
    label = _SUSE_NAMES.get(os_id, "openSUSE" if os_id.startswith("opensuse") else "SUSE Linux Enterprise")
    name = f"{label} {major}".strip()
    if os_id.startswith("opensuse") and os_id != "opensuse-leap":
        return Family(name, None, None, problem=f"{os_id}: NVIDIA's repositories serve {SUSE_SUPPORTED} only")
    if major not in SUSE_SUPPORTED_MAJOR:
        return Family(name, None, None, problem=f"{name}: NVIDIA's repositories serve {SUSE_SUPPORTED} only")
    return Family(name, "zypper", "cuda")


def method_problem(family: Family, method: str, source: str) -> Optional[str]:
    """Why `method` with `source` cannot install on this family, None when it can."""
    if method == "runfile":
        return None
    if family.method is None:
        return family.problem
    if method != family.method:
        return f"{family.name} installs packages with {family.method}, not {method}"
    if source not in METHOD_SOURCES[method]:
        return f"the {source} source is not installed with {method} ({family.name})"
    return None
