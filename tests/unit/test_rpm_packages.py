"""The RPM installers' decisions: the SUSE package set, reading zypper's tables and dnf's and yum's lists."""

from __future__ import annotations

from pathlib import Path

from mgpu_provision.node.packages import zypper
from mgpu_provision.node.packages.common import listed_versions, upstream

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "rpm"


def test_the_set_of_a_branch_with_fabric_manager_by_name() -> None:
    found = zypper.package_set("550", "default", fabricmanager=True)
    assert found.pinning == []
    assert found.install == [
        "cuda-drivers-550",
        "nvidia-compute-utils-G06",
        "nvidia-driver-G06-kmp-default",
        "nvidia-fabric-manager",
        "libnvidia-nscq-550",
    ]
    assert found.hold == found.install


def test_open_modules_and_the_unversioned_names_of_590() -> None:
    found = zypper.package_set("590", "open", fabricmanager=False)
    assert found.pinning == ["nvidia-driver-pinning-590"]
    kmp = "nvidia-open-driver-G06-signed-kmp-default"
    assert found.install == ["nvidia-open", "nvidia-compute-utils-G06", kmp]
    assert found.hold[0] == "nvidia-driver-pinning-590"


def test_search_table_gives_every_version_offered() -> None:
    text = (RECORDED / "search-cuda-drivers-550.txt").read_text()
    assert zypper.search_versions(text, "cuda-drivers-550") == ["550.90.07-1", "550.54.15-1"]
    assert zypper.search_versions(text, "cuda-drivers-535") == []
    assert zypper.search_versions("No matching items found.\n", "cuda-drivers-550") == []


def test_locks_table_gives_the_locked_names() -> None:
    text = (RECORDED / "locks.txt").read_text()
    assert zypper.lock_names(text) == ["cuda-drivers-550", "nvidia-compute-utils-G06", "kernel-default"]


def test_dnf_list_gives_installed_and_available_versions_of_one_name() -> None:
    text = (RECORDED / "dnf-list-nvidia-driver.txt").read_text()
    assert listed_versions(text, "nvidia-driver") == ["550.54.15-1", "550.90.07-1"]
    assert listed_versions(text, "nvidia-driver-cuda") == ["550.90.07-1"]
    assert listed_versions("Error: No matching Packages to list\n", "nvidia-driver") == []


def test_an_epoch_and_a_dist_tag_are_not_part_of_the_upstream_version() -> None:
    line = "nvidia-driver.x86_64      3:550.54.15-1.el9      cuda-rhel9-x86_64\n"
    assert [upstream(v) for v in listed_versions(line, "nvidia-driver")] == ["550.54.15"]
