"""The Ubuntu, CUDA-repository and RHEL paths against recorded answers (tests/fixtures/packages/README.md):
what those archives print for the packages of 2026's boxes, read by the agent's own parsers."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.catalog import names, sources
from mgpu_provision.node.core import system
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.packages import apt, common
from mgpu_provision.plan.resources import driver as plan_driver
from mgpu_provision.plan.resources.fabricmanager import package_set

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "packages"


def recorded(name: str) -> str:
    """A fixture without its `#` header: exactly what the command printed."""
    lines = (FIXTURES / name).read_text().splitlines(True)
    return "".join(line for line in lines if not line.startswith("#"))


def test_cuda_repository_580_has_fabric_manager_under_the_names_of_the_table() -> None:
    """Defect 3: at 580 the CUDA repository has `nvidia-fabricmanager`, and no `nvidia-fabricmanager-580`."""
    madison = recorded("cuda-ubuntu2404-madison-fabricmanager-580.txt")
    offered = {line.split("|")[0].strip() for line in madison.splitlines()}
    wanted = names.fabric_set("cuda", "apt", 580)
    assert set(wanted) <= offered
    assert {"nvidia-fabricmanager-580", "libnvidia-nscq-580"}.isdisjoint(offered)
    lines = [line for line in madison.splitlines() if line.startswith("nvidia-fabricmanager ")]
    assert common.pick_version(apt.madison_versions("\n".join(lines)), None, "580") == "580.95.05-1"


def test_rhel_names_change_at_580() -> None:
    listing = recorded("rhel9-dnf-list-fabricmanager.txt")
    offered = {line.split()[0].rsplit(".", 1)[0]: line.split()[1] for line in listing.splitlines()[1:]}
    for branch in (570, 580):
        for package in names.fabric_set("rhel", "dnf", branch):
            assert offered[package].startswith(str(branch)), package


def test_a_transitional_branch_names_what_it_moved_to() -> None:
    """Defect 6: nvidia-headless-565-server only depends on the 580 set."""
    show = recorded("ubuntu-noble-show-nvidia-headless-565-server.txt")
    assert apt.moved_branch(show, "565") == "580"
    own = show.replace("Depends: nvidia-headless-580-server", "Depends: libc6")
    assert apt.moved_branch(own, "565") is None


def test_prebuilt_modules_are_found_for_the_running_kernel() -> None:
    madison = recorded("ubuntu-noble-madison-linux-modules-nvidia-580.txt")
    assert apt.ubuntu_prebuilt_available(madison, 580, "server-open", "6.8.0-85-generic")
    assert not apt.ubuntu_prebuilt_available(madison, 580, "server-open", "6.8.0-86-generic")  # no ABI build
    assert not apt.ubuntu_prebuilt_available(madison, 580, "server", "6.8.0-85-generic")  # proprietary: none


def test_holds_never_freeze_the_kernel_specific_prebuilt_packages() -> None:
    """Defect 4: the old patterns held linux-modules-nvidia-*-generic, so the next kernel had no module."""
    query = recorded("ubuntu-noble-dpkg-query-prebuilt.txt")
    installed = [line.split()[0] for line in query.splitlines()]
    old_patterns = ["*nvidia*-580", "*nvidia*-580-*", "cuda-drivers-580"]
    held = apt.holdable(apt.matching(installed, old_patterns))
    assert not [n for n in held if n.startswith(("linux-modules-", "linux-objects-", "linux-signatures-"))]
    assert "nvidia-utils-580-server" in held and "libnvidia-compute-580-server" in held


def test_install_of_a_transitional_branch_is_refused_before_anything_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(apt, "PREFERENCES", str(tmp_path / "pin"))
    calls: list[list[str]] = []
    madison = "nvidia-headless-565-server | 565.57.01-0ubuntu0.24.04.4 | http://archive.ubuntu.com/ubuntu x\n"
    answers: dict[str, Callable[[list[str]], str]] = {
        "madison": lambda argv: madison,
        "show": lambda argv: recorded("ubuntu-noble-show-nvidia-headless-565-server.txt"),
    }

    def run(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = answers[argv[1]](argv) if argv[0] == "apt-cache" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(system, "run", run)
    step = {
        "source": "ubuntu",
        "flavor": "server",
        "branch": "565",
        "version": None,
        "packages": ["nvidia-headless-565-server"],
        "pinning": [],
        "hold_patterns": ["*nvidia*-565", "*nvidia*-565-*"],
        "hold": True,
        "prebuilt": False,
    }
    with pytest.raises(AgentFailure, match=r'moved branch 565 to 580 .*set driver.branch to "580"'):
        apt.install(step, "driver")
    assert not [c for c in calls if c[:2] == ["apt-get", "install"] or c[0] == "apt-mark"]
    assert not (tmp_path / "pin").exists()


def ubuntu_box(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, modules_madison: str) -> list[list[str]]:
    """An Ubuntu 24.04 box running 6.8.0-85-generic whose archive answers from the recorded madison."""
    monkeypatch.setattr(apt, "PREFERENCES", str(tmp_path / "pin"))
    monkeypatch.setattr(apt, "running_kernel", lambda: "6.8.0-85-generic")
    calls: list[list[str]] = []
    driver = "580.95.05-0ubuntu0.24.04.2"

    def run(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = ""
        if argv[:2] == ["apt-cache", "madison"] and argv[2].startswith("linux-modules-"):
            out = modules_madison
        elif argv[:2] == ["apt-cache", "madison"]:
            out = f"{argv[2]} | {driver} | http://archive.ubuntu.com/ubuntu noble-updates/restricted amd64\n"
        elif argv[0] == "dpkg-query" and any(c[:2] == ["apt-get", "install"] for c in calls):
            out = f"libnvidia-compute-580-server {driver} ii \n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(system, "run", run)
    return calls


UBUNTU_580 = {
    "source": "ubuntu",
    "flavor": "server-open",
    "branch": "580",
    "version": None,
    "packages": ["nvidia-driver-580-server-open"],
    "pinning": [],
    "hold_patterns": ["*nvidia*-580", "*nvidia*-580-*"],
    "hold": False,
    "prebuilt": True,  # the plan's choice for Ubuntu's server set (plan/resources/driver.ubuntu_server_set)
}


def test_ubuntu_installs_the_signed_prebuilt_modules_when_the_archive_has_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Defect 4: the server metapackage hard-depends on DKMS; ubuntu-drivers takes the prebuilt modules."""
    calls = ubuntu_box(monkeypatch, tmp_path, recorded("ubuntu-noble-madison-linux-modules-nvidia-580.txt"))
    changed, message = apt.install(dict(UBUNTU_580), "driver")
    assert changed and "signed prebuilt modules for 6.8.0-85-generic" in message, message
    (install,) = [c for c in calls if c[:2] == ["apt-get", "install"]]
    assert install[len(apt.INSTALL) :] == [
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server",
        "linux-modules-nvidia-580-server-open-generic",
    ]


def test_ubuntu_falls_back_to_dkms_without_prebuilt_modules(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = ubuntu_box(monkeypatch, tmp_path, "")
    changed, message = apt.install(dict(UBUNTU_580), "driver")
    assert changed and "DKMS: no prebuilt modules for 6.8.0-85-generic" in message, message
    (install,) = [c for c in calls if c[:2] == ["apt-get", "install"]]
    assert install[len(apt.INSTALL) :] == ["nvidia-driver-580-server-open"]


def test_the_node_takes_prebuilt_modules_only_where_the_step_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The plan resolves the prebuilt-or-DKMS choice; the node no longer recomputes the server set."""
    calls = ubuntu_box(monkeypatch, tmp_path, recorded("ubuntu-noble-madison-linux-modules-nvidia-580.txt"))
    changed, message = apt.install({**UBUNTU_580, "prebuilt": False}, "driver")
    assert changed and "prebuilt" not in message and "DKMS" not in message, message
    (install,) = [c for c in calls if c[:2] == ["apt-get", "install"]]
    assert install[len(apt.INSTALL) :] == ["nvidia-driver-580-server-open"]
    assert not [c for c in calls if c[:2] == ["apt-cache", "madison"] and c[2].startswith("linux-modules-")]


@pytest.mark.parametrize(
    ("source", "flavor", "packages", "fabricmanager", "prebuilt"),
    [
        ("ubuntu", "server-open", None, False, True),
        ("ubuntu", "server", None, False, True),
        ("ubuntu", "open", None, False, False),  # a desktop flavor: no prebuilt modules of it
        ("ubuntu", "server-open", ["nvidia-driver-580-server-open", "nvidia-utils-580-server"], False, False),
        ("ubuntu", "server-open", None, True, False),  # with Fabric Manager's packages in the set
        ("cuda", "open", None, False, False),
    ],
)
def test_the_plan_marks_ubuntus_server_set_for_prebuilt_modules(
    source: str, flavor: str, packages: list[str] | None, fabricmanager: bool, prebuilt: bool
) -> None:
    pkgset = sources.apt_set(source, "580", flavor, fabricmanager, packages)
    chosen = plan_driver.Source(source, "apt", flavor)
    assert plan_driver.ubuntu_server_set(chosen, "580", pkgset) is prebuilt


def test_an_hwe_kernel_gets_the_modules_of_its_own_kernel_metapackage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 37 item 3: the modules metapackage follows the installed kernel metapackage
    (linux-image-generic-hwe-24.04 → linux-modules-nvidia-580-server-open-generic-hwe-24.04), as
    ubuntu-drivers does; `uname -r`'s `-generic` pulled the GA kernel's modules and GRUB booted the HWE
    kernel with none."""
    listing = recorded("ubuntu-noble-dpkg-query-linux-image-hwe.txt")
    assert apt.kernel_metapackage_flavour(listing, "6.11.0-29-generic") == "generic-hwe-24.04"
    assert apt.kernel_metapackage_flavour(listing, "6.8.0-85-generic") == "generic"
    assert apt.kernel_metapackage_flavour(listing, "6.14.0-1-generic") is None  # none pulls it in: uname's

    calls = ubuntu_box(
        monkeypatch, tmp_path, recorded("ubuntu-noble-madison-linux-modules-nvidia-580-hwe.txt")
    )
    monkeypatch.setattr(apt, "running_kernel", lambda: "6.11.0-29-generic")
    answer = system.run

    def run(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        if argv[0] == "dpkg-query" and argv[-1] == "linux-image-*":
            calls.append(argv)
            return subprocess.CompletedProcess(argv, 0, listing, "")
        return answer(argv, timeout, env)

    monkeypatch.setattr(system, "run", run)
    changed, message = apt.install(dict(UBUNTU_580), "driver")
    assert changed and "following linux-image-generic-hwe-24.04" in message, message
    (install,) = [c for c in calls if c[:2] == ["apt-get", "install"]]
    assert install[-1] == "linux-modules-nvidia-580-server-open-generic-hwe-24.04"


def test_a_box_without_nvidias_repository_is_told_the_repository_step_before_anything_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 37 item 8: `source: cuda` on a fresh Ubuntu box said only "they offer: none"; the refusal now
    names NVIDIA's repository step for this box (the cuda-keyring package of ubuntu2404/<arch>)."""
    monkeypatch.setattr(apt, "PREFERENCES", str(tmp_path / "pin"))
    ubuntu = (FIXTURES.parent / "os-release" / "ubuntu-24.04").read_text()
    real_read = system.read_text
    monkeypatch.setattr(system, "read_text", lambda p: ubuntu if p == "/etc/os-release" else real_read(p))
    calls: list[list[str]] = []

    def run(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")  # Ubuntu's archive has no cuda-drivers-580

    monkeypatch.setattr(system, "run", run)
    step = {
        "source": "cuda",
        "flavor": "open",
        "branch": "580",
        "version": "580.95.05",
        "packages": ["nvidia-open-580"],
        "pinning": [],
        "hold_patterns": ["*nvidia*-580", "*nvidia*-580-*"],
        "hold": True,
        "prebuilt": False,
        "repo": None,
    }
    with pytest.raises(AgentFailure) as caught:
        apt.install(step, "driver")
    arch = {"x86_64": "x86_64", "aarch64": "sbsa"}.get(os.uname().machine, os.uname().machine)
    assert "they offer: none); NVIDIA's CUDA repository is not configured on this box" in caught.value.message
    assert f"compute/cuda/repos/ubuntu2404/{arch}/cuda-keyring_1.1-1_all.deb" in caught.value.message
    assert caught.value.message.endswith("or set driver.repo to a mirror of it; nothing was changed")
    assert not [c for c in calls if c[:2] == ["apt-get", "install"] or c[0] == "apt-mark"]
    assert not (tmp_path / "pin").exists()


def test_a_hanging_package_manager_is_stopped_and_named_before_anything_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 37, bad input: apt-get that never returns (another apt holding the lock) is stopped at the
    command's timeout with a plain error; no pin, no install, no hold was made."""
    monkeypatch.setattr(apt, "PREFERENCES", str(tmp_path / "pin"))
    calls: list[list[str]] = []

    def run(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[:2] == ["apt-get", "update"]:  # as system.run answers a command past its timeout
            return subprocess.CompletedProcess(argv, 124, "", f"apt-get: timed out after {timeout:g} s")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(system, "run", run)
    step = dict(UBUNTU_580, repo=None)
    with pytest.raises(AgentFailure) as caught:
        apt.install(step, "driver")
    assert caught.value.message.startswith("`apt-get update -q` did not finish in 30 minutes and was stopped")
    assert "the next apply starts this step again" in caught.value.message
    assert calls == [["apt-get", "update", "-q"]] and not (tmp_path / "pin").exists()


def test_nvlink5_packages_install_at_their_own_versions_and_a_second_apply_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 37 item 1 (apt): nvlsm and infiniband-diags were pinned at the driver's version ("nvlsm
    580.95.05 is not available … nothing was changed"); NVIDIA's ubuntu24.04/precompiled/nvidia-driver
    installs them without one. Versions as NVIDIA's CUDA repository ubuntu2404 offers them."""
    monkeypatch.setattr(apt, "PREFERENCES", str(tmp_path / "pin"))
    offer = {
        "nvidia-fabricmanager": "580.95.05-1",
        "libnvidia-nscq": "580.95.05-1",
        "libnvsdm": "580.95.05-1",
        "nvlsm": "2025.06.5-1",
        "infiniband-diags": "50.0-1",
    }
    installed: dict[str, list[str]] = {}  # name -> [version, status]
    calls: list[list[str]] = []

    def run(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = ""
        if argv[:2] == ["apt-cache", "madison"]:
            out = "".join(f"{n} | {offer[n]} | https://developer.download.nvidia.com x\n" for n in argv[2:])
        elif argv[0] == "dpkg-query":
            out = "".join(f"{n} {v} {s}\n" for n, (v, s) in installed.items())
        elif argv[:2] == ["apt-get", "install"]:
            installed.update({n: [offer[n], "ii"] for n in argv[len(apt.INSTALL) :]})
        elif argv[:2] == ["apt-mark", "hold"]:
            for name in argv[2:]:
                installed[name][1] = "hi"
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(system, "run", run)
    fm = package_set("cuda", "apt", "580.95.05", nvlink5=True)
    step = protocol.fabricmanager_step("580.95.05", "cuda", "apt", fm, hold=True, start=False)
    changed, message = apt.install(dict(protocol.check_step(0, step)), "Fabric Manager")
    assert changed, message
    (install,) = [c for c in calls if c[:2] == ["apt-get", "install"]]
    assert install[len(apt.INSTALL) :] == list(offer)  # names only: the pin picks the driver's version
    assert "nvlsm" not in (tmp_path / "pin").read_text()
    assert {n: s for n, (_, s) in installed.items()} == {
        "nvidia-fabricmanager": "hi",
        "libnvidia-nscq": "hi",
        "libnvsdm": "hi",
        "nvlsm": "ii",  # never held: its own version moves with NVIDIA's repository
        "infiniband-diags": "ii",
    }
    again = apt.install(dict(protocol.check_step(0, step)), "Fabric Manager")
    assert again == (False, "Fabric Manager 580.95.05 already installed (580.95.05-1)")
