"""What a GPU model's name says about SLI: its card class and whether it has an NVLink/SLI bridge connector.

The rules refuse rig files that no real box can satisfy: SLI Mosaic on a GeForce card (its driver offers
Base Mosaic only) and a bridge or SLI on a GeForce card that has no connector to plug a bridge into. The table
is small on purpose: it names only the GeForce families NVIDIA built without the connector, and every name it
does not know passes, so a new card never fails validate because of this table.

SLI Mosaic is for professional cards (Quadro, RTX A-series, RTX Ada, RTX PRO); GeForce and TITAN cards get
Base Mosaic, which spans the displays without SLI rendering (NVIDIA X driver README, "SLI Mosaic").
"""

from __future__ import annotations

import re
from typing import Literal

CardClass = Literal["geforce", "professional", "unknown"]

_GEFORCE = re.compile(r"\b(GeForce|TITAN)\b", re.IGNORECASE)
_PROFESSIONAL = re.compile(r"\b(Quadro|RTX A\d{4}|RTX PRO|Ada Generation)\b", re.IGNORECASE)

# GeForce families without an NVLink/SLI connector. The RTX 3090 and 3090 Ti, the RTX 2080 Ti, 2080,
# 2080 SUPER and 2070 SUPER, the TITAN RTX and the GTX 1070 and up have one, so they are absent here.
_NO_CONNECTOR: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"GeForce RTX 50\d0", re.IGNORECASE), "GeForce RTX 50 series"),
    (re.compile(r"GeForce RTX 40\d0", re.IGNORECASE), "GeForce RTX 40 series"),
    (re.compile(r"GeForce RTX 30[5-8]0", re.IGNORECASE), "GeForce RTX 30 series below the 3090"),
    (
        re.compile(r"GeForce RTX 20[56]0|GeForce RTX 2070(?! SUPER)", re.IGNORECASE),
        "GeForce RTX 2060 and 2070",
    ),
    (re.compile(r"GeForce GTX 16\d0", re.IGNORECASE), "GeForce GTX 16 series"),
)


def card_class(model: str) -> CardClass:
    """geforce (GeForce and TITAN), professional (Quadro, RTX A-series, RTX Ada, RTX PRO), or unknown."""
    if _PROFESSIONAL.search(model):
        return "professional"
    if _GEFORCE.search(model):
        return "geforce"
    return "unknown"


def missing_connector(model: str) -> str | None:
    """The family of a card known to have no NVLink/SLI connector, or None (it has one, or it is unknown)."""
    return next((family for pattern, family in _NO_CONNECTOR if pattern.search(model)), None)
