"""The data-driven plan cases (tests/unit/plan_cases/*.yaml): where they are and how one is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CASES_DIR = Path(__file__).resolve().parents[1] / "unit" / "plan_cases"
CASES = sorted(CASES_DIR.glob("*.yaml"))

def load_case(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = yaml.safe_load(path.read_text())
    return case
