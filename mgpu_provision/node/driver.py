"""Installing an exact NVIDIA driver (and Fabric Manager at the same version) on a real node.

apt installs the branch package at the exact Debian version
and holds every versioned piece (or unattended-upgrades moves the libraries and NVML reports a mismatch);
dnf uses the module stream of the branch (`/fm` profile for Fabric Manager) and versionlock; the runfile is
checked against its sha256 before it runs silently. Deciding the commands is pure; running them is not.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import system
from .errors import AgentFailure

APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
RUNFILE_CACHE = "/var/cache/mgpu-provision"


class Command(NamedTuple):
    argv: List[str]
    check: bool = True  # False: clearing a hold or lock that may not exist yet must not stop the install


def version_key(version: str) -> List[int]:
    """Order driver versions numerically (550.127.05 is newer than 550.90.07)."""
    return [int(part) if part.isdigit() else 0 for part in version.split(".")]


def branch_of(step: Dict[str, Any]) -> str:
    branch = str(step.get("branch") or str(step.get("version") or "").split(".")[0])
    if not branch.isdigit():
        raise AgentFailure("driver", "a driver step needs `version` (e.g. 550.54.15) or `branch` (e.g. 550)")
    return branch


# The rig's `flavor` as Ubuntu names its packages: the -server builds carry the suffix on every versioned
# piece; -open changes only the kernel module. dnf has no server streams, only proprietary or open modules.
APT_SUFFIX = {"default": "", "server": "-server", "open": "-open", "server-open": "-server-open"}
DNF_STREAM = {"default": "dkms", "server": "dkms", "open": "open", "server-open": "open"}


def _flavor(step: Dict[str, Any]) -> str:
    flavor = str(step.get("flavor") or "default")
    if flavor not in APT_SUFFIX:
        raise AgentFailure("driver", f"unknown driver flavor {flavor!r} (default, server, open, server-open)")
    return flavor


def apt_packages(step: Dict[str, Any]) -> Tuple[str, List[str]]:
    """The metapackage to install and every versioned package to hold with it."""
    branch = branch_of(step)
    flavor = _flavor(step)
    suffix = APT_SUFFIX[flavor]
    libs = "-server" if flavor.startswith("server") else ""
    main = f"nvidia-driver-{branch}{suffix}"
    held = [main, f"libnvidia-compute-{branch}{libs}", f"nvidia-dkms-{branch}{suffix}"]
    held.append(f"nvidia-kernel-common-{branch}{libs}")
    if step.get("fabricmanager"):
        held.append(f"nvidia-fabricmanager-{branch}")
    return main, held


def pick_deb_version(madison: str, version: str) -> Optional[str]:
    """The full Debian version of `version` in `apt-cache madison` output (`pkg | 550.54.15-1 | src`)."""
    for line in madison.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 2 and (parts[1] == version or parts[1].startswith(version + "-")):
            return parts[1]
    return None


def apt_commands(step: Dict[str, Any], deb_versions: Dict[str, str]) -> List[Command]:
    """apt command lines; `deb_versions` maps package -> full Debian version for an exact install."""
    main, held = apt_packages(step)
    installs = [main] + [p for p in held if p.startswith("nvidia-fabricmanager-")]
    targets = [f"{p}={deb_versions[p]}" if p in deb_versions else p for p in installs]
    commands = [
        Command(["apt-mark", "unhold", *held], check=False),
        Command(["apt-get", "install", "-y", "--allow-downgrades", "--allow-change-held-packages", *targets]),
    ]
    if step.get("hold"):
        commands.append(Command(["apt-mark", "hold", *held]))
    return commands


def dnf_commands(step: Dict[str, Any]) -> List[Command]:
    branch = branch_of(step)
    stream = DNF_STREAM[_flavor(step)]
    profile = "/fm" if step.get("fabricmanager") else ""
    commands = [
        Command(["dnf", "-y", "versionlock", "delete", f"*nvidia*{branch}*"], check=False),
        Command(["dnf", "-y", "module", "reset", "nvidia-driver"]),
        Command(["dnf", "-y", "module", "install", f"nvidia-driver:{branch}-{stream}{profile}"]),
    ]
    if step.get("version"):
        commands.append(Command(["dnf", "-y", "install", f"nvidia-driver-{step['version']}"]))
    if step.get("hold"):
        pinned = step.get("version") or branch
        commands.append(Command(["dnf", "-y", "versionlock", "add", f"*nvidia*{pinned}*"]))
    return commands


def runfile_commands(step: Dict[str, Any]) -> List[Command]:
    runfile = step.get("runfile")
    if not runfile:
        raise AgentFailure("driver", "the runfile method needs `runfile`, the installer's path on the node")
    return [Command(["sh", str(runfile), "--silent", "--dkms"])]


def install(step: Dict[str, Any], current: Optional[str]) -> Tuple[bool, str]:
    """Install the step's driver unless the exact version is already there; return (changed, message)."""
    version = step.get("version")
    if version and current == version:
        return False, f"driver {version} already installed"
    method = step.get("method") or "apt"
    if method == "apt":
        commands = apt_commands(step, _resolve_deb_versions(step))
    elif method == "dnf":
        commands = dnf_commands(step)
    elif method == "runfile":
        step = dict(step, runfile=fetch_runfile(step))
        _check_runfile(step)
        commands = runfile_commands(step)
    else:
        raise AgentFailure("driver", f"unknown driver install method {method!r} (apt, dnf or runfile)")
    env = dict(os.environ, **APT_ENV)
    for command in commands:
        result = system.run(command.argv, timeout=1800, env=env)
        if result.returncode != 0 and command.check:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            argv = " ".join(command.argv)
            raise AgentFailure("driver", f"`{argv}` failed (exit {result.returncode}): {tail[0]}")
    return True, f"installed driver {version or 'branch ' + branch_of(step)} with {method}; reboot to load it"


def _resolve_deb_versions(step: Dict[str, Any]) -> Dict[str, str]:
    version = step.get("version")
    if not version:
        return {}
    main, held = apt_packages(step)
    resolved = {}
    for package in [main] + [p for p in held if p.startswith("nvidia-fabricmanager-")]:
        found = pick_deb_version(system.run(["apt-cache", "madison", package], timeout=120).stdout, version)
        if found is None:
            raise AgentFailure("driver", f"{package} {version} is not available from the apt sources")
        resolved[package] = found
    return resolved


def fetch_runfile(step: Dict[str, Any], cache_dir: str = RUNFILE_CACHE) -> str:
    """The installer's path on the node: a local path as given, an https URL downloaded once into a cache.

    The download lands under a temporary name and is renamed into place, so an interrupted fetch never
    leaves a half file that a later run would take for the installer; the checksum is checked after.
    """
    import shutil  # only a runfile install needs these: keep the agent's start-up lean
    import urllib.request

    source = str(step.get("runfile") or "")
    if not source.startswith("https://"):
        return source
    target = os.path.join(cache_dir, "NVIDIA-{}.run".format(str(step.get("sha256") or "unchecked")[:16]))
    if os.path.exists(target):
        return target
    os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    partial = target + ".partial"
    try:
        with urllib.request.urlopen(source, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except (OSError, ValueError) as exc:
        if os.path.exists(partial):
            os.remove(partial)
        raise AgentFailure("driver", "could not download {}: {}".format(source, exc)) from exc
    os.replace(partial, target)
    return target


def _check_runfile(step: Dict[str, Any]) -> None:
    expected = step.get("sha256")
    if not expected:
        raise AgentFailure("driver", "the runfile method needs `sha256` of the installer")
    digest = hashlib.sha256()
    with open(str(step.get("runfile")), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise AgentFailure("driver", f"checksum mismatch for {step.get('runfile')}: got {digest.hexdigest()}")


def installed_fabric_manager() -> Optional[str]:
    """Upstream version of the installed nvidia-fabricmanager package (dpkg or rpm), None when absent."""
    query = ["dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\n", "nvidia-fabricmanager*"]
    for line in system.run(query, 30).stdout.splitlines():
        parts = line.split()
        is_dev = parts[0].startswith("nvidia-fabricmanager-dev") if parts else True
        if len(parts) >= 2 and line.endswith(" installed") and not is_dev:
            return parts[1].split("-")[0]
    rpm = system.run(["rpm", "-q", "--qf", "%{NAME} %{VERSION}\n", "-a", "nvidia-fabricmanager*"], 30)
    for line in rpm.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and not parts[0].startswith("nvidia-fabricmanager-devel"):
            return parts[1]
    return None
