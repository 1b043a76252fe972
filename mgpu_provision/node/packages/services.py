"""The two NVIDIA services apply manages on a real node, Fabric Manager and the persistence daemon, and the
state and switch of any unit (also the boot unit apply writes for compute mode and power limit).

NVIDIA's packages install their systemd units but do not enable Fabric Manager's; persistence mode set
through NVML is lost at every boot, while nvidia-persistenced (enabled) sets it at every boot. A service
is only started when the driver it talks to is loaded: before the reboot that loads a new driver it would
fail, so it is enabled and left to start at boot.
"""

from __future__ import annotations

from ...protocol import FABRICMANAGER_UNIT
from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.atomic import atomic_write
from ..core.errors import AgentFailure
from . import apt, dnf, driver, persistenced, zypper
from .common import (
    Command,
    at_driver_version,
    installed_debs,
    installed_rpms,
    rpm_provider,
    run_all,
    upstream,
)

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple


def state(unit: str) -> Dict[str, Any]:
    """`{"service": active|inactive|failed|absent|unknown, "enabled": bool|None}` from systemd."""
    result = system.run(["systemctl", "is-active", unit], timeout=20)
    if result.returncode == 127:
        return {"service": "unknown", "enabled": None}
    service = result.stdout.strip()
    if service not in ("active", "failed"):
        # A unit that does not exist reads "inactive" on some systemd versions: ask whether it is installed.
        named = unit if unit.endswith((".service", ".timer")) else unit + ".service"
        listed = system.run(["systemctl", "list-unit-files", named, "--no-legend"], timeout=20)
        service = "inactive" if listed.stdout.strip() else "absent"
    enabled = system.run(["systemctl", "is-enabled", unit], timeout=20).stdout.strip()
    return {"service": service, "enabled": enabled in ("enabled", "enabled-runtime", "static")}


def switch(unit: str, enable: bool, start: bool, restart: bool = False) -> Tuple[bool, str]:
    """Enable (and start, when the driver is loaded) or disable and stop a unit; say what changed. `restart`
    starts a running unit again (a daemon that reads a changed file only when it starts)."""
    before = state(unit)
    commands: List[Command] = []
    if enable and not before["enabled"]:
        commands.append(Command(["systemctl", "enable", unit]))
    if enable and start and (restart or before["service"] != "active"):
        commands.append(Command(["systemctl", "restart", unit]))
    if not enable and before["enabled"]:
        commands.append(Command(["systemctl", "disable", unit]))
    if not enable and before["service"] == "active":
        commands.append(Command(["systemctl", "stop", unit]))
    if not commands:
        return False, f"{unit} already {'enabled' if enable else 'disabled'}"
    # A unit file apply has just written or changed is read again first: without it a changed timer would
    # keep its old interval until the next boot. Where no systemd runs yet (an image being built, a box
    # between install and boot) there is nothing to reload, and enabling works on the unit files alone.
    run_all([Command(["systemctl", "daemon-reload"], check=False), *commands], "service")
    done = {"enable": "enabled", "restart": "started", "disable": "disabled", "stop": "stopped"}
    verbs = " and ".join(done[c.argv[1]] for c in commands)
    return True, f"{unit} {verbs}"


def install_driver(step: Dict[str, Any], current: Optional[str]) -> Tuple[bool, str]:
    """A driver step; one that brings Fabric Manager with it (`fabricmanager`) also enables its unit, which
    NVIDIA's packages leave disabled, to start at the boot that loads the new driver (and the module NVLink
    Subnet Manager needs), so the apply that installs it leaves nothing for the next one."""
    changed, message = driver.install(step, current)
    if not step["fabricmanager"] or step["method"] == "runfile" or not changed:
        return changed, message
    if "nvlsm" in step["packages"]:
        _load_at_boot("ib_umad", False)
    return changed, f"{message}; {switch(FABRICMANAGER_UNIT, True, False)[1]}"


def install_fabric_manager(step: Dict[str, Any]) -> Tuple[bool, str]:
    """Fabric Manager and NSCQ (the step's packages) at exactly the driver's version, held, the service
    enabled (and started); the same for nvidia-imex (the step's unit), which also lives at the driver's
    version. NVLink Subnet Manager (in Fabric Manager's set on NVLink5 boards) needs the ib_umad module."""
    version, unit, names, tool = step["version"], step["unit"], step["packages"], step["method"]
    what = "Fabric Manager" if unit == FABRICMANAGER_UNIT else unit
    if "nvlsm" in names:
        _load_at_boot("ib_umad", bool(step["start"]))
    if tool in ("dnf", "yum"):
        installed = rpm_provider(unit)  # nvidia-fabric-manager Provides nvidia-fabricmanager
        own = at_driver_version(names)[1]
        changed = installed is None or installed[1] != version or len(installed_rpms(own)) < len(own)
        if changed:
            dnf.check_available(dict(step, version=version))
            run_all(
                [
                    Command([*dnf.install_argv(tool), *dnf.at_version(names, version)]),
                    Command([tool, "-y", "versionlock", "add", f"*nvidia*{version}*"]),
                ],
                "fabricmanager",
            )
        message = f"installed {what} {version}" if changed else f"{what} {version} installed"
    elif tool == "zypper":
        changed, message = zypper.install(step, what)
    else:
        changed, message = apt.install(step, what)
    started, service = switch(unit, True, step["start"])
    return changed or started, f"{message}; {service}"


MODULES_LOAD = "/etc/modules-load.d/mgpu-provision-{}.conf"


def _load_at_boot(module: str, now: bool) -> None:
    """A kernel module loaded at every boot (modules-load.d) and, when `now`, at once."""
    path = MODULES_LOAD.format(module)
    text = f"# Written by mgpu-provision: NVLink Subnet Manager needs it.\n{module}\n"
    if system.read_text(path) != text:
        atomic_write(path, text.encode("utf-8"), 0o644)
    if now:
        run_all([Command(["modprobe", module])], "fabricmanager")


def persistence_daemon(step: Dict[str, Any]) -> Tuple[bool, str]:
    """Install (where it is a package of its own), enable and start nvidia-persistenced, or turn it off."""
    enable, unit, package = step["enabled"], step["unit"], step["package"]
    installed = False
    if enable and state(unit)["service"] == "absent":
        if not package:
            raise AgentFailure("persistence", f"{unit} is not installed; it comes with the driver's packages")
        manager = {"zypper": [*zypper.ZYPPER, "install"], "apt": apt.INSTALL}.get(step["method"])
        manager = manager or [step["method"], "-y", "install"]  # dnf, yum
        run_all([Command([*manager, package])], "persistence")
        installed = True
        _hold_what_it_pulled_in()
    dropped, why = persistenced.ensure_persistence_mode() if enable else (False, "")
    if dropped and step["start"] and state(unit)["service"] == "active":
        run_all([Command(["systemctl", "restart", unit])], "persistence")  # the new command line
    changed, message = switch(unit, enable, step["start"])
    message = f"{why}; {message}" if dropped else message
    return changed or installed or dropped, (f"installed {package}; " if installed else "") + message


def _hold_what_it_pulled_in() -> None:
    """Libraries the daemon brought at the driver's version (libnvidia-cfg1) join the held set, where the
    driver is held (the apt pin is there): else the next plan would find them loose."""
    version = driver.installed_version()
    if version and system.read_text(apt.PREFERENCES) is not None:
        loose = driver.unheld_packages(version)
        if loose:
            run_all([Command(["apt-mark", "hold", *loose])], "persistence")


def fabric_manager_version() -> Optional[str]:
    """Upstream version of the installed Fabric Manager (dpkg or rpm), None when absent.

    RPMs name it `nvidia-fabric-manager` and Provide `nvidia-fabricmanager`: asked by what it provides.
    """
    debs = installed_debs(("nvidia-fabricmanager*",))
    for name in sorted(debs):
        if not name.startswith("nvidia-fabricmanager-dev"):
            return upstream(debs[name][0])
    found = rpm_provider("nvidia-fabricmanager")
    return found[1] if found else None
