"""The family table against recorded /etc/os-release files: each picks its package method or a manual step."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.catalog import families
from mgpu_provision.node.core import system

OS_RELEASES = Path(__file__).resolve().parent.parent / "fixtures" / "os-release"

# file -> (method, module streams, default source); method None: a manual step whose text names the family.
EXPECTED = {
    "ubuntu-22.04": ("apt", False, "ubuntu"),
    "ubuntu-24.04": ("apt", False, "ubuntu"),
    "debian-12": ("apt", False, "debian"),
    "rhel-8.10": ("dnf", True, "rhel"),
    "rhel-9.6": ("dnf", True, "rhel"),
    "rhel-10.0": ("dnf", False, "rhel"),
    "rocky-9.5": ("dnf", True, "rhel"),
    "rocky-10.0": ("dnf", False, "rhel"),
    "almalinux-8.10": ("dnf", True, "rhel"),
    "almalinux-9.6": ("dnf", True, "rhel"),
    "amzn-2": ("yum", False, "rhel"),
    "amzn-2023": ("dnf", True, "rhel"),
    "centos-7": ("yum", False, "rhel"),
    "ol-7.9": ("yum", False, "rhel"),
    "sles-15.6": ("zypper", False, "cuda"),
    "opensuse-leap-15.6": ("zypper", False, "cuda"),
    "sles-12.5": (None, False, None),
    "opensuse-leap-16.0": (None, False, None),
    "opensuse-tumbleweed": (None, False, None),
    "arch": (None, False, None),
    "tencentos-3.1": ("dnf", True, "rhel"),  # issue 37 item 12: PLATFORM_ID platform:el8, not "RHEL 3"
}
MANUAL_NAMES = {
    "sles-12.5": "SUSE Linux Enterprise 12",
    "opensuse-leap-16.0": "openSUSE Leap 16",
    "opensuse-tumbleweed": "opensuse-tumbleweed",
    "arch": "Arch Linux",
}


def family_of_file(name: str) -> families.Family:
    release = system.os_release((OS_RELEASES / name).read_text())
    return families.family_of(
        release["os_id"],  # type: ignore[arg-type]
        release["os_version_id"],  # type: ignore[arg-type]
        release["os_like"],  # type: ignore[arg-type]
        release["os_platform_id"],  # type: ignore[arg-type]
    )


def test_every_recorded_file_has_an_expectation() -> None:
    recorded = {p.name for p in OS_RELEASES.iterdir() if p.name != "README.md"}
    assert recorded == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_family_gets_its_own_method(name: str) -> None:
    method, modules, source = EXPECTED[name]
    family = family_of_file(name)
    assert (family.method, family.modules, family.source) == (method, modules, source)
    if method is None:
        assert family.problem and MANUAL_NAMES[name] in family.problem
    else:
        assert family.problem is None


def test_suse_refusals_say_which_releases_are_supported() -> None:
    problem = family_of_file("sles-12.5").problem or ""
    assert "SUSE Linux Enterprise Server 15 and openSUSE Leap 15" in problem


def test_an_unknown_distribution_is_named_and_never_given_another_familys_tool() -> None:
    family = families.family_of("nixos", "25.05", [])
    assert family.method is None and family.problem and family.problem.startswith("nixos:")


def test_a_derivative_is_read_by_what_it_is_like() -> None:
    assert families.family_of("linuxmint", "22", ["ubuntu", "debian"]).method == "apt"
    assert families.family_of("nobara", "41", ["fedora"]).method == "dnf"


@pytest.mark.parametrize(
    ("name", "method", "source", "problem"),
    [
        ("sles-15.6", "zypper", "cuda", None),
        ("sles-15.6", "apt", "cuda", "installs packages with zypper, not apt"),
        ("sles-15.6", "zypper", "ubuntu", "the ubuntu source is not installed with zypper"),
        ("centos-7", "dnf", "rhel", "installs packages with yum, not dnf"),
        ("arch", "apt", "cuda", "Arch Linux: NVIDIA publishes no packages"),
        ("arch", "runfile", "cuda", None),
    ],
)
def test_method_problem(name: str, method: str, source: str, problem: str | None) -> None:
    found = families.method_problem(family_of_file(name), method, source)
    assert found == problem if problem is None else (found is not None and problem in found)


def test_a_rebuild_with_its_own_version_id_is_read_by_its_platform_id() -> None:
    """Issue 37 item 12: TencentOS 3.1 (VERSION_ID 3.1, ID_LIKE rhel) was "RHEL 3 family", refused."""
    family = family_of_file("tencentos-3.1")
    assert family.name == "RHEL 8 family" and family.problem is None
    assert families.family_of("tencentos", "3.1", ["rhel", "fedora", "centos"]).name == "RHEL 3 family"
