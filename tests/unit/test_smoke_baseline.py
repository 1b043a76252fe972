"""Each box's own smoke baseline: written atomically by the `smoke-baseline` verb through the agent's door,
read back by the smoke verb (a corrupt file reported, never trusted), judged on the control side against
the rig's `baseline_drop`, and carried into the node check's metrics with its age."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_provision.jobs import smoke_baseline as control
from mgpu_provision.node.__main__ import handle
from mgpu_provision.node.verbs import check_metrics
from mgpu_provision.node.verbs import smoke_baseline as node
from mgpu_provision.protocol import smoke_baseline_request

KEY = "gpu-0,gpu-1 x2 gloo"


def write(state: Path, busbw: float, recorded_at: float = 1000.0) -> dict:
    entry = {"busbw_gbps": busbw, "recorded_at": recorded_at, "run_id": "run-1", "burn_in": None}
    request = smoke_baseline_request(str(state), KEY, entry, {"group": KEY, "busbw_gbps": busbw})
    reply, _ = handle("smoke-baseline", json.dumps({"args": request, "simulate": None}))
    assert reply["ok"], reply
    return reply["result"]


def test_the_verb_writes_the_record_and_the_smoke_verb_reads_it_back(tmp_path: Path) -> None:
    assert write(tmp_path, 12.5) == {"path": str(tmp_path / node.BASELINE_FILE), "replaced_corrupt": False}
    record, problem = node.read(str(tmp_path))
    assert problem is None and record is not None
    assert record["groups"][KEY]["busbw_gbps"] == 12.5 and record["node"]["busbw_gbps"] == 12.5
    assert list(tmp_path.iterdir()) == [tmp_path / node.BASELINE_FILE]  # no temporary file left
    assert node.read(str(tmp_path / "none")) == (None, None)


@pytest.mark.parametrize("content", ['{"format": 1, "groups": ', "[]", '{"format": 1, "groups": {"k": {}}}'])
def test_a_corrupt_baseline_is_reported_not_trusted_and_replaced_by_the_next_pass(
    tmp_path: Path, content: str
) -> None:
    (tmp_path / node.BASELINE_FILE).write_text(content)
    record, problem = node.read(str(tmp_path))
    assert record is None and problem is not None
    assert problem.startswith(f"{tmp_path / node.BASELINE_FILE} is corrupt (") and "not trusted" in problem
    assert write(tmp_path, 3.0)["replaced_corrupt"] is True
    assert node.read(str(tmp_path))[1] is None


def test_the_door_refuses_a_record_without_its_key(tmp_path: Path) -> None:
    request = {"state_dir": str(tmp_path), "record": {"entry": {}}}
    reply, _ = handle("smoke-baseline", json.dumps({"args": request, "simulate": None}))
    assert reply["error"]["kind"] == "bad-request" and "`record`" in reply["error"]["message"]


def answers(busbw: float, corrupt: str | None = None) -> dict:
    entry = {"busbw_gbps": busbw, "recorded_at": 1000.0, "run_id": "run-1"}
    return {
        "gpu-0": {"record": {"format": 1, "groups": {KEY: entry}}, "problem": None},
        "gpu-1": {"record": None, "problem": corrupt},
    }


def test_a_drop_of_more_than_the_rig_s_share_fails_with_old_and_new_figures() -> None:
    problem, compared, notices = control.judge(KEY, 7.0, answers(10.0), 0.2, 1000.0 + 2 * 86400)
    assert problem == (
        "all_reduce busbw 7 GB/s is 30% below this group's baseline of 10 GB/s (recorded 2.0 days ago by "
        "run run-1; the rig allows a drop of 20%)"
    )
    assert compared is not None and (compared["host"], compared["age_s"], notices) == ("gpu-0", 172800.0, [])
    assert control.judge(KEY, 8.5, answers(10.0), 0.2, 1000.0)[0] is None
    assert control.judge("other group", 1.0, answers(10.0), 0.2, 1000.0)[:2] == (None, None)
    _, _, said = control.judge(KEY, 9.0, answers(10.0, corrupt="/x is corrupt"), 0.2, 1000.0)
    assert said == ["gpu-1: smoke baseline /x is corrupt"]


def test_burn_in_spread() -> None:
    assert control.spread([9.0, 10.0, 11.0]) == {
        "runs": 3, "min_gbps": 9.0, "max_gbps": 11.0, "mean_gbps": 10.0, "spread": 0.2,
    }  # fmt: skip


def test_the_node_check_metrics_carry_the_last_busbw_and_its_age(tmp_path: Path) -> None:
    write(tmp_path, 12.5, recorded_at=1000.0)
    text = check_metrics.smoke_baseline(*node.read(str(tmp_path)), 1060.0)
    assert f'mgpu_provision_check_smoke_busbw_bytes_per_second{{group="{KEY}"}} 12500000000' in text
    assert f'mgpu_provision_check_smoke_age_seconds{{group="{KEY}"}} 60' in text
    assert "mgpu_provision_check_smoke_baseline_trusted 1" in text
    (tmp_path / node.BASELINE_FILE).write_text("{")
    text = check_metrics.smoke_baseline(*node.read(str(tmp_path)), 1060.0)
    assert "mgpu_provision_check_smoke_baseline_trusted 0" in text and "group=" not in text
