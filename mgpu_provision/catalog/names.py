"""What each package source calls the NVIDIA packages of one driver branch: the one table of names.

Every source names the same pieces differently, and the names change at branch boundaries; a name one
branch off installs nothing (`source: cuda` + 580 + Fabric Manager looked for `nvidia-fabricmanager-580`,
which NVIDIA's repository no longer has). So every name the agent installs, holds or looks for comes from
here, decided by source, install method and branch.

Public sources of the table (checked 2026-12):
- NVIDIA's gpu-driver-container, commit 78fa4ac "add driver 580.65.06" (ubuntu22.04/install.sh,
  rhel9/install.sh) and ubuntu24.04/precompiled/nvidia-driver: from branch 580 NVIDIA's CUDA repositories
  drop the branch from Fabric Manager (`nvidia-fabricmanager`), NSCQ (`libnvidia-nscq`), NVSDM (`libnvsdm`)
  and IMEX (`nvidia-imex`); below 580 they are `nvidia-fabricmanager-<b>`, `libnvidia-nscq-<b>`,
  `libnvsdm-<b>` (570 and later), `nvidia-imex-<b>` (550 and later). The RPMs below 580 call Fabric Manager
  `nvidia-fabric-manager`; from 580 `nvidia-fabricmanager`. NVLink5 boxes also take `nvlsm` and
  `infiniband-diags` from 570 (`nvlink5_pkgs_install` in ubuntu24.04/precompiled/nvidia-driver, `dnf install
  -y infiniband-diags nvlsm` in rhel9/install.sh): both without a version, as they have version schemes of
  their own (`nvlsm 2025.06.5-1`, `infiniband-diags 50.0-…`) and are never pinned at the driver's. The Ubuntu
  prebuilt path installs
  `nvidia-headless-no-dkms-<b>-server`, `nvidia-utils-<b>-server` and
  `linux-modules-nvidia-<b>-server[-open]-<kernel>`.
- NVIDIA's driver installation guide ("Ubuntu 590 and later packages"): the CUDA repository's driver set
  loses the branch at 590 (`cuda-drivers`, `nvidia-open`), locked by `nvidia-driver-pinning-<b>`.
- canonical/ubuntu-drivers-common, UbuntuDrivers/detect.py (the linux-modules metapackage lookup): the
  prebuilt signed modules are `linux-modules-nvidia-<b>-server[-open]-<flavour>` (e.g. `-generic`), chosen
  when the archive has them for the running kernel, else `nvidia-dkms-<b>-server[-open]`.

Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

from ..typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import List, Optional, Tuple

SOURCES = ("ubuntu", "cuda", "debian", "rhel")
COMPONENTS = ("fabricmanager", "nscq", "nvsdm", "imex")
UNVERSIONED_EXTRAS_FROM = 580  # FM, NSCQ, NVSDM and IMEX in NVIDIA's repositories (debs and RPMs)
UNVERSIONED_DRIVER_FROM = 590  # the driver set itself in NVIDIA's CUDA repository
# The first branch NVIDIA's repositories carry each piece for (gpu-driver-container's install scripts).
FIRST_BRANCH = {"fabricmanager": 0, "nscq": 0, "nvsdm": 570, "imex": 550}
# NVLink Subnet Manager and its tools: versions of their own, installed by name, never pinned nor held.
NVLINK5_PACKAGES = ("nvlsm", "infiniband-diags")
OWN_VERSIONS = NVLINK5_PACKAGES
NVLINK5_FROM = 570
# Kernel-specific packages of Ubuntu's prebuilt modules: held, the next kernel could not get its module.
# Debian's non-free compute set (no branch in the names; the kernel module package is added by flavor).
DEBIAN_COMPUTE = ("nvidia-smi", "libnvidia-ml1", "libcuda1", "firmware-nvidia-gsp")
NEVER_HOLD = ("linux-modules-nvidia-*", "linux-objects-nvidia-*", "linux-signatures-nvidia-*")


def component(source: str, method: str, branch: int, what: str) -> Optional[str]:
    """The package of one driver component (`COMPONENTS`), None where the source has none for the branch."""
    if what not in COMPONENTS:
        raise ValueError("unknown component {!r} ({})".format(what, ", ".join(COMPONENTS)))
    if source == "debian" or branch < FIRST_BRANCH[what]:
        return None
    if source == "ubuntu":
        # Canonical's archive builds Fabric Manager and NSCQ per branch and nothing of NVLink5's set.
        per_branch = {"fabricmanager": "nvidia-fabricmanager-{}", "nscq": "libnvidia-nscq-{}"}
        return per_branch[what].format(branch) if what in per_branch else None
    unversioned = branch >= UNVERSIONED_EXTRAS_FROM
    rpm = method != "apt" or source == "rhel"  # dnf, yum and zypper install the RPMs
    if what == "fabricmanager":
        if unversioned:
            return "nvidia-fabricmanager"
        return "nvidia-fabric-manager" if rpm else "nvidia-fabricmanager-{}".format(branch)
    base = {"nscq": "libnvidia-nscq", "nvsdm": "libnvsdm", "imex": "nvidia-imex"}[what]
    return base if unversioned else "{}-{}".format(base, branch)


def fabric_set(source: str, method: str, branch: int, nvlink5: bool = False) -> List[str]:
    """Fabric Manager with what it loads (NSCQ; NVSDM where there is one) and, on NVLink5 boxes (HGX B200,
    B300), the subnet manager it starts."""
    names = [component(source, method, branch, what) for what in ("fabricmanager", "nscq")]
    if nvlink5:
        names.append(component(source, method, branch, "nvsdm"))
    found = [name for name in names if name]
    if nvlink5 and branch >= NVLINK5_FROM and source != "ubuntu":
        found += list(NVLINK5_PACKAGES)
    return found


def own_version(name: str) -> bool:
    """Whether a package of a driver set has a version scheme of its own (installed by name, at what the
    repository offers), rather than the driver's version."""
    return name in OWN_VERSIONS


def driver_set(source: str, branch: int, flavor: str) -> Tuple[List[str], List[str]]:
    """(pinning, install): the driver's metapackages of an apt source, the pinning package first."""
    if source == "ubuntu":
        suffix = {"default": "", "server": "-server", "open": "-open", "server-open": "-server-open"}[flavor]
        return [], ["nvidia-driver-{}{}".format(branch, suffix)]
    if source == "cuda":
        name = "nvidia-open" if flavor == "open" else "cuda-drivers"
        if branch >= UNVERSIONED_DRIVER_FROM:
            return ["nvidia-driver-pinning-{}".format(branch)], [name]
        return [], ["{}-{}".format(name, branch)]
    if source == "debian":
        module = "nvidia-open-kernel-dkms" if flavor == "open" else "nvidia-kernel-dkms"
        return [], [*DEBIAN_COMPUTE, module]
    raise ValueError("source {!r} is not installed with apt".format(source))


def ubuntu_prebuilt(branch: int, flavor: str, kernel_flavour: str) -> List[str]:
    """Ubuntu's signed prebuilt set for one kernel flavour (`generic`, `nvidia`, `aws`, ...): the userspace
    without DKMS and the modules metapackage that follows the kernel flavour."""
    server = "server-open" if flavor.endswith("open") else "server"
    return [
        "nvidia-headless-no-dkms-{}-{}".format(branch, server),
        "nvidia-utils-{}-server".format(branch),
        "linux-modules-nvidia-{}-{}-{}".format(branch, server, kernel_flavour),
    ]


def ubuntu_dkms(branch: int, flavor: str) -> str:
    """The DKMS package ubuntu-drivers falls back to when the archive has no prebuilt modules."""
    return "nvidia-dkms-{}-{}".format(branch, "server-open" if flavor.endswith("open") else "server")


def kernel_flavour(release: str) -> Optional[str]:
    """`generic` of `6.8.0-47-generic`: Ubuntu kernels end in their flavour; None for other kernels."""
    parts = release.split("-")
    if len(parts) < 3 or not parts[1].isdigit():
        return None
    return "-".join(parts[2:])
