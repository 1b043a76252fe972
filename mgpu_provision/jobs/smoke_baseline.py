"""Each box's own smoke baseline on the control side: judge a run against it, and record a passing one.

The figures live on the nodes (`node/verbs/smoke_baseline.py`, the state folder); every node's smoke answer
carries its record. A group is keyed by its members, processes per node and backend, so a figure is only
ever compared with one measured the same way. `judge` is pure: the newest trusted entry of the group among
its nodes' records, and a problem when the plateau busbw fell by more than the rig's `baseline_drop`; a
corrupt record is a notice naming the node and file, never a figure. `record` writes a passing group's
figures (with a burn-in's spread) to every node of it.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..fleet.options import FleetOptions
from ..fleet.pool import HostOutcome, run_fleet
from ..fleet.replies import BaselineReply
from ..fleet.session import AgentSession, read_reply
from ..fleet.targets import HostTarget
from ..protocol import smoke_baseline_request

RECORD_TIMEOUT_S = 60.0


def group_key(members: Sequence[str], nproc_per_node: int, backend: str | None) -> str:
    return f"{','.join(members)} x{nproc_per_node} {backend or '-'}"


def newest_entry(
    key: str, answers: Mapping[str, dict[str, Any] | None]
) -> tuple[tuple[str, dict[str, Any]] | None, list[str]]:
    """((host, entry) of the newest trusted entry for `key`, or None; the notices of corrupt records)."""
    found: tuple[str, dict[str, Any]] | None = None
    notices = []
    for host, answer in answers.items():
        answer = answer or {}
        if answer.get("problem"):
            notices.append(f"{host}: smoke baseline {answer['problem']}")
            continue
        entry = ((answer.get("record") or {}).get("groups") or {}).get(key)
        if entry is not None and (found is None or entry["recorded_at"] > found[1]["recorded_at"]):
            found = (host, entry)
    return found, notices


def judge(
    key: str,
    busbw_gbps: float | None,
    answers: Mapping[str, dict[str, Any] | None],
    drop: float,
    now_s: float,
) -> tuple[str | None, dict[str, Any] | None, list[str]]:
    """Pure: (a problem when busbw fell by more than `drop` below the baseline, the figure it was compared
    with, notices)."""
    found, notices = newest_entry(key, answers)
    if found is None or busbw_gbps is None:
        return None, None, notices
    host, entry = found
    old = float(entry["busbw_gbps"])
    compared = {
        "host": host,
        "busbw_gbps": old,
        "recorded_at": entry["recorded_at"],
        "age_s": round(max(0.0, now_s - float(entry["recorded_at"])), 1),
        "run_id": entry.get("run_id"),
        "drop": round(1 - busbw_gbps / old, 4) if old > 0 else None,
    }
    if old > 0 and busbw_gbps < old * (1 - drop):
        days = compared["age_s"] / 86400
        return (
            f"all_reduce busbw {busbw_gbps:g} GB/s is {compared['drop']:.0%} below this group's baseline of "
            f"{old:g} GB/s (recorded {days:.1f} days ago by run {entry.get('run_id')}; the rig allows a drop "
            f"of {drop:.0%})",
            compared,
            notices,
        )
    return None, compared, notices


def spread(figures: Sequence[float]) -> dict[str, Any]:
    """A burn-in's figures: how many, the lowest, highest and mean, and (highest-lowest)/mean."""
    mean = statistics.fmean(figures)
    return {
        "runs": len(figures),
        "min_gbps": min(figures),
        "max_gbps": max(figures),
        "mean_gbps": round(mean, 4),
        "spread": round((max(figures) - min(figures)) / mean, 4) if mean > 0 else None,
    }


def entry_of(busbw_gbps: float, run_id: str, burn_in: dict[str, Any] | None) -> dict[str, Any]:
    return {"busbw_gbps": busbw_gbps, "recorded_at": time.time(), "run_id": run_id, "burn_in": burn_in}


def record(
    targets: Sequence[HostTarget],
    state_dirs: Mapping[str, str],
    key: str,
    entry: dict[str, Any],
    per_node: Mapping[str, dict[str, Any]],
    options: FleetOptions,
) -> dict[str, HostOutcome[BaselineReply]]:
    """Write the group's entry, and each node's own figures, into every node's baseline at once."""

    def call(session: AgentSession) -> BaselineReply:
        name = session.target.name
        request = smoke_baseline_request(state_dirs[name], key, entry, dict(per_node.get(name) or {}))
        return read_reply(session, "smoke-baseline", request, BaselineReply, RECORD_TIMEOUT_S)

    chosen = [t for t in targets if t.name in state_dirs]
    return run_fleet(chosen, call, dataclasses.replace(options, forks=max(1, len(chosen))))
