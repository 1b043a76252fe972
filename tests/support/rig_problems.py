"""What loading a broken rig file reports: the problems `load_rig` raises, for the rule and loader tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.errors import SpecError, SpecProblem
from mgpu_provision.rig import load_rig


def problems_of(tmp_path: Path, text: str) -> list[SpecProblem]:
    path = tmp_path / "rig.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_rig(path)
    return info.value.problems
