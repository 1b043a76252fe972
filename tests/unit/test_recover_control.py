"""recover's decision as data: which findings ask for a reset of which GPUs, which for a reboot, and that an
NVSwitch rig resets every GPU together (nvidia-smi(1) -r; Fabric Manager user guide, "GPU Reset")."""

from __future__ import annotations

from mgpu_provision.jobs.recover import decide
from mgpu_provision.judge.records import Finding


def xid(gpu: int | None, recovery: str | None, kind: str = "reset_gpu") -> Finding:
    return Finding("xid", f"GPU {gpu} logged an Xid", gpu=gpu, kind=kind, recovery=recovery)


def test_resets_are_per_gpu_and_warnings_without_recovery_ask_for_nothing() -> None:
    found = [xid(1, "reset"), xid(0, None, "noted"), Finding("throttle", "hot", gpu=0, kind="violation")]
    decision = decide(found, nvswitch=False)
    assert (decision.resets, decision.reboot, decision.together) == ((1,), False, False)
    assert decide(found[1:], nvswitch=False).needed is False


def test_a_reboot_finding_or_a_gpu_nvml_no_longer_lists_is_a_reboot() -> None:
    assert decide([xid(0, "reset"), xid(1, "reboot", "restart_bm")], nvswitch=False).reboot is True
    assert decide([xid(None, "reset")], nvswitch=False).reboot is True


def test_an_nvswitch_rig_resets_every_gpu_together() -> None:
    decision = decide([xid(3, "reset")], nvswitch=True)
    assert decision.together is True and decision.resets == (3,)
