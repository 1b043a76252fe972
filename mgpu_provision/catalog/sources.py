"""Where NVIDIA drivers come from on each distribution, and what each source calls its packages.

Every source names the same driver differently: Ubuntu's archive has `nvidia-driver-<branch>[-server][-open]`,
NVIDIA's CUDA repository has `cuda-drivers-<branch>` / `nvidia-open-<branch>` (and drops the branch from the
names from 590 on, locking a branch with a pinning package instead), Debian's non-free has a compute set
without branch names, RHEL has dnf module streams. Plan and validate read the flavors each source has from
here; the agent reads the package names. Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import fnmatch
import re

from ..protocol import PackageSet
from ..typing_lite import TYPE_CHECKING
from . import names

if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

SOURCES = ("ubuntu", "cuda", "debian", "rhel")
FLAVORS: Dict[str, Tuple[str, ...]] = {
    "ubuntu": ("default", "server", "open", "server-open"),
    "cuda": ("default", "open"),
    "debian": ("default", "open"),
    "rhel": ("default", "open"),
}
# Debian has no Fabric Manager package at all; the others ship it at every driver version.
HAS_FABRICMANAGER = {"ubuntu": True, "cuda": True, "debian": False, "rhel": True}

# Held together with the driver: Ubuntu and the CUDA repository put the branch in every versioned piece
# (libraries, utils, kernel source, NSCQ, prebuilt linux-modules-nvidia-<branch>-<kernel>); the unversioned
# sets are caught by name.
_BRANCH_HOLD = ("*nvidia*-{b}", "*nvidia*-{b}-*", "cuda-drivers-{b}")
_UNVERSIONED_HOLD = ("*nvidia*", "libcuda*", "cuda-drivers*", "libnvsdm*")
# The apt preferences stanza pins every package of these names offered at the wanted upstream version.
APT_PIN_NAMES = ("*nvidia*", "libcuda*", "cuda-drivers*", "libnvsdm*")
# Debian (contrib) and NVIDIA's RPM repository ship the daemon on its own; Ubuntu's driver packages carry it.
PERSISTENCED_PACKAGE = "nvidia-persistenced"


# NVML names of GPUs older than Turing (Kepler, Maxwell, Pascal, Volta): open kernel modules need the GSP
# that Turing introduced, so these run only the proprietary modules.
_PRE_TURING = re.compile(
    r"\b(GTX (6|7|9|10)\d\d|GT 10\d\d|(Tesla|Quadro) [KMP]\d+|TITAN (X|Xp|V)\b|TITAN Black|[KMPV]100\b|"
    r"P40\b|P4\b|P6\b|GV100|GP100|K80|K40|M60|M40)"
)
OPEN_DEFAULT_FROM = 560  # the runfile installs open modules by default from this branch on


def pre_turing(model: str) -> bool:
    """Whether a GPU (by its exact NVML name) predates Turing and so cannot run the open kernel modules."""
    return bool(_PRE_TURING.search(model))


def runfile_module_type(flavor: Optional[str], model: str, branch: str) -> str:
    """open or proprietary for the runfile's `--kernel-module-type`: the rig's flavor, else NVIDIA's default
    for the branch where the GPU can run it."""
    if flavor == "open":
        return "open"
    if flavor == "default" or pre_turing(model) or int(branch) < OPEN_DEFAULT_FROM:
        return "proprietary"
    return "open"


def default_flavor(source: str, model: str, branch: str) -> str:
    """The flavor a rig without one gets: NVIDIA's default module type for the branch on this GPU (open from
    560 on Turing and later), in the source's words (Ubuntu: the server builds)."""
    open_modules = runfile_module_type(None, model, branch) == "open"
    if source == "ubuntu":
        return "server-open" if open_modules else "server"
    return "open" if open_modules else "default"


def apt_set(
    source: str,
    branch: str,
    flavor: str,
    fabricmanager: bool,
    packages: Optional[List[str]] = None,
    debian_family: bool = False,
    nvlink5: bool = False,
) -> PackageSet:
    """The set one apt install puts on a node (names from catalog/names.py). NVIDIA's repository for
    Debian names its libraries without the branch at every branch (`debian_family`: the node is Debian), as
    the CUDA repository does everywhere from 590: the unversioned set is held by name."""
    b = int(branch)
    pinning, install = names.driver_set(source, b, flavor)
    unversioned = source == "cuda" and (b >= names.UNVERSIONED_DRIVER_FROM or debian_family)
    if unversioned or source == "debian":
        hold = list(_UNVERSIONED_HOLD)
    else:
        hold = [p.format(b=b) for p in _BRANCH_HOLD]
    if packages:
        install = list(packages)
    if fabricmanager:
        install += fabricmanager_packages(source, branch, "apt", nvlink5)
    return PackageSet(pinning, install, hold + _held_by_name(install, hold))


def _held_by_name(install: List[str], hold: List[str]) -> List[str]:
    """The set's packages at the driver's version that its branch patterns miss: from 580 NVIDIA names
    Fabric Manager, NSCQ, NVSDM and IMEX without the branch (`nvidia-fabricmanager`, `libnvidia-nscq`)
    while the 580 driver set keeps it, so they are held by name; else facts would count them unheld and
    every plan would show a hold that apply never makes. NVLink Subnet Manager keeps its own version."""
    return [
        name
        for name in install
        if not names.own_version(name)
        and not any(fnmatch.fnmatchcase(name, p) for p in hold)
        and not any(fnmatch.fnmatchcase(name, p) for p in names.NEVER_HOLD)
    ]


def fabricmanager_packages(source: str, branch: str, method: str = "apt", nvlink5: bool = False) -> List[str]:
    """Fabric Manager and NSCQ (the NVSwitch library it loads), always at the driver's exact version, and
    on NVLink5 boxes NVSDM and the subnet manager; the names change at 580 (catalog/names.py)."""
    return names.fabric_set(source, method, int(branch), nvlink5)


def dnf_packages(
    branch: str, flavor: str, exact: bool, fabricmanager: bool, nvlink5: bool = False
) -> List[str]:
    """What one dnf transaction installs: with an `exact` version the driver's pieces (each pinned at it by
    the agent), else the metapackage that follows the branch; Fabric Manager and NSCQ with them (and NVLink5's
    pieces on HGX B200/B300)."""
    open_modules = flavor == "open"
    if exact:
        kmod = "kmod-nvidia-open-dkms" if open_modules else "kmod-nvidia-latest-dkms"
        wanted = ["nvidia-driver", "nvidia-driver-cuda", kmod]
    else:
        wanted = ["nvidia-open" if open_modules else "cuda-drivers"]
    return wanted + (fabricmanager_packages("rhel", branch, "dnf", nvlink5) if fabricmanager else [])


# SUSE's nvidia-open-driver-G07-signed builds 590 and later (its first sources are open-gpu-kernel-modules
# 590.44.01); G06 is 580 and earlier (bmwiedemann/openSUSE packages/n/nvidia-open-driver-G0{6,7}-signed).
G07_FROM = 590


def suse_generation(branch: int) -> str:
    """SUSE's driver generation of a branch: G06 up to 580, G07 from 590."""
    return "G07" if branch >= G07_FROM else "G06"


def zypper_set(branch: str, flavor: str, fabricmanager: bool, nvlink5: bool = False) -> PackageSet:
    """What zypper installs for a branch and flavor: the metapackage, the compute utilities and kernel
    modules of the branch's generation, Fabric Manager (and NVLink5's pieces on HGX B200/B300). The open
    modules are SUSE's signed `-cuda-` KMP flavour, the one built at the CUDA repository's driver
    versions (its graphics flavour follows SUSE's own: nvidia-open-driver-G06-signed.spec, `Name:
    ...%{?with_cuda:-cuda}`, `Version: %{cuda_version}`). Each name is locked but those with versions of
    their own."""
    b = int(branch)
    gen = suse_generation(b)
    unversioned = b >= names.UNVERSIONED_DRIVER_FROM
    open_modules = flavor == "open"
    main = "nvidia-open" if open_modules else "cuda-drivers"
    kmp = (
        f"nvidia-open-driver-{gen}-signed-cuda-kmp-default"
        if open_modules
        else f"nvidia-driver-{gen}-kmp-default"
    )
    install = [main if unversioned else f"{main}-{b}", f"nvidia-compute-utils-{gen}", kmp]
    if fabricmanager:
        install += fabricmanager_packages("cuda", branch, "zypper", nvlink5)  # RPM names, as on RHEL
    pinning = [f"nvidia-driver-pinning-{b}"] if unversioned else []
    return PackageSet(pinning, install, pinning + [n for n in install if not names.own_version(n)])
