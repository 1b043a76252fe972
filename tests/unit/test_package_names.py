"""The package-name table: each source's names per branch, across the 580 and 590 boundaries.

The expected names are those NVIDIA's gpu-driver-container scripts install (cited in catalog/names.py);
`source: cuda` + 580 + Fabric Manager found nothing to install when the branch was kept in the names.
"""

from __future__ import annotations

import pytest

from mgpu_provision.catalog import names


@pytest.mark.parametrize(
    ("source", "method", "branch", "expected"),
    [
        ("cuda", "apt", 570, ["nvidia-fabricmanager-570", "libnvidia-nscq-570"]),
        ("cuda", "apt", 580, ["nvidia-fabricmanager", "libnvidia-nscq"]),
        ("cuda", "dnf", 570, ["nvidia-fabric-manager", "libnvidia-nscq-570"]),
        ("cuda", "dnf", 580, ["nvidia-fabricmanager", "libnvidia-nscq"]),
        ("rhel", "dnf", 550, ["nvidia-fabric-manager", "libnvidia-nscq-550"]),
        ("rhel", "dnf", 580, ["nvidia-fabricmanager", "libnvidia-nscq"]),
        ("ubuntu", "apt", 580, ["nvidia-fabricmanager-580", "libnvidia-nscq-580"]),
        ("debian", "apt", 580, []),
    ],
)
def test_fabric_manager_names_change_at_580(
    source: str, method: str, branch: int, expected: list[str]
) -> None:
    assert names.fabric_set(source, method, branch) == expected


def test_nvlink5_boxes_add_nvsdm_and_the_subnet_manager() -> None:
    assert names.fabric_set("cuda", "apt", 580, nvlink5=True) == [
        "nvidia-fabricmanager",
        "libnvidia-nscq",
        "libnvsdm",
        "nvlsm",
        "infiniband-diags",
    ]
    assert names.fabric_set("rhel", "dnf", 570, nvlink5=True)[2:] == [
        "libnvsdm-570",
        "nvlsm",
        "infiniband-diags",
    ]


@pytest.mark.parametrize(
    ("source", "branch", "imex"),
    [
        ("cuda", 535, None),
        ("cuda", 550, "nvidia-imex-550"),
        ("cuda", 580, "nvidia-imex"),
        ("ubuntu", 580, None),
    ],
)
def test_imex_names(source: str, branch: int, imex: str | None) -> None:
    assert names.component(source, "apt", branch, "imex") == imex


def test_unknown_component_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown component 'nvlsm'"):
        names.component("cuda", "apt", 580, "nvlsm")


@pytest.mark.parametrize(
    ("source", "branch", "flavor", "expected"),
    [
        ("ubuntu", 580, "server-open", ([], ["nvidia-driver-580-server-open"])),
        ("cuda", 580, "open", ([], ["nvidia-open-580"])),
        ("cuda", 590, "open", (["nvidia-driver-pinning-590"], ["nvidia-open"])),
        ("cuda", 590, "default", (["nvidia-driver-pinning-590"], ["cuda-drivers"])),
    ],
)
def test_driver_sets(source: str, branch: int, flavor: str, expected: tuple[list[str], list[str]]) -> None:
    assert names.driver_set(source, branch, flavor) == expected


def test_ubuntu_prebuilt_modules_follow_the_kernel_flavour() -> None:
    assert names.kernel_flavour("6.8.0-47-generic") == "generic"
    assert names.kernel_flavour("6.8.0-1012-nvidia-64k") == "nvidia-64k"
    assert names.kernel_flavour("6.1.0-26-amd64") == "amd64"
    assert names.kernel_flavour("6.11.5-300.fc41.x86_64") is None
    assert names.ubuntu_prebuilt(580, "server-open", "generic") == [
        "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server",
        "linux-modules-nvidia-580-server-open-generic",
    ]
    assert names.ubuntu_dkms(580, "server") == "nvidia-dkms-580-server"
