"""Running package-manager command lines on a node, and reading what dpkg or rpm says is installed.

Shared by the apt, dnf and runfile paths and by the facts that report installed drivers: one way to run a
command list (the first failure stops it, with the line that explains it) and one reader per database.
"""

from __future__ import annotations

import glob
import os

from ...catalog import families, names
from ...protocol import branch_of
from ...typing_lite import TYPE_CHECKING, NamedTuple
from ..core import system
from ..core.errors import AgentFailure

if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple

NONINTERACTIVE = {"DEBIAN_FRONTEND": "noninteractive"}
TIMEOUT_S = 1800  # one package-manager command; a driver's DKMS build takes minutes, never half an hour


class Command(NamedTuple):
    argv: List[str]
    check: bool = True  # False: clearing a lock that may not exist yet must not stop the install


def run_all(commands: List[Command], what: str = "driver") -> None:
    """Run the commands in order; the first failing checked one raises AgentFailure with apt's `E:` line."""
    env = dict(os.environ, **NONINTERACTIVE)
    for command in commands:
        result = system.run(command.argv, timeout=TIMEOUT_S, env=env)
        if result.returncode != 0 and command.check:
            text = result.stderr + "\n" + result.stdout
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            errors = [line for line in lines if line.startswith(("E:", "Error:"))] or lines[-1:]
            errors = errors or ["no output"]
            argv = " ".join(command.argv)
            if result.returncode == 124:  # system.run's answer for a command past its timeout
                raise AgentFailure(
                    what,
                    f"`{argv}` did not finish in {TIMEOUT_S // 60} minutes and was stopped: another apt, dnf "
                    "or zypper holding the package lock, or a repository that does not answer; nothing after "
                    "it was run, and the next apply starts this step again",
                )
            raise AgentFailure(what, f"`{argv}` failed (exit {result.returncode}): {errors[0]}")


def version_key(version: str) -> List[int]:
    """Order driver versions numerically (550.127.05 is newer than 550.90.07)."""
    return [int(part) if part.isdigit() else 0 for part in version.split(".")]


def upstream(version: str) -> str:
    """`535.216.03` of `535.216.03-2~bpo12+1`, of `3:575.51-1.el9` or of a SUSE kernel module package's
    `580.95.05_k6.4.0_150600.23.73-1.1` (SUSE's KMPs carry the kernel they were built for after `_k`): the
    version NVIDIA gave it."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0].split("_k", 1)[0]


def at_driver_version(packages: List[str]) -> Tuple[List[str], List[str]]:
    """(the packages installed at the driver's version, those installed by name at their own: NVLink Subnet
    Manager and its tools)."""
    own = [name for name in packages if names.own_version(name)]
    return [name for name in packages if name not in own], own


def pick_version(available: List[str], version: Optional[str], branch: str) -> Optional[str]:
    """The full version to install: the exact upstream version asked for, else the newest of the branch."""
    if version:
        return next((v for v in available if upstream(v) == version), None)
    of_branch = [v for v in available if branch_of(upstream(v)) == branch]
    return max(of_branch, key=lambda v: version_key(upstream(v))) if of_branch else None


def resolve_version(
    names: List[str],
    offered: Callable[[str], List[str]],
    version: Optional[str],
    branch: str,
    where: str,
    nvidia: Optional[str] = None,
) -> str:
    """The full version (as the sources write the first package's) at which every package of the set is
    offered: exactly `version`, else the newest of `branch`. One the sources lack fails here, naming the
    versions they have, before anything changes; where none is offered at all and the packages are NVIDIA's
    (`nvidia`: the method), the message names the repository step of NVIDIA's installation guide."""
    target: Optional[str] = None
    for name in names:
        available = offered(name)
        found = pick_version(available, upstream(target) if target else version, branch)
        if found is None:
            have = ", ".join(sorted({upstream(v) for v in available}, key=version_key)) or "none"
            step = "; " + repository_step(nvidia) if nvidia and not available and target is None else ""
            raise AgentFailure(
                "driver",
                f"{name} {version or 'of branch ' + branch} is not available from {where} "
                f"(they offer: {have}){step}; nothing was changed",
            )
        target = target or found
    if target is None:
        raise AgentFailure("driver", "the driver step names no package to install")
    return target


def listed_versions(output: str, name: str) -> List[str]:
    """Versions of `name` in `dnf list --showduplicates` / `yum list --showduplicates` output, installed and
    available (`nvidia-driver.x86_64   3:550.54.15-1.el9   cuda-rhel9-x86_64`), in the listed order."""
    found: List[str] = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].rsplit(".", 1)[0] == name and parts[1] not in found:
            found.append(parts[1])
    return found


def installed_debs(patterns: Tuple[str, ...]) -> Dict[str, Tuple[str, bool]]:
    """Installed packages whose names match the dpkg patterns: name -> (version, held)."""
    query = ["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n", *patterns]
    found = {}
    for line in system.run(query, timeout=60).stdout.splitlines():
        parts = line.split()
        # dpkg also lists names it merely knows of (no version); ii is installed, hi installed and held.
        if len(parts) == 3 and parts[2][1:2] == "i":
            found[parts[0].split(":")[0]] = (parts[1], parts[2][0] == "h")
    return found


def installed_rpms(names: List[str]) -> Dict[str, str]:
    """The installed version of each of `names` that rpm knows; the others are left out."""
    result = system.run(["rpm", "-q", "--qf", "%{NAME} %{VERSION}\n", *names], 60)
    found = {}
    for line in result.stdout.splitlines():
        parts = line.split()  # "package X is not installed" has more words
        if len(parts) == 2 and parts[0] in names:
            found[parts[0]] = parts[1]
    return found


def rpm_provider(capability: str) -> Optional[Tuple[str, str]]:
    """(name, version) of the installed RPM providing a capability, None when none does or rpm is absent."""
    result = system.run(["rpm", "-q", "--whatprovides", capability, "--qf", "%{NAME} %{VERSION}\n"], 30)
    for line in result.stdout.splitlines() if result.returncode == 0 else []:
        parts = line.split()
        if len(parts) == 2:
            return parts[0], parts[1]
    return None


# The package holding libnvidia-ml.so.1: Debian's, Ubuntu's and the CUDA repository's (debs), any RPM's.
NVML_DEBS = ("libnvidia-ml1", "libnvidia-compute-*", "libnvidia-compute")
NVML_RPM_CAPABILITY = "libnvidia-ml.so.1()(64bit)"


def installed_version() -> Optional[str]:
    """Upstream version of the installed driver as dpkg or rpm knows it, None when neither does."""
    debs = installed_debs(NVML_DEBS)
    if debs:
        return max((upstream(version) for version, _ in debs.values()), key=version_key)
    found = rpm_provider(NVML_RPM_CAPABILITY)
    return found[1] if found else None


CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos/"


# Where each package manager reads its repositories. NVIDIA's CUDA repository is a file NVIDIA names
# `cuda-<distro>[-<arch>]` (cuda-rhel9.repo, cuda-sles15.repo, the keyring package's
# cuda-ubuntu2404-x86_64.list), or any file naming its path (a mirror that keeps NVIDIA's layout).
REPOSITORY_FILES = {
    "apt": ("/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"),
    "dnf": ("/etc/yum.repos.d/*.repo",),
    "yum": ("/etc/yum.repos.d/*.repo",),
    "zypper": ("/etc/zypp/repos.d/*.repo",),
}
CUDA_REPOS_PATH = "/compute/cuda/repos/"


def nvidia_repository_missing(release: Dict[str, object]) -> Optional[str]:
    """The repository step (`repository_step`) when the box's package manager has no repository of NVIDIA's
    configured (no source or .repo file naming its CUDA repository), None when one is, or when the family
    installs with no package manager this knows."""
    family = release_family(release)
    if family.method is None:
        return None
    for pattern in REPOSITORY_FILES[family.method]:
        for path in sorted(glob.glob(pattern)):
            named = os.path.basename(path).startswith("cuda-")
            if named or CUDA_REPOS_PATH in (system.read_text(path) or ""):
                return None
    return repository_step(family.method, release)


def release_family(release: Dict[str, object]) -> families.Family:
    """The family of an os-release as `system.os_release` reads it."""
    os_like = release["os_like"] if isinstance(release["os_like"], list) else []
    text = {key: None if release.get(key) is None else str(release[key]) for key in release}
    return families.family_of(
        text["os_id"], text["os_version_id"], [str(x) for x in os_like], text.get("os_platform_id")
    )


def repository_step(method: str, release: Optional[Dict[str, object]] = None) -> str:
    """What NVIDIA's driver installation guide does first on this box, before any install command: the
    keyring package (apt), the `.repo` file (dnf, yum), `zypper addrepo` with its key (zypper), with the
    repository's name for this distribution and architecture (`ubuntu2404/x86_64`, `rhel9/sbsa`);
    `release` is the box's os-release (read here when not given)."""
    release = release or system.os_release(system.os_release_text())
    os_id = str(release["os_id"] or "")
    version = str(release["os_version_id"] or "")
    platform = str(release["os_platform_id"] or "")
    if method == "apt":
        distro = os_id + version.replace(".", "") if os_id == "ubuntu" else os_id + branch_of(version)
    elif method == "zypper":
        distro = "opensuse15" if os_id.startswith("opensuse") else "sles15"
    else:
        el = platform[len("platform:el") :] if platform.startswith("platform:el") else branch_of(version)
        distro = ("amzn" if os_id == "amzn" else "rhel") + el
    arch = {"x86_64": "x86_64", "aarch64": "sbsa"}.get(os.uname().machine, os.uname().machine)
    base = f"{CUDA_REPOS}{distro}/{arch}/"
    commands = {
        "apt": f"download and dpkg -i {base}cuda-keyring_1.1-1_all.deb, then apt-get update",
        "zypper": f"zypper addrepo {base}cuda-{distro}.repo, then zypper --gpg-auto-import-keys refresh",
    }
    add = commands.get(method, f"{method} config-manager --add-repo {base}cuda-{distro}.repo")
    return (
        f"NVIDIA's CUDA repository is not configured on this box: {add} (NVIDIA's driver installation "
        "guide), or set driver.repo to a mirror of it"
    )
