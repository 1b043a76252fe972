"""The card table behind the SLI rules: card class by name, and the GeForce families without a connector."""

from __future__ import annotations

import pytest

from mgpu_provision.rig.cards import card_class, missing_connector


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
