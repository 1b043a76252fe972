"""The checks apply cannot fix, as failed checks of the plan: each is judged by the shipped judge.

GPU inventory and PCIe links (`judge/inventory.py`), the interconnect against the rig's bridge and captured
topology (`judge/topology.py`), GPU health and kernel readiness (`judge/health.py`). The same functions run
on a node that judges itself, so plan keeps only the translation of their findings into Changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...judge import health as judge_health
from ...judge import inventory
from ...judge import topology as judge_topology
from ..change import Change, HostContext, failed_checks

if TYPE_CHECKING:
    from ...judge.verdict import Judge

Diff = Callable[[HostContext], list[Change]]


def _failed(judge: Judge) -> Diff:
    def diff(ctx: HostContext) -> list[Change]:
        return failed_checks(judge(ctx.facts_json, ctx.expect))

    diff.__name__ = judge.__name__
    return diff


gpus = _failed(inventory.inventory)
topology = _failed(judge_topology.topology)
pcie = _failed(inventory.pcie)
health = _failed(judge_health.health)
kernel = _failed(judge_health.kernel)
