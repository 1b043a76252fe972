"""The card table behind the SLI rules: card class by name, and the GeForce families without a connector."""

from __future__ import annotations

import pytest

from mgpu_provision.rig.cards import (
    card_class,
    missing_connector,
    missing_nvlink,
    module_type,
    open_modules_only,
)


@pytest.mark.parametrize(
    ("model", "klass", "no_connector"),
    [
        ("NVIDIA GeForce RTX 3090", "geforce", None),
        ("NVIDIA GeForce RTX 3090 Ti", "geforce", None),
        ("NVIDIA GeForce RTX 2080 Ti", "geforce", None),
        ("NVIDIA GeForce RTX 2070 SUPER", "geforce", None),
        ("NVIDIA TITAN RTX", "geforce", None),
        ("NVIDIA GeForce RTX 4090", "geforce", "GeForce RTX 40 series"),
        ("NVIDIA GeForce RTX 4060 Ti", "geforce", "GeForce RTX 40 series"),
        ("NVIDIA GeForce RTX 5090", "geforce", "GeForce RTX 50 series"),
        ("NVIDIA GeForce RTX 3080 Ti", "geforce", "GeForce RTX 30 series below the 3090"),
        ("NVIDIA GeForce RTX 2070", "geforce", "GeForce RTX 2060 and 2070"),
        ("NVIDIA GeForce RTX 2060 SUPER", "geforce", "GeForce RTX 2060 and 2070"),
        ("NVIDIA GeForce GTX 1660 Ti", "geforce", "GeForce GTX 16 series"),
        ("NVIDIA RTX A6000", "professional", None),
        ("NVIDIA RTX 6000 Ada Generation", "professional", None),
        ("Quadro RTX 8000", "professional", None),
        ("NVIDIA A100-SXM4-80GB", "unknown", None),
        ("NVIDIA H100 80GB HBM3", "unknown", None),
    ],
)
def test_card_table(model: str, klass: str, no_connector: str | None) -> None:
    assert card_class(model) == klass
    assert missing_connector(model) == no_connector


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("NVIDIA RTX 6000 Ada Generation", "RTX Ada workstation cards"),
        ("NVIDIA RTX 4000 SFF Ada Generation", "RTX Ada workstation cards"),
        ("NVIDIA L40S", "L4, L40 and L40S"),
        ("NVIDIA L40", "L4, L40 and L40S"),
        ("NVIDIA L4", "L4, L40 and L40S"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10"),
        ("NVIDIA RTX A4000", "RTX A4000"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO Blackwell cards"),
        ("NVIDIA RTX A6000", None),
        ("NVIDIA RTX A4500", None),
        ("NVIDIA A100-SXM4-80GB", None),
        ("NVIDIA H100 80GB HBM3", None),
    ],
)
def test_cards_without_an_nvlink_connector(model: str, family: str | None) -> None:
    assert missing_nvlink(model) == family


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("NVIDIA B200", "Blackwell"),
        ("NVIDIA B300 SXM6 AC", "Blackwell"),
        ("NVIDIA GB200", "Grace Blackwell"),
        ("NVIDIA GB300", "Grace Blackwell"),
        ("NVIDIA GH200 480GB", "Grace Hopper"),
        ("NVIDIA GeForce RTX 5090", "Blackwell"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "Blackwell"),
        ("NVIDIA H100 80GB HBM3", None),
        ("NVIDIA A100-SXM4-80GB", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpus_that_run_only_the_open_modules(model: str, family: str | None) -> None:
    assert open_modules_only(model) == family


@pytest.mark.parametrize(
    ("flavor", "model", "branch", "module"),
    [
        (None, "NVIDIA H100 80GB HBM3", "580", "open"),  # open by default from 560 on Turing and later
        (None, "NVIDIA H100 80GB HBM3", "550", "proprietary"),
        (None, "Tesla V100-SXM2-32GB", "580", "proprietary"),  # Volta has no GSP
        ("server", "NVIDIA B200", "580", "proprietary"),
        ("server-open", "NVIDIA B200", "580", "open"),
    ],
)
def test_module_type_by_flavor_branch_and_architecture(
    flavor: str | None, model: str, branch: str, module: str
) -> None:
    assert module_type(flavor, model, branch) == module


def test_fabric_manager_and_nvlink5_by_board() -> None:
    from mgpu_provision.rig.cards import fabric_manager_elsewhere, nvlink5_hgx

    assert fabric_manager_elsewhere("NVIDIA GB200") and fabric_manager_elsewhere("NVIDIA GB300")
    assert not fabric_manager_elsewhere("NVIDIA B200")
    assert not fabric_manager_elsewhere("NVIDIA H100 80GB HBM3")
    assert nvlink5_hgx("NVIDIA B200") and nvlink5_hgx("NVIDIA B300 SXM6 AC")
    assert not nvlink5_hgx("NVIDIA GB200") and not nvlink5_hgx("NVIDIA GeForce RTX 5090")
    assert not nvlink5_hgx("NVIDIA H100 80GB HBM3")
