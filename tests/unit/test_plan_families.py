"""Plan and apply of a driver on every family GPU fleets run, from recorded /etc/os-release files.

A simulated node takes its distribution from its twin (the recorded file's ID, VERSION_ID, ID_LIKE and
PRETTY_NAME), so each case is the plan a box of that release gets: the package method its family uses (apt,
dnf with or without module streams, yum, zypper) or a manual step naming the family, never another
family's tool. The simulated apply then carries the step out and reports the method it was given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.node.core import system
from mgpu_provision.node.nvidia.select import select_backend
from mgpu_provision.plan.host import plan_host
from mgpu_provision.rig import load_rig
from tests.support.factories import facts_from_twin, write_twin

OS_RELEASES = Path(__file__).resolve().parents[1] / "fixtures" / "os-release"
VERSION = "550.90.07"

# file -> (method, module streams, source label) for an install; a str: the manual step's reason.
EXPECTED: dict[str, tuple[str, bool, str] | str] = {
    "ubuntu-22.04": ("apt", False, "ubuntu packages with apt"),
    "ubuntu-24.04": ("apt", False, "ubuntu packages with apt"),
    "debian-12": ("apt", False, "debian packages with apt"),
    "rhel-8.10": ("dnf", True, "rhel packages with dnf"),
    "rhel-9.6": ("dnf", True, "rhel packages with dnf"),
    "rhel-10.0": ("dnf", False, "rhel packages with dnf"),
    "rocky-9.5": ("dnf", True, "rhel packages with dnf"),
    "rocky-10.0": ("dnf", False, "rhel packages with dnf"),
    "almalinux-8.10": ("dnf", True, "rhel packages with dnf"),
    "almalinux-9.6": ("dnf", True, "rhel packages with dnf"),
    "amzn-2": ("yum", False, "rhel packages with yum"),
    "amzn-2023": ("dnf", True, "rhel packages with dnf"),
    "centos-7": ("yum", False, "rhel packages with yum"),
    "ol-7.9": ("yum", False, "rhel packages with yum"),
    "sles-15.6": ("zypper", False, "cuda packages with zypper"),
    "opensuse-leap-15.6": ("zypper", False, "cuda packages with zypper"),
    "sles-12.5": "SUSE Linux Enterprise 12: NVIDIA's repositories serve SUSE Linux Enterprise Server 15 and "
    "openSUSE Leap 15 only",
    "opensuse-leap-16.0": "openSUSE Leap 16: NVIDIA's repositories serve SUSE Linux Enterprise Server 15 and "
    "openSUSE Leap 15 only",
    "opensuse-tumbleweed": "opensuse-tumbleweed: NVIDIA's repositories serve",
    "arch": "Arch Linux: NVIDIA publishes no packages for it",
}


def twin_release(name: str) -> dict[str, Any]:
    text = (OS_RELEASES / name).read_text()
    release = system.os_release(text)
    return {
        "id": release["os_id"],
        "version_id": release["os_version_id"],
        "like": release["os_like"],
        "pretty_name": system.os_pretty_name(text),
    }


def driver_changes(tmp_path: Path, name: str, driver: dict[str, Any]) -> tuple[list[Any], Path]:
    twin = write_twin(tmp_path, None, 1, os_release=twin_release(name), available_drivers=[VERSION])
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "version: 1\nhosts:\n  - {name: box, rig: one, connection: local, simulate: twin.json}\n"
        f"rigs:\n  one:\n    gpus: {{model: NVIDIA GeForce RTX 3090, count: 1}}\n    driver: {driver}\n"
    )
    loaded = load_rig(rig)
    changes = plan_host(loaded, loaded.spec.hosts[0], facts_from_twin(twin))
    return [c for c in changes if c.resource == "driver"], twin


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_plan_and_apply_per_family(tmp_path: Path, name: str) -> None:
    (change,), twin = driver_changes(tmp_path, name, {"version": VERSION})
    expected = EXPECTED[name]
    if isinstance(expected, str):
        assert change.action == "manual" and change.agent_step is None
        assert expected in change.summary, change.summary
        return
    method, modules, label = expected
    assert change.summary == f"driver 550.54.15 → {VERSION} ({label})"
    step = change.agent_step
    assert step is not None and (step["method"], step["modules"]) == (method, modules)
    changed, message = select_backend(str(twin), str(tmp_path / "state")).install_driver(step)
    assert changed and message.startswith(f"installed driver {VERSION} with {method}")


def test_a_rig_asking_for_apt_on_sles_gets_a_manual_step_naming_the_family(tmp_path: Path) -> None:
    (change,), _ = driver_changes(tmp_path, "sles-15.6", {"version": VERSION, "method": "apt"})
    assert change.action == "manual"
    assert "SUSE Linux Enterprise 15 installs packages with zypper, not apt" in change.summary


def test_the_cuda_source_on_sles_is_installed_with_zypper_not_apt(tmp_path: Path) -> None:
    (change,), _ = driver_changes(tmp_path, "sles-15.6", {"version": VERSION, "source": "cuda"})
    assert change.agent_step is not None and change.agent_step["method"] == "zypper"


def test_arch_with_a_source_named_still_gets_the_manual_step(tmp_path: Path) -> None:
    (change,), _ = driver_changes(tmp_path, "arch", {"version": VERSION, "source": "cuda"})
    assert change.action == "manual" and "Arch Linux: NVIDIA publishes no packages" in change.summary
