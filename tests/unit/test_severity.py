"""Severities as data: each signal judged by the shipped judge gives the severity and the recovery its source
says, one case per severity and per Xid class, each naming where the verdict comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.judge import health, xids
from mgpu_provision.judge.records import Expectation
from mgpu_provision.judge.verdict import judge_each
from mgpu_provision.node.nvidia.backend import NVLINK_FIELDS
from mgpu_provision.node.verbs import check_metrics
from mgpu_provision.node.verbs.check import finding_lines
from mgpu_provision.plan.host import plan_host
from mgpu_provision.rig import load_rig
from tests.support.factories import example_twin, facts_from_twin, rtx3090_twin

PAIR = Expectation(gpu_model="NVIDIA GeForce RTX 3090", gpu_count=2, critical_xids=xids.CRITICAL)
B200 = Expectation(gpu_model="NVIDIA B200", gpu_count=8, bridge_kind="nvswitch", bridge_links=18)
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


# --- NVLink5 (Blackwell): DCGM 4.6 MonitorNVLink5Fields (modules/health/DcgmHealthWatch.cpp 2807-2943) ------


def packed(mantissa: int, exponent: int) -> int:
    """A BER field value as NVML packs it (nvml.h: mantissa shift 8, width 0xf; exponent shift 0, 0xff)."""
    return (mantissa << 8) | exponent


HEALTHY_EFFECTIVE, HEALTHY_SYMBOL = packed(15, 255), 73710  # NVML's zero; DCGM's test's Blackwell aggregate
BER_CASES = [
    # (effective BER, symbol BER, the kinds that fail, DCGM's own case in modules/health/tests/
    # DcgmHealthWatchTests.cpp "MonitorNVLink5Fields BER thresholds", or the rule it tests)
    (packed(9, 13), HEALTHY_SYMBOL, [], "effective BER below 1e-12 passes"),
    (packed(1, 12), HEALTHY_SYMBOL, [], "effective BER at 1e-12 passes"),
    (packed(2, 12), HEALTHY_SYMBOL, ["effective-ber"], "effective BER above 1e-12 fails"),
    (packed(10, 13), HEALTHY_SYMBOL, [], "effective BER at 10e-13 passes"),
    (packed(11, 13), HEALTHY_SYMBOL, ["effective-ber"], "effective BER at 11e-13 fails"),
    (packed(1, 11), HEALTHY_SYMBOL, ["effective-ber"], "an exponent under 12 fails (exponent < 12)"),
    (packed(15, 14), HEALTHY_SYMBOL, [], "an exponent over 13 passes whatever the mantissa"),
    (HEALTHY_EFFECTIVE, packed(1, 13), ["symbol-ber"], "non-zero symbol BER fails"),
    (HEALTHY_EFFECTIVE, HEALTHY_SYMBOL, [], "Blackwell aggregate symbol BER raw 73710 (15e-238) passes"),
    (HEALTHY_EFFECTIVE, packed(15, 237), ["symbol-ber"], "symbol BER worse than floor exponent fails"),
    (HEALTHY_EFFECTIVE, packed(1, 237), ["symbol-ber"], "any mantissa above the floor's exponent fails"),
    (HEALTHY_EFFECTIVE, packed(15, 239), [], "symbol BER below the floor passes"),
    (HEALTHY_EFFECTIVE, packed(0, 0), [], "raw zero symbol BER passes"),
    (HEALTHY_EFFECTIVE, packed(0, 5), [], "zero mantissa nonzero exponent symbol BER passes"),
    (packed(2, 12), packed(1, 13), ["effective-ber", "symbol-ber"], "both fail: two findings"),
]


@pytest.mark.parametrize("effective, symbol, failing, source", BER_CASES, ids=[c[3] for c in BER_CASES])
def test_nvlink5_ber_is_judged_as_dcgm_judges_it(
    effective: int, symbol: int, failing: list[str], source: str
) -> None:
    found = health.health(one_gpu(nvlink_ber={"effective": effective, "symbol": symbol}), PAIR)
    assert [(f.check, f.kind, f.severity) for f in found] == [
        ("nvlink-errors", kind, "fail") for kind in failing
    ], source


def test_a_ber_the_gpu_cannot_read_is_not_judged() -> None:
    assert health.health(one_gpu(nvlink_ber={"symbol": packed(15, 238)}), PAIR) == []
    assert health.health(one_gpu(nvlink_ber=None), PAIR) == []


# The NVML fields of MonitorNVLink5Fields' counters (its fieldIds, DcgmHealthWatch.cpp 2813-2826, mapped in
# dcgmlib/src/dcgm_fields.cpp) beyond the recovery and symbol ones judged before.
NVLINK5_COUNTERS = [name for field, name in NVLINK_FIELDS if field in (206, 207, 208, 209, 210, 211, 219)]


@pytest.mark.parametrize("counter", NVLINK5_COUNTERS)
@pytest.mark.parametrize("rise, fails", [(0, False), (1, True)])
def test_each_nvlink5_counter_fails_on_a_rise_in_the_window(counter: str, rise: int, fails: bool) -> None:
    assert len(NVLINK5_COUNTERS) == 7
    # DCGM_LIMIT_MAX_NVLINK_ERROR 1 (common/DcgmGPUHardwareLimits.h 28): a rise of 1 in the window fails.
    link = {"link": 4, "source": "fields", counter: 7 + rise, "change": {counter: rise}}
    found = health.health(one_gpu(nvlink_errors=[link]), PAIR)
    assert [(f.check, f.severity) for f in found] == ([("nvlink-errors", "fail")] if fails else [])
    if fails:
        assert f"link 4: {counter} +1" in found[0].message


def test_the_ber_of_a_blackwell_twin_fails_its_plan(tmp_path: Path) -> None:
    """Through the simulated NVIDIA layer: the twin's [mantissa, exponent] is packed as NVML packs it, the
    facts carry it, and plan shows the failed check; the healthy floor gives none."""
    twin = example_twin("hgx-b200")
    for gpu_twin in twin["gpus"]:
        gpu_twin["health"]["nvlink_ber"] = {"effective": [15, 255], "symbol": [15, 238]}
    twin["gpus"][3]["health"]["nvlink_ber"] = {"effective": [2, 12], "symbol": [15, 238]}
    path = tmp_path / "twin.json"
    path.write_text(json.dumps(twin))
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "version: 1\nhosts:\n  - {name: hgx, rig: b200, connection: local, simulate: twin.json}\n"
        "rigs:\n  b200:\n    gpus: {model: NVIDIA B200, count: 8}\n    bridge: {kind: nvswitch, links: 18}\n"
    )
    loaded = load_rig(rig)
    facts = facts_from_twin(path, state_dir=str(tmp_path / "state"))
    assert facts.health is not None
    assert facts.health.gpus[3].nvlink_ber == {"effective": packed(2, 12), "symbol": packed(15, 238)}
    changes = [c for c in plan_host(loaded, loaded.spec.hosts[0], facts) if c.resource == "nvlink-errors"]
    assert [(c.action, c.current, c.desired) for c in changes] == [
        ("verify-failed", "2e-12", "at most 1e-12")
    ]
    assert "GPU 3: NVLink effective BER (after FEC) is 2e-12" in changes[0].summary
    # The node check judges the same facts: a FAIL line, and the finding's reason as a metric label.
    judged = judge_each(facts.model_dump(), B200)
    findings = [f for _, found in judged for f in found]
    assert [line.split(":")[0] for line in finding_lines(findings)] == ["FAIL nvlink-errors"]
    prom = check_metrics.render("0", 2, 0.0, 1.0, judged, [], facts.model_dump())
    assert 'severity="fail",reason="nvlink-errors:effective-ber",gpu="3"' in prom
