"""What a GPU model's name says about SLI: its card class and whether it has an NVLink/SLI bridge connector.

The rules refuse rig files that no real box can satisfy: SLI Mosaic on a GeForce card (its driver offers
Base Mosaic only), a bridge or SLI on a GeForce card that has no connector to plug a bridge into, an NVLink
bridge on a professional card built without one, and the proprietary kernel modules on GPUs that only run
the open ones. The tables are small on purpose: they name only the families NVIDIA built that way, and every
name they do not know passes, so a new card never fails validate because of them.

SLI Mosaic is for professional cards (Quadro, RTX A-series, RTX Ada, RTX PRO); GeForce and TITAN cards get
Base Mosaic, which spans the displays without SLI rendering (NVIDIA X driver README, "SLI Mosaic").
"""

from __future__ import annotations

import re
from typing import Literal, TypeVar

from ..catalog import sources
from ..typing_lite import NamedTuple

CardClass = Literal["geforce", "professional", "unknown"]
T = TypeVar("T")

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
# Professional and data-center cards without an NVLink connector (NVIDIA's product briefs: the RTX Ada
# workstation cards, L4/L40/L40S, A10, RTX A4000 and the RTX PRO Blackwell cards have none; the RTX A6000,
# A5000 and A4500 have one). Mosaic works on them without a bridge, so only bridges are refused.
_NO_NVLINK: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"RTX [456]000( SFF)? Ada", re.IGNORECASE), "RTX Ada workstation cards"),
    (re.compile(r"\bL40S?\b|\bL4\b", re.IGNORECASE), "L4, L40 and L40S"),
    (re.compile(r"\bA10G?\b", re.IGNORECASE), "A10"),
    (re.compile(r"RTX A4000\b", re.IGNORECASE), "RTX A4000"),
    (re.compile(r"RTX PRO \d{4} Blackwell", re.IGNORECASE), "RTX PRO Blackwell cards"),
)
# GPUs that run only the open kernel modules (NVIDIA's driver installation guide: "for Grace Hopper or
# Blackwell you must use the open-source GPU kernel modules; the proprietary drivers are unsupported").
_OPEN_ONLY: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bGH\d{3}\b", re.IGNORECASE), "Grace Hopper"),
    (re.compile(r"\bGB\d{2,3}\b", re.IGNORECASE), "Grace Blackwell"),
    (re.compile(r"\bB\d{3}\b|Blackwell|GeForce RTX 50\d0", re.IGNORECASE), "Blackwell"),
)


# NVML names (`nvidia-smi --query-gpu=name`) of cards people train on, to suggest the exact name for a
# shorthand (`RTX 3090`). Only a suggestion: a name not listed here is never refused for that.
NVML_NAMES = (
    "NVIDIA GeForce RTX 2080 Ti",
    "NVIDIA GeForce RTX 3080",
    "NVIDIA GeForce RTX 3080 Ti",
    "NVIDIA GeForce RTX 3090",
    "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA GeForce RTX 4080",
    "NVIDIA GeForce RTX 4090",
    "NVIDIA GeForce RTX 5090",
    "NVIDIA TITAN RTX",
    "NVIDIA RTX A4000",
    "NVIDIA RTX A5000",
    "NVIDIA RTX A6000",
    "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA L4",
    "NVIDIA L40S",
    "NVIDIA A10",
    "NVIDIA A40",
    "NVIDIA A100-PCIE-40GB",
    "NVIDIA A100 80GB PCIe",
    "NVIDIA A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA H100 PCIe",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H200",
    "Tesla V100-SXM2-16GB",
    "Tesla V100-SXM2-32GB",
)
# What `init` or a copied example may leave where a model belongs.
_PLACEHOLDER = re.compile(r"\b(replace|todo|fixme|changeme|tbd|xxx+|your|example)\b", re.IGNORECASE)


def nvml_name_for(model: str) -> str | None:
    """The NVML name that `model` abbreviates (`RTX 3090` → `NVIDIA GeForce RTX 3090`), or None when it is
    one already, or matches none (a card this table does not know)."""
    if model in NVML_NAMES:
        return None
    wanted = model.strip().casefold()
    matches = [n for n in NVML_NAMES if n.casefold() == wanted or n.casefold().endswith(" " + wanted)]
    return matches[0] if len(matches) == 1 else None


def placeholder(model: str) -> bool:
    """Whether `model` is a placeholder (`REPLACE ME`, `TODO`) rather than a card's name."""
    return bool(_PLACEHOLDER.search(model))


def card_class(model: str) -> CardClass:
    """geforce (GeForce and TITAN), professional (Quadro, RTX A-series, RTX Ada, RTX PRO), or unknown."""
    if _PROFESSIONAL.search(model):
        return "professional"
    if _GEFORCE.search(model):
        return "geforce"
    return "unknown"


def missing_connector(model: str) -> str | None:
    """The family of a GeForce card known to have no NVLink/SLI connector, or None (it has one, or it is
    unknown)."""
    return _family(_NO_CONNECTOR, model)


def missing_nvlink(model: str) -> str | None:
    """The family of a professional or data-center card built without an NVLink connector, or None."""
    return _family(_NO_NVLINK, model)


def open_modules_only(model: str) -> str | None:
    """The architecture (Blackwell, Grace Hopper, Grace Blackwell) of a GPU that runs only the open kernel
    modules, or None."""
    return _family(_OPEN_ONLY, model)


def fabric_manager_elsewhere(model: str) -> bool:
    """Grace Blackwell compute trays (GB200, GB300 NVL72): their NVLinks end at the rack's switch trays, which
    run Fabric Manager; the tray itself runs none (it runs nvidia-imex for multi-node NVLink)."""
    return open_modules_only(model) == "Grace Blackwell"


def nvlink5_hgx(model: str) -> bool:
    """HGX B200/B300 baseboards: NVLink5 NVSwitches, which need NVLink Subnet Manager beside Fabric
    Manager."""
    return open_modules_only(model) == "Blackwell" and bool(re.search(r"\bB[123]00\b", model))


class BranchRange(NamedTuple):
    """The driver branches that drive one GPU generation (None: no bound on that side)."""

    generation: str
    first: int | None
    last: int | None
    first_version: str | None = None  # the first release of `first` that drives it, where not its first


# Which driver branches drive which GPU generation: the one table. NVIDIA's Unix graphics feature
# deprecation schedule (forums.developer.nvidia.com, "Unix graphics feature deprecation schedule"): 470 is
# the last branch for Kepler, 580 the last for Maxwell, Pascal and Volta. The Blackwell bounds are the
# supported-GPU table of each release's README in NVIDIA/open-gpu-kernel-modules (the modules Blackwell runs
# exclusively): "NVIDIA B200" (2901) and "NVIDIA GB200" (2941) are listed from 570.86.15, the first 570
# release, and in no 565 one; "NVIDIA B300 SXM6 AC" (3182 10DE 20E6) and "NVIDIA GB300" (31C2 10DE 21F1)
# from 580.82.07, in no 575 release nor in 580.65.06 or 580.76.05. A model the table does not know is never
# refused for it.
_BRANCHES: tuple[tuple[re.Pattern[str], BranchRange], ...] = (
    (re.compile(r"\bG?B300\b", re.IGNORECASE), BranchRange("Blackwell Ultra", 580, None, "580.82.07")),
    (re.compile(r"\bG?B200\b", re.IGNORECASE), BranchRange("Blackwell", 570, None)),
    (re.compile(r"\bK(10|20|40|80)\b|Tesla K\d+", re.IGNORECASE), BranchRange("Kepler", None, 470)),
    (
        re.compile(
            r"\b([MPV]100|P40|P4|P6|M60|M40|M10|M4|GV100|GP100|TITAN (V|Xp?))\b|GTX (9\d0|10\d0)",
            re.IGNORECASE,
        ),
        BranchRange("Maxwell, Pascal or Volta", None, 580),
    ),
)


def branch_range(model: str) -> BranchRange | None:
    """The branches that drive `model`'s generation, None for a model the table does not know."""
    return _family(_BRANCHES, model)


def module_type(flavor: str | None, model: str, branch: str) -> str:
    """open or proprietary: what a flavor installs, and for no flavor NVIDIA's default for the branch on
    this GPU (open from 560 on Turing and later)."""
    if flavor is None:
        return sources.runfile_module_type(None, model, branch)
    return "open" if flavor.endswith("open") else "proprietary"


def _family(table: tuple[tuple[re.Pattern[str], T], ...], model: str) -> T | None:
    return next((family for pattern, family in table if pattern.search(model)), None)
