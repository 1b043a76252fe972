"""Driver command lines per source: apt pins and holds, dnf transactions and locks, runfile flags, FM queries.

The real apt path is proven end to end against Debian's packages (tests/e2e/test_driver_debian_e2e.py);
here every source's names and every command line are checked, with dpkg/apt/rpm answering from a script.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.catalog import names, sources
from mgpu_provision.node.core import system
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.packages import apt, dnf, driver, runfile, services
from mgpu_provision.node.packages.common import Command
from mgpu_provision.plan.resources.fabricmanager import package_set

MADISON = {
    "nvidia-smi": [
        " nvidia-smi | 535.261.03-1 | http://deb/debian bookworm/non-free amd64 Packages",
        " nvidia-smi | 535.216.03-2~bpo12+1 | http://deb/debian bookworm-backports/non-free amd64 Packages",
    ],
}
MADISON["libnvidia-ml1"] = [line.replace("nvidia-smi", "libnvidia-ml1") for line in MADISON["nvidia-smi"]]
# Steps are built as the plan builds them and pass the agent's door (defaults filled in) on their way here.
DEBIAN_STEP = protocol.check_step(
    0,
    protocol.driver_step(
        "apt", "debian", "default", "535", "535.216.03", hold=True, fabricmanager=False,
        packages=sources.apt_set("debian", "535", "default", False, ["nvidia-smi", "libnvidia-ml1"]),
    ),
)  # fmt: skip


class FakeApt:
    """Answers apt-get, apt-cache, apt-mark and dpkg-query like a Debian box with `installed` on it."""

    def __init__(self, installed: dict[str, tuple[str, bool]]) -> None:
        self.installed = installed
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: list[str], timeout: float = 0, env: object = None
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        out = ""
        if argv[:2] == ["apt-cache", "madison"]:
            out = "\n".join(MADISON.get(argv[2], [])) + "\n"
        elif argv[0] == "dpkg-query":
            out = "".join(f"{n} {v} {'h' if h else 'i'}i \n" for n, (v, h) in self.installed.items())
        elif argv[:2] == ["apt-get", "install"]:
            for name in ("nvidia-smi", "libnvidia-ml1", "nvidia-alternative", "nvidia-legacy-check"):
                self.installed[name] = ("535.216.03-2~bpo12+1", self.installed.get(name, ("", False))[1])
            self.installed["glx-alternative-nvidia"] = ("1.2.2", False)
        elif argv[:2] == ["apt-mark", "hold"]:
            for name in argv[2:]:
                self.installed[name] = (self.installed[name][0], True)
        return subprocess.CompletedProcess(argv, 0, out, "")


@pytest.fixture
def fake_apt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., FakeApt]:
    monkeypatch.setattr(apt, "PREFERENCES", str(tmp_path / "mgpu-provision-nvidia"))

    def make(installed: dict[str, tuple[str, bool]]) -> FakeApt:
        fake = FakeApt(installed)
        monkeypatch.setattr(system, "run", fake)
        return fake

    return make


def test_apt_refreshes_lists_pins_the_whole_set_and_lifts_every_hold_first(
    fake_apt: Callable[..., FakeApt], tmp_path: Path
) -> None:
    """Defects 1 and 2: `pkg=version` leaves the exact dependencies (nvidia-alternative) at the candidate,
    and a held dependency blocks the change: a 1001 pin on the set, holds lifted first, all held after."""
    fake = fake_apt({"nvidia-smi": ("535.261.03-1", True), "nvidia-alternative": ("535.261.03-1", True)})
    changed, message = driver.install(DEBIAN_STEP, "535.261.03")
    assert changed and message.startswith("installed driver 535.216.03 (535.216.03-2~bpo12+1) from debian")
    assert fake.calls[0] == ["apt-get", "update", "-q"]
    installs = [c for c in fake.calls if c[:2] in (["apt-mark", "unhold"], ["apt-get", "install"])]
    assert installs == [
        ["apt-mark", "unhold", "nvidia-alternative", "nvidia-smi"],
        [*apt.INSTALL, "nvidia-smi", "libnvidia-ml1"],
    ]
    assert fake.calls[-1] == [
        "apt-mark",
        "hold",
        "glx-alternative-nvidia",
        "libnvidia-ml1",
        "nvidia-alternative",
        "nvidia-legacy-check",
        "nvidia-smi",
    ]
    assert (tmp_path / "mgpu-provision-nvidia").read_text().splitlines()[1:] == [
        "Package: *nvidia* libcuda* cuda-drivers* libnvsdm*",
        "Pin: version 535.216.03-*",
        "Pin-Priority: 1001",
    ]
    again = len(fake.calls)
    assert driver.install(DEBIAN_STEP, "535.216.03") == (
        False,
        "driver 535.216.03 already installed (535.216.03-2~bpo12+1)",
    )
    assert not [c for c in fake.calls[again:] if c[0] in ("apt-mark",) or c[:2] == ["apt-get", "install"]]


def test_unheld_packages_are_those_of_the_driver_set_at_its_version(fake_apt: Callable[..., FakeApt]) -> None:
    fake_apt(
        {
            "nvidia-smi": ("535.216.03-2~bpo12+1", False),
            "libnvidia-ml1": ("535.216.03-2~bpo12+1", True),
            "glx-alternative-nvidia": ("1.2.2", False),  # not versioned with the driver
        }
    )
    assert driver.unheld_packages("535.216.03") == ["nvidia-smi"]


def test_a_version_the_sources_lack_fails_before_anything_changes(
    fake_apt: Callable[..., FakeApt], tmp_path: Path
) -> None:
    fake = fake_apt({})
    with pytest.raises(AgentFailure) as failure:
        driver.install({**DEBIAN_STEP, "version": "535.999.99"}, None)
    assert failure.value.message == (
        "nvidia-smi 535.999.99 is not available from the apt sources (they offer: 535.216.03, 535.261.03); "
        "nothing was changed"
    )
    assert [c[:2] for c in fake.calls] == [["apt-get", "update"], ["apt-cache", "madison"]]
    assert not (tmp_path / "mgpu-provision-nvidia").exists()


def test_a_branch_pins_its_newest_version_and_no_hold_leaves_no_pin(
    fake_apt: Callable[..., FakeApt], tmp_path: Path
) -> None:
    fake_apt({})
    step = {**DEBIAN_STEP, "version": None, "branch": "535", "hold": False}
    changed, message = driver.install(step, None)
    assert changed
    assert message.startswith("installed driver 535.261.03 (535.261.03-1) from debian, not held")
    assert not (tmp_path / "mgpu-provision-nvidia").exists()


@pytest.mark.parametrize(
    ("source", "branch", "flavor", "install", "held_example"),
    [
        (
            "ubuntu",
            "550",
            "server",
            ["nvidia-driver-550-server"],
            "linux-modules-nvidia-550-server-5.15.0-91-generic",
        ),
        ("ubuntu", "550", "default", ["nvidia-driver-550"], "libnvidia-common-550"),
        ("ubuntu", "550", "open", ["nvidia-driver-550-open"], "nvidia-utils-550"),
        ("ubuntu", "550", "server-open", ["nvidia-driver-550-server-open"], "libnvidia-nscq-550"),
        ("cuda", "550", "default", ["cuda-drivers-550"], "nvidia-kernel-source-550"),
        ("cuda", "575", "open", ["nvidia-open-575"], "libnvidia-extra-575"),
        ("cuda", "590", "default", ["cuda-drivers"], "libnvidia-compute"),
        ("debian", "535", "default", [*names.DEBIAN_COMPUTE, "nvidia-kernel-dkms"], "nvidia-alternative"),
        ("debian", "535", "open", [*names.DEBIAN_COMPUTE, "nvidia-open-kernel-dkms"], "libcuda1"),
    ],
)
def test_each_source_names_its_packages_and_holds_the_whole_set(
    source: str, branch: str, flavor: str, install: list[str], held_example: str
) -> None:
    """Defect 2 and 9: every versioned piece is held (utils, common/gl/extra libs, kernel source, NSCQ,
    prebuilt linux-modules-nvidia-*), with each source's own names."""
    pkgset = sources.apt_set(source, branch, flavor, fabricmanager=False)
    assert pkgset.install == install
    assert apt.matching([held_example, "openssh-server", "libc6"], pkgset.hold) == [held_example]


def test_fabric_manager_names_per_source_and_the_590_pinning_package() -> None:
    assert sources.apt_set("ubuntu", "550", "server", True).install[1:] == [
        "nvidia-fabricmanager-550",
        "libnvidia-nscq-550",
    ]
    assert sources.apt_set("cuda", "590", "open", True) == protocol.PackageSet(
        ["nvidia-driver-pinning-590"],
        ["nvidia-open", "nvidia-fabricmanager", "libnvidia-nscq"],
        ["*nvidia*", "libcuda*", "cuda-drivers*", "libnvsdm*"],
    )
    assert sources.fabricmanager_packages("rhel", "550", "dnf") == [
        "nvidia-fabric-manager",
        "libnvidia-nscq-550",
    ]


def test_unknown_sources_and_flavors_are_refused_naming_what_exists() -> None:
    with pytest.raises(
        AgentFailure, match=r"the debian source has no 'server' driver flavor \(default, open\)"
    ):
        driver.install({**DEBIAN_STEP, "flavor": "server"}, None)
    with pytest.raises(AgentFailure, match="unknown driver source 'gentoo'"):
        driver.install({**DEBIAN_STEP, "source": "gentoo"}, None)


def test_dnf_installs_driver_and_fabric_manager_at_the_version_in_one_transaction() -> None:
    """Defect 3: no newest-of-branch first; the versionlock plugin first; every NVIDIA lock cleared."""
    names = sources.dnf_packages("550", "default", exact=True, fabricmanager=True)
    packages = protocol.PackageSet([], names, [])
    step = protocol.driver_step("dnf", "rhel", "default", "550", "550.54.15", True, True, packages=packages)
    assert dnf.commands(step) == [
        Command(["dnf", "-y", "install", "python3-dnf-plugin-versionlock"]),
        Command(["dnf", "-y", "versionlock", "delete", "*nvidia*"], check=False),
        Command(["dnf", "-y", "module", "reset", "nvidia-driver"]),
        Command(["dnf", "-y", "module", "enable", "nvidia-driver:550-dkms"]),
        Command(
            [
                "dnf",
                "-y",
                "install",
                "--allowerasing",
                "nvidia-driver-550.54.15",
                "nvidia-driver-cuda-550.54.15",
                "kmod-nvidia-latest-dkms-550.54.15",
                "nvidia-fabric-manager-550.54.15",
                "libnvidia-nscq-550-550.54.15",
            ]
        ),
        Command(["dnf", "-y", "versionlock", "add", "*nvidia*550.54.15*"]),
    ]


def test_dnf_without_module_streams_locks_the_branch_before_installing() -> None:
    names = sources.dnf_packages("580", "open", exact=False, fabricmanager=False)
    packages = protocol.PackageSet([], names, [])
    step = protocol.driver_step(
        "dnf", "rhel", "open", "580", None, True, False, packages=packages, modules=False
    )
    assert [c.argv for c in dnf.commands(step)][2:] == [
        ["dnf", "-y", "versionlock", "add", "*nvidia*580*"],
        ["dnf", "-y", "install", "--allowerasing", "nvidia-open"],
    ]


def test_fabric_manager_on_rpm_systems_is_found_by_what_it_provides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 4: the RPM is nvidia-fabric-manager (it Provides nvidia-fabricmanager); a glob never saw it."""

    def rpm_box(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        if argv[0] == "dpkg-query":
            return subprocess.CompletedProcess(argv, 127, "", "dpkg-query: command not found")
        if argv[:4] == ["rpm", "-q", "--whatprovides", "nvidia-fabricmanager"]:
            return subprocess.CompletedProcess(argv, 0, "nvidia-fabric-manager 550.54.15\n", "")
        return subprocess.CompletedProcess(argv, 1, "", "")

    monkeypatch.setattr(system, "run", rpm_box)
    assert services.fabric_manager_version() == "550.54.15"


@pytest.mark.parametrize(
    ("version", "module", "flag"),
    [
        ("570.86.16", "open", ["--kernel-module-type=open"]),
        ("580.65.06", "proprietary", ["--kernel-module-type=proprietary"]),
        ("550.54.15", "open", ["-m=kernel-open"]),
        ("550.54.15", "proprietary", []),
    ],
)
def test_runfile_passes_the_kernel_module_type(version: str, module: str, flag: list[str]) -> None:
    """Defect 8: the module type chosen on the control side reaches the installer in its own spelling."""
    step = protocol.driver_step(
        "runfile", None, None, protocol.branch_of(version), version, False, False,
        runfile="/root/NVIDIA.run", kernel_module_type=module,
    )  # fmt: skip
    assert runfile.commands(step)[0].argv == [
        "sh",
        "/root/NVIDIA.run",
        "--silent",
        "--dkms",
        *flag,
    ]


def test_runfile_refuses_while_nouveau_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runfile, "nouveau_loaded", lambda: True)
    step = protocol.driver_step("runfile", None, None, "550", "550.54.15", False, False, runfile="/x")
    with pytest.raises(AgentFailure, match="nouveau is bound to the GPU"):
        step = protocol.driver_step(
            "runfile", None, None, "550", "550.54.15", False, False, runfile="/x", sha256="0" * 64
        )
        driver.install(step, None)


def test_blacklisting_nouveau_writes_modprobe_d_and_rebuilds_the_initramfs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(runfile, "NOUVEAU_BLACKLIST", str(tmp_path / "blacklist-nouveau.conf"))
    ran: list[list[str]] = []
    monkeypatch.setattr(
        runfile.shutil, "which", lambda name: f"/usr/sbin/{name}" if name == "update-initramfs" else None
    )
    monkeypatch.setattr(
        system,
        "run",
        lambda argv, timeout=0, env=None: ran.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""),
    )
    assert runfile.blacklist_nouveau()[0] is True
    assert (
        "blacklist nouveau\noptions nouveau modeset=0\n" in (tmp_path / "blacklist-nouveau.conf").read_text()
    )
    assert ran == [["update-initramfs", "-u"]]
    assert runfile.blacklist_nouveau()[0] is False


class FakeSystemd:
    """Answers systemctl for units in `units` (name -> (active, enabled)), and records every call."""

    def __init__(self, units: dict[str, tuple[str, bool]]) -> None:
        self.units = units
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: list[str], timeout: float = 0, env: object = None
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if argv[0] != "systemctl" or argv[1:] == ["daemon-reload"]:
            return subprocess.CompletedProcess(argv, 0, "", "")
        verb, unit = argv[1], argv[2].removesuffix(".service")
        active, enabled = self.units.get(unit, ("inactive", False))
        out = {
            "is-active": active + "\n",
            "is-enabled": ("enabled" if enabled else "disabled") + "\n",
            "list-unit-files": f"{unit}.service enabled enabled\n" if unit in self.units else "",
        }.get(verb, "")
        if verb in ("enable", "disable"):
            self.units[unit] = (active, verb == "enable")
        if verb in ("restart", "stop"):
            self.units[unit] = ("active" if verb == "restart" else "inactive", enabled)
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_fabric_manager_is_installed_at_the_driver_version_held_and_enabled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Defect 5 on a real Ubuntu node: FM and NSCQ pinned at the driver's version, held, the unit enabled."""
    monkeypatch.setattr(apt, "PREFERENCES", str(tmp_path / "mgpu-provision-nvidia"))
    offered = {"nvidia-fabricmanager-550": "550.54.15-1", "libnvidia-nscq-550": "550.54.15-1"}
    debs: dict[str, str] = {"nvidia-driver-550-server": "550.54.15-0ubuntu1"}
    held: list[str] = []
    systemd = FakeSystemd({})

    def box(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        out = ""
        if argv[:2] == ["apt-cache", "madison"] and argv[2] in offered:
            out = f" {argv[2]} | {offered[argv[2]]} | http://repo/ubuntu jammy/multiverse amd64 Packages\n"
        elif argv[0] == "dpkg-query":
            out = "".join(f"{n} {v} {'h' if n in held else 'i'}i \n" for n, v in debs.items())
        elif argv[:2] == ["apt-get", "install"]:
            debs.update({name: offered[name] for name in argv if name in offered})
            systemd.units["nvidia-fabricmanager"] = ("inactive", False)
        elif argv[:2] == ["apt-mark", "hold"]:
            held.extend(argv[2:])
        elif argv[0] == "systemctl":
            return systemd(argv)
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(system, "run", box)
    fm = package_set("ubuntu", "apt", "550.54.15")
    step = protocol.fabricmanager_step("550.54.15", "ubuntu", "apt", fm, hold=True, start=False)
    changed, message = services.install_fabric_manager(step)
    assert changed and message == (
        "installed Fabric Manager 550.54.15 (550.54.15-1) from ubuntu, 3 packages held; "
        "nvidia-fabricmanager enabled"
    )
    assert sorted(held) == ["libnvidia-nscq-550", "nvidia-driver-550-server", "nvidia-fabricmanager-550"]


def test_services_are_enabled_and_started_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defects 5, 6 on a real node: enable (NVIDIA's packages do not); start only with the module loaded."""
    fake = FakeSystemd({"nvidia-fabricmanager": ("inactive", False)})
    monkeypatch.setattr(system, "run", fake)
    assert services.switch("nvidia-fabricmanager", True, False) == (True, "nvidia-fabricmanager enabled")
    # Unit files apply has just written are read again before the unit is switched.
    enable = ["systemctl", "enable", "nvidia-fabricmanager"]
    assert fake.calls[-2:] == [["systemctl", "daemon-reload"], enable]
    assert services.switch("nvidia-fabricmanager", True, True) == (True, "nvidia-fabricmanager started")
    assert services.switch("nvidia-fabricmanager", True, True) == (
        False,
        "nvidia-fabricmanager already enabled",
    )
    assert services.switch("nvidia-fabricmanager", False, False) == (
        True,
        "nvidia-fabricmanager disabled and stopped",
    )
    assert services.state("nvidia-persistenced") == {"service": "absent", "enabled": False}


def test_the_persistence_daemon_is_installed_where_it_is_a_package_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeSystemd({})
    monkeypatch.setattr(system, "run", fake)
    monkeypatch.setattr(services, "_hold_what_it_pulled_in", lambda: None)
    with pytest.raises(AgentFailure, match="nvidia-persistenced is not installed; it comes with the driver"):
        services.persistence_daemon(protocol.persistenced_step(enabled=True, start=False))
    step = protocol.persistenced_step(True, False, package="nvidia-persistenced", method="apt")
    original = fake.__call__

    def installs(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        if argv[:2] == ["apt-get", "install"]:
            fake.units["nvidia-persistenced"] = ("inactive", False)
        return original(argv, timeout, env)

    monkeypatch.setattr(system, "run", installs)
    changed, message = services.persistence_daemon(step)
    assert changed and message == "installed nvidia-persistenced; nvidia-persistenced enabled"
    assert [*apt.INSTALL, "nvidia-persistenced"] in fake.calls


def test_nvlink5_fabric_manager_brings_the_subnet_manager_and_loads_ib_umad(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 26 defect 2: on HGX B200 Fabric Manager's start wrapper runs NVLSM, which needs ib_umad."""
    monkeypatch.setattr(apt, "PREFERENCES", str(tmp_path / "mgpu-provision-nvidia"))
    monkeypatch.setattr(services, "MODULES_LOAD", str(tmp_path / "modules-load-{}.conf"))
    ran: list[list[str]] = []
    systemd = FakeSystemd({"nvidia-fabricmanager": ("inactive", True)})

    def box(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        if argv[0] == "systemctl":
            return systemd(argv)
        out = ""
        if argv[:2] == ["apt-cache", "madison"]:
            out = f" {argv[2]} | 580.95.05-1 | https://developer.download.nvidia.com/compute/cuda/repos x\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(system, "run", box)
    fm = package_set("cuda", "apt", "580.95.05", nvlink5=True)
    assert fm.install == ["nvidia-fabricmanager", "libnvidia-nscq", "libnvsdm", "nvlsm", "infiniband-diags"]
    step = protocol.fabricmanager_step("580.95.05", "cuda", "apt", fm, hold=False, start=True)
    services.install_fabric_manager(step)
    assert (tmp_path / "modules-load-ib_umad.conf").read_text().endswith("ib_umad\n")
    assert ["modprobe", "ib_umad"] in ran
    (install,) = [argv for argv in ran if argv[:2] == ["apt-get", "install"]]
    assert {"nvlsm", "infiniband-diags", "libnvsdm"} <= set(install)


@pytest.mark.parametrize(
    ("answer", "module"),
    [((0, "Dual MIT/GPL\n"), "open"), ((0, "NVIDIA\n"), "proprietary"), ((1, ""), None)],
)
def test_the_installed_module_type_is_read_from_its_license(
    monkeypatch: pytest.MonkeyPatch, answer: tuple[int, str], module: str | None
) -> None:
    """Issue 37 item 7: what the next boot loads, so plan can tell "installed, reboot left" from "install".
    The licenses are the driver's own: kernel-open/nvidia/nv.c `Dual MIT/GPL`, kernel/nvidia/nv.c `NVIDIA`."""
    code, out = answer
    monkeypatch.setattr(
        system, "run", lambda argv, timeout=0, env=None: subprocess.CompletedProcess(argv, code, out, "")
    )
    assert driver.installed_module() == module
