"""apply --drain slurm's decisions: when a node is DRAINED (not DRAINING), whose drain it is, and the recap of
a drained host read without the drain its own rollout set."""

from __future__ import annotations

import pytest

from mgpu_provision.jobs.apply import finish, without_check
from mgpu_provision.jobs.drain import is_drained, is_ours
from mgpu_provision.plan.change import check_failed
from mgpu_provision.plan.resources.slurm import APPLY_DRAIN


@pytest.mark.parametrize(
    ("state", "drained"),
    [
        ("IDLE+DRAIN", True),
        ("DOWN+DRAIN+NOT_RESPONDING", True),
        ("MIXED+DRAIN", False),  # DRAINING: a job still runs
        ("ALLOCATED+DRAIN", False),
        ("IDLE+COMPLETING+DRAIN", False),  # the last job's epilog is still running
        ("IDLE", False),
        ("DRAINED", False),  # not scontrol's spelling (that is sinfo's); never taken for a drained node
    ],
)
def test_a_node_is_drained_only_with_the_drain_flag_and_no_job_left(state: str, drained: bool) -> None:
    assert is_drained({"State": state}) is drained


def test_only_a_drain_with_applys_reason_is_its_own() -> None:
    assert is_ours({"State": "IDLE+DRAIN", "Reason": "mgpu: apply [root@2026-12-01T10:54:43]"})
    assert not is_ours({"State": "IDLE+DRAIN", "Reason": "mgpu: xid: GPU 1 logged Xid 79"})
    assert not is_ours({"State": "IDLE+DRAIN", "Reason": "disk swap [root@2026-12-01T10:54:43]"})
    assert not is_ours({"State": "IDLE", "Reason": "mgpu: apply"})  # resumed already


def test_the_recap_without_the_drain_check_converges_but_keeps_a_failed_steps_error() -> None:
    drain = check_failed(APPLY_DRAIN, "node is IDLE+DRAIN by apply --drain slurm")
    other = check_failed("topology", "GPU 0 and 1 are not joined by NVLink")
    drained = finish("na", [drain], ["file: written"])
    assert drained.status == "failed"
    assert without_check(drained, APPLY_DRAIN).status == "changed"
    assert without_check(finish("na", [drain, other], []), APPLY_DRAIN).error == "1 check failed: topology"
    step = finish("na", [drain], [], error="step 1 (file /etc/x) failed: read-only")
    assert without_check(step, APPLY_DRAIN).error == "step 1 (file /etc/x) failed: read-only"
