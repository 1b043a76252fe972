"""Severities as data: each signal judged by the shipped judge gives the severity and the recovery its source
says, one case per severity and per Xid class, each naming where the verdict comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.judge import health, xids
from mgpu_provision.judge.records import Expectation
from tests.support.factories import facts_from_twin, rtx3090_twin

PAIR = Expectation(gpu_model="NVIDIA GeForce RTX 3090", gpu_count=2, critical_xids=xids.CRITICAL)
WINDOW = {"counters_since": "sample", "counters_interval_s": 60.0}


def gpu(**values: Any) -> dict[str, Any]:
    return {"index": 0, "nvlink_errors": [], **values}


def one_gpu(**values: Any) -> dict[str, Any]:
    return {"health": {"gpus": [gpu(**values)], **WINDOW}}


def xid_log(code: int) -> dict[str, Any]:
    return {"health": {"xid": [{"gpu": 0, "pci_bus_id": "00000000:01:00", "code": code}]}}


def kernel(**values: Any) -> dict[str, Any]:
    found = {"running": "6.8.0-45-generic", "installed": ["6.8.0-45-generic"], "nvidia_module_for": []}
    return {"driver": {"installed": "550.54.15"}, "health": {"kernel": {**found, **values}}}


CASES = [
    # (facts, check, severity, recovery, the source of the verdict)
    (xid_log(79), "xid", "fail", "reboot", "Xid catalog: 79 RESTART_BM; DCGM BuildXidMappings: FAIL"),
    (xid_log(48), "xid", "fail", "reset", "Xid catalog: 48 WORKFLOW_XID_48; DCGM: FAIL"),
    (xid_log(95), "xid", "fail", "reset", "Xid catalog: 95 RESET_GPU; DCGM: FAIL"),
    (xid_log(46), "xid", "fail", "reset", "Xid catalog: 46 RESET_GPU (missed before issue 38)"),
    (xid_log(109), "xid", "fail", "reset", "Xid catalog: 109 RESET_GPU"),
    (xid_log(110), "xid", "fail", "reset", "Xid catalog: 110 RESET_GPU"),
    (xid_log(136), "xid", "fail", "reset", "Xid catalog: 136 RESET_GPU"),
    (xid_log(156), "xid", "fail", "reset", "Xid catalog: 156 RESET_GPU"),
    (xid_log(94), "xid", "warn", None, "Xid catalog: 94 RESTART_APP; DCGM BuildXidMappings: WARN"),
    (xid_log(63), "xid", "warn", None, "Xid catalog: 63 IGNORE; DCGM memory watch: WARN"),
    (xid_log(92), "xid", "warn", None, "Xid catalog: 92 IGNORE"),
    (xid_log(154), "xid", "warn", None, "Xid catalog: 154 informational"),
    (
        one_gpu(recovery_action="gpu_reset"),
        "recovery-action",
        "fail",
        "reset",
        "DCGM MonitorGpuRecoveryAction",
    ),
    (
        one_gpu(recovery_action="node_reboot"),
        "recovery-action",
        "fail",
        "reboot",
        "DCGM MonitorGpuRecoveryAction",
    ),
    (one_gpu(recovery_action="drain_p2p"), "recovery-action", "warn", None, "DCGM: DRAIN_P2P WARN"),
    (one_gpu(retired_pages_pending=True), "memory-repair", "warn", "reset", "DCGM MonitorMemRetiredPending"),
    (
        one_gpu(remapped_rows_uncorrectable=512),
        "memory-repair",
        "warn",
        None,
        "DCGM MonitorMemRowRemapUncorrectable: WARN",
    ),
    (one_gpu(remapped_rows_failure=True), "memory-repair", "fail", None, "DCGM MonitorMemRowRemapFailures"),
    (one_gpu(retired_pages=63), "memory-repair", "fail", None, "DCGM MonitorMemSbeDbeRetiredPages"),
    (one_gpu(memory_unrepairable=True), "memory-repair", "fail", None, "DCGM MonitorMemUnrepairableFlag"),
    (one_gpu(ecc_volatile_uncorrectable=2), "ecc", "fail", "reset", "DCGM MonitorMemVolatileDbes: FAIL"),
    (
        one_gpu(change={"violation_thermal_ms": 2500}),
        "throttle",
        "warn",
        None,
        "DCGM MonitorThermal: WARN",
    ),
    (one_gpu(throttle=["hw_slowdown"]), "throttle", "warn", None, "azurehpc azure_gpu_clock_throttling.nhc"),
    (kernel(nvidia_module_for=[]), "kernel", "fail", None, "the running kernel has no module: no GPU now"),
    (
        kernel(installed=["6.8.0-45-generic", "6.8.0-47-generic"], nvidia_module_for=["6.8.0-45-generic"]),
        "kernel",
        "warn",
        None,
        "a next boot's kernel without the module: a risk on a box that works now",
    ),
]


@pytest.mark.parametrize("facts, check, severity, recovery, source", CASES, ids=[c[4] for c in CASES])
def test_each_signal_has_the_severity_and_recovery_its_source_gives(
    facts: dict[str, Any], check: str, severity: str, recovery: str | None, source: str
) -> None:
    found = health.health(facts, PAIR) + health.kernel(facts, PAIR)
    assert [(f.check, f.severity, f.recovery) for f in found] == [(check, severity, recovery)], source


def test_the_default_critical_list_is_the_catalogs_resets_and_reboots() -> None:
    # docs.nvidia.com/deploy/xid-errors (gpud catalog_generated.go): 63 and 92 IGNORE, 94 RESTART_APP, 154
    # informational are no failures; 46, 109, 110, 136, 156 RESET_GPU are.
    assert not {63, 92, 94, 154} & set(xids.CRITICAL)
    assert {46, 48, 74, 79, 95, 109, 110, 119, 120, 136, 140, 156} <= set(xids.CRITICAL)
    assert set(xids.NOTED) == {63, 92, 94, 154}


def test_an_xid_a_reset_cleared_is_not_judged_again() -> None:
    facts = xid_log(94)
    facts["health"]["xid"][0]["cleared"] = True
    facts["health"]["xid"].append({"gpu": 0, "pci_bus_id": "00000000:01:00", "code": 79, "cleared": True})
    assert health.health(facts, PAIR) == []


def test_the_link_a_failed_recovery_took_down_is_still_read_and_fails(tmp_path: Path) -> None:
    # Before issue 38 only active links were read: the link a failed NVLink5 recovery took down was never
    # counted. DCGM MonitorNVLink5Fields fails NVLINK_RECOVERY_FAILED_TOTAL > 0, whatever its window.
    twin = rtx3090_twin(nvlink_down=[{"gpu": 0, "link": 2}])
    twin["gpus"][0]["health"] = {
        "nvlink_error_api": "fields",
        "nvlink_errors": [{"link": 2, "recovery_failed": 1}],
    }
    path = tmp_path / "twin.json"
    path.write_text(json.dumps(twin))
    facts = facts_from_twin(path).model_dump()
    found = [f for f in health.health(facts, PAIR) if f.check == "nvlink-errors"]
    assert [(f.gpu, f.kind, f.severity, f.recovery) for f in found] == [
        (0, "recovery-failed", "fail", "reset")
    ]
    assert "link 2: 1 failed link recovery" in found[0].message


def test_the_unrepairable_memory_flag_is_read_from_the_twin_and_fails(tmp_path: Path) -> None:
    twin = rtx3090_twin()
    twin["gpus"][1]["health"] = {"memory_unrepairable": True}
    path = tmp_path / "twin.json"
    path.write_text(json.dumps(twin))
    facts = facts_from_twin(path).model_dump()
    found = health.health(facts, PAIR)
    assert [(f.check, f.gpu, f.severity) for f in found] == [("memory-repair", 1, "fail")]
    assert "cannot repair" in found[0].message
