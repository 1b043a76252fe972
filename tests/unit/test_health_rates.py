"""Health counters as rates: the node keeps its previous sample in the state folder and the facts carry
each counter's change since it, with the interval; without one (first call, new boot) the totals over the
time since boot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mgpu_provision.facts import Facts
from mgpu_provision.node.verbs.health_rates import SAMPLE_FILE, change
from tests.support.factories import facts_from_twin, write_twin

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "topologies"
MONTHS_S = 270 * 86400


def twin_with(tmp_path: Path, link_errors: dict[str, int], **extra: Any) -> Path:
    text = (REFERENCE / "2x-rtx3090-nvlink-bridge.txt").read_text()
    twin = write_twin(tmp_path, text, 2, boot_id="boot-1", uptime_s=MONTHS_S, **extra)
    return _put(twin, {"nvlink_errors": [dict(link_errors, link=0)]})


def _put(twin: Path, health: dict[str, Any]) -> Path:
    data = json.loads(twin.read_text())
    data["gpus"][0]["health"] = health
    twin.write_text(json.dumps(data))
    return twin


def link0(facts: Facts) -> Any:
    assert facts.health is not None
    return facts.health.gpus[0].nvlink_errors[0]


def test_without_an_earlier_sample_the_totals_count_over_the_uptime(tmp_path: Path) -> None:
    facts = facts_from_twin(twin_with(tmp_path, {"crc": 120}))
    assert facts.health is not None
    assert (facts.health.counters_since, facts.health.counters_interval_s) == ("boot", MONTHS_S)
    assert link0(facts).change == {"crc": 120, "replay": 0, "recovery": 0}


def test_the_second_call_counts_the_change_since_the_first(tmp_path: Path) -> None:
    state = tmp_path / "state"
    twin = twin_with(tmp_path, {"crc": 120, "replay": 5})
    facts_from_twin(twin, state_dir=str(state))
    sample = json.loads((state / SAMPLE_FILE).read_text())
    assert sample["boot_id"] == "boot-1"
    sample["time"] -= 30  # as if the first call was half a minute ago
    (state / SAMPLE_FILE).write_text(json.dumps(sample))
    _put(twin, {"nvlink_errors": [{"link": 0, "crc": 120, "replay": 7}]})
    facts = facts_from_twin(twin, state_dir=str(state))
    assert facts.health is not None and facts.health.counters_since == "sample"
    assert facts.health.counters_interval_s is not None and 29 < facts.health.counters_interval_s < 60
    assert link0(facts).change == {"crc": 0, "replay": 2, "recovery": 0}


def test_a_sample_of_another_boot_is_not_compared(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    old = {"boot_id": "boot-0", "time": 0.0, "gpus": {}, "xid": 50}
    (state / SAMPLE_FILE).write_text(json.dumps(old))
    facts = facts_from_twin(twin_with(tmp_path, {"replay": 3}), state_dir=str(state))
    assert facts.health is not None and facts.health.counters_since == "boot"
    assert link0(facts).change["replay"] == 3 and facts.health.xid_change == 0


def test_a_counter_that_fell_was_reset_by_a_driver_reload() -> None:
    assert change({"crc": 500, "replay": 1}, {"crc": 20, "replay": 4, "recovery": 2}) == {
        "crc": 20,
        "replay": 3,
        "recovery": 2,
    }


def test_a_sample_younger_than_a_minute_stays_the_base_of_the_next_calls(tmp_path: Path) -> None:
    """Calls seconds apart judge one window of at least a minute (DCGM's per-minute limits), not a rate
    over two seconds; and they write nothing."""
    state = tmp_path / "state"
    twin = twin_with(tmp_path, {"crc": 120, "replay": 5})
    facts_from_twin(twin, state_dir=str(state))
    first = (state / SAMPLE_FILE).read_bytes()
    _put(twin, {"nvlink_errors": [{"link": 0, "crc": 120, "replay": 6}]})
    facts_from_twin(twin, state_dir=str(state))
    facts = facts_from_twin(twin, state_dir=str(state))
    assert (state / SAMPLE_FILE).read_bytes() == first
    assert link0(facts).change["replay"] == 1  # still against the first sample
    sample = json.loads(first)
    sample["time"] -= 61
    (state / SAMPLE_FILE).write_text(json.dumps(sample))
    facts_from_twin(twin, state_dir=str(state))
    assert json.loads((state / SAMPLE_FILE).read_text())["gpus"] != sample["gpus"]  # replaced once old
