"""Rolling rollout arithmetic for apply: `--serial N|N%` batches and the `--max-fail-percent` stop rule.

A fleet that trains around the clock is changed a few boxes at a time, so a bad driver or env file stops at
the first batch instead of taking down every node. These are pure decisions; `apply.py` runs them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..errors import ProvisionError

T = TypeVar("T")
_SERIAL = re.compile(r"^(\d{1,6})(%?)$")


class RolloutError(ProvisionError):
    """--serial or --max-fail-percent is not a valid value."""


@dataclass(frozen=True)
class Serial:
    """Batch size: a count of hosts, or a percentage of the selected hosts (rounded up, at least 1)."""

    value: int
    percent: bool

    def size(self, hosts: int) -> int:
        if self.percent:
            return max(1, math.ceil(hosts * self.value / 100))
        return self.value


def parse_serial(text: str) -> Serial:
    match = _SERIAL.match(text.strip())
    if match is None:
        raise RolloutError(f"--serial {text!r}: give a number of hosts (e.g. 2) or a percentage (e.g. 25%)")
    value, percent = int(match.group(1)), bool(match.group(2))
    if value < 1 or (percent and value > 100):
        raise RolloutError(f"--serial {text!r}: must be at least 1 and a percentage at most 100%")
    return Serial(value, percent)


def parse_max_fail_percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise RolloutError(f"--max-fail-percent {text!r}: give a percentage from 0 to 100")
    return value


def batches(items: Sequence[T], serial: Serial | None) -> list[list[T]]:
    """`items` cut into consecutive batches, in order; one batch holding everything without --serial."""
    if not items:
        return []
    size = len(items) if serial is None else serial.size(len(items))
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def too_many_failed(failed: int, batch_size: int, max_fail_percent: float | None) -> bool:
    """Ansible's rule: stop the later batches when this batch's failed share exceeds the limit (0: any)."""
    if max_fail_percent is None or batch_size == 0:
        return False
    return failed * 100 / batch_size > max_fail_percent
