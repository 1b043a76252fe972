"""What one reliability test tried (`Trial`, filled in through the `trial` fixture of
tests/reliability/conftest.py, which writes it for `tools/reliability_report.py`), and whether the long runs
are on (`MGPU_SLOW=1`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

SLOW = os.environ.get("MGPU_SLOW") == "1"


@dataclass
class Trial:
    """What one test tried; filled in by the test, read by the report."""

    area: str  # "fuzz", "injection", "fault", "trust"
    tried: str  # one line a person reads: the input or the fault
    figures: dict[str, Any] = field(default_factory=dict)  # examples run, hosts, payloads, seconds...
    expect: str = ""  # what "pass" means for this trial

    def count(self, key: str, amount: int = 1) -> None:
        self.figures[key] = self.figures.get(key, 0) + amount
