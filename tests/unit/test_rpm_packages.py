"""The RPM installers' decisions: the SUSE package set, reading zypper's tables and dnf's and yum's lists."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.catalog import sources
from mgpu_provision.node.core import system
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.packages import dnf, driver, zypper
from mgpu_provision.node.packages.common import Command, listed_versions, upstream

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "rpm"


def test_the_set_of_a_branch_with_fabric_manager_by_name() -> None:
    found = sources.zypper_set("550", "default", fabricmanager=True)
    assert found.pinning == []
    assert found.install == [
        "cuda-drivers-550",
        "nvidia-compute-utils-G06",
        "nvidia-driver-G06-kmp-default",
        "nvidia-fabric-manager",
        "libnvidia-nscq-550",
    ]
    assert found.hold == found.install


def test_open_modules_are_suses_cuda_kmp_of_the_branchs_generation() -> None:
    """Issue 37 item 4: the open KMP is SUSE's `-cuda-` flavour (built at the CUDA repository's driver
    versions; the graphics flavour has SUSE's own), and 590 and later are G07 (SUSE's
    nvidia-open-driver-G07-signed builds 590.44.01 onwards), not G06."""
    found = sources.zypper_set("590", "open", fabricmanager=False)
    assert found.pinning == ["nvidia-driver-pinning-590"]
    kmp = "nvidia-open-driver-G07-signed-cuda-kmp-default"
    assert found.install == ["nvidia-open", "nvidia-compute-utils-G07", kmp]
    assert found.hold[0] == "nvidia-driver-pinning-590"
    older = sources.zypper_set("580", "open", fabricmanager=False)
    assert older.install == [
        "nvidia-open-580",
        "nvidia-compute-utils-G06",
        "nvidia-open-driver-G06-signed-cuda-kmp-default",
    ]


def test_nvlink5_packages_are_installed_by_name_and_never_locked() -> None:
    """Issue 37 item 1: nvlsm and infiniband-diags have versions of their own."""
    found = sources.zypper_set("580", "open", fabricmanager=True, nvlink5=True)
    assert found.install[3:] == [
        "nvidia-fabricmanager",
        "libnvidia-nscq",
        "libnvsdm",
        "nvlsm",
        "infiniband-diags",
    ]
    assert "nvlsm" not in found.hold and "infiniband-diags" not in found.hold
    assert zypper.editions(
        ["nvidia-fabricmanager"], {"nvidia-fabricmanager": ["580.95.05-1", "580.82.07-1"]}, "580.95.05"
    ) == ["nvidia-fabricmanager=580.95.05-1"]


def test_search_gives_every_version_offered_and_a_kmps_kernel_is_not_its_version() -> None:
    text = (RECORDED / "xmlout-search-cuda-drivers-550.xml").read_text()
    assert zypper.search_versions(text, "cuda-drivers-550") == ["550.90.07-1", "550.54.15-1"]
    assert zypper.search_versions(text, "cuda-drivers-535") == []
    none = (RECORDED / "xmlout-search-none.xml").read_text()
    assert zypper.search_versions(none, "cuda-drivers-550") == []
    kmp = "nvidia-open-driver-G06-signed-cuda-kmp-default"
    offered = zypper.search_versions((RECORDED / "xmlout-search-kmp-cuda.xml").read_text(), kmp)
    assert offered == ["580.95.05_k6.4.0_150600.23.73-1.1"]
    assert [upstream(v) for v in offered] == ["580.95.05"]  # item 4: `name=<driver version>` never matched
    assert zypper.editions([kmp], {kmp: offered}, "580.95.05") == [f"{kmp}=580.95.05_k6.4.0_150600.23.73-1.1"]


def test_zypper_never_skips_signature_checks() -> None:
    """Issue 37 item 5: `--no-gpg-checks` installed kernel modules without checking who signed them."""
    assert "--no-gpg-checks" not in zypper.ZYPPER


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


def test_yum_on_el7_has_no_streams_no_allowerasing_and_moves_down_with_downgrade() -> None:
    names = sources.dnf_packages("550", "default", exact=True, fabricmanager=False)
    step = protocol.driver_step(
        "yum", "rhel", "default", "550", "550.54.15", True, False, packages=protocol.PackageSet([], names, [])
    )
    assert step["modules"] is True  # the default; yum has no module streams whatever a step says
    assert dnf.commands(step, current="550.90.07") == [
        Command(["yum", "-y", "install", "yum-plugin-versionlock"]),
        Command(["yum", "-y", "versionlock", "delete", "*nvidia*"], check=False),
        Command(
            ["yum", "-y", "downgrade", "nvidia-driver-550.54.15", "nvidia-driver-cuda-550.54.15",
             "kmod-nvidia-latest-dkms-550.54.15"]
        ),
        Command(["yum", "-y", "versionlock", "add", "*nvidia*550.54.15*"]),
    ]  # fmt: skip
    up = dnf.commands(dict(step, version="550.90.07"), current="550.54.15")
    assert up[2].argv[:3] == ["yum", "-y", "install"]


def test_a_version_the_rpm_repositories_lack_is_refused_before_any_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listing = (RECORDED / "dnf-list-nvidia-driver.txt").read_text()
    calls: list[list[str]] = []

    def run(argv: list[str], timeout: float = 0, env: object = None) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, listing, "")

    monkeypatch.setattr(system, "run", run)
    names = sources.dnf_packages("550", "default", exact=True, fabricmanager=False)
    packages = protocol.PackageSet([], names, [])
    step = protocol.driver_step("dnf", "rhel", "default", "550", "550.99.99", True, False, packages=packages)
    with pytest.raises(AgentFailure) as caught:
        driver.install(step, "550.54.15")
    assert caught.value.message == (
        "nvidia-driver 550.99.99 is not available from the dnf repositories "
        "(they offer: 550.54.15, 550.90.07); nothing was changed"
    )
    listed = ["dnf", "-q", "--disableplugin=versionlock", "list", "--showduplicates", "nvidia-driver"]
    assert calls == [listed]
