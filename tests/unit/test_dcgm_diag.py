"""DCGM's diag as a gate of the node check: dcgmi's JSON (DCGM 3 and 4 shapes, validated against DCGM's own
schemas) judged per test and GPU, a diag that times out or prints no report said plainly, no dcgmi a note;
the node check runs a stand-in dcgmi from PATH within the rig's budget (tests/fixtures/dcgm/README.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mgpu_provision.errors import ProvisionError
from mgpu_provision.judge import dcgm
from mgpu_provision.judge.records import expectation_from_json
from mgpu_provision.node.verbs.dcgm_diag import run_diag
from mgpu_provision.plan.host import host_context
from mgpu_provision.plan.resources import node_check
from mgpu_provision.rig import load_rig
from tests.support.dcgm import ARGV, FIXTURES, stand_in_dcgmi
from tests.support.factories import facts
from tests.support.node_check_helpers import PAIR, Node

REPLIES = {
    "dcgm4-r1-pass.json": "dcgm4-diag-schema.json",
    "dcgm4-r2-pcie-fail-thermal-monitor.json": "dcgm4-diag-schema.json",
    "dcgm4-runtime-error.json": "dcgm4-diag-schema.json",
    "dcgm3-r2-pcie-fail-retired-page.json": "dcgm3-diag-schema.json",
}


def outcome(reply: str, level: int = 2, **more: Any) -> dict[str, Any]:
    """What run_diag reports for a dcgmi that printed `reply` and exited."""
    return {"level": level, "budget_s": 120.0, "installed": True, "timed_out": False, "exit_code": 0,
            "stdout": reply, "stderr": "", **more}  # fmt: skip


def judged(name: str) -> list[tuple[int | None, str, str, bool]]:
    """(GPU, severity, the test, whether the advice passes on DCGM's "drain and reset") of each finding."""
    findings, notes = dcgm.judge_diag(outcome((FIXTURES / name).read_text()))
    assert notes == [] and all(f.recovery is None for f in findings)
    return [
        (f.gpu, f.severity, f.message.split(":")[1].strip(), "reset the GPU" in str(f.advice))
        for f in findings
    ]


@pytest.mark.parametrize("reply", sorted(REPLIES))
def test_each_composed_reply_follows_dcgms_schema_for_its_version(reply: str) -> None:
    schema = json.loads((FIXTURES / REPLIES[reply]).read_text())
    # DCGM 3's names draft-04; DCGM 4's names the unversioned "http://json-schema.org/schema#" (the latest).
    drafts = {"http://json-schema.org/draft-04/schema#": jsonschema.Draft4Validator}
    validator = drafts.get(schema["$schema"], jsonschema.Draft202012Validator)
    validator.check_schema(schema)
    validator(schema).validate(json.loads((FIXTURES / reply).read_text()))


def test_a_passing_level_1_diag_is_no_finding() -> None:
    assert judged("dcgm4-r1-pass.json") == []
    logged = (
        "Warning: a line logged before the report\n" + (FIXTURES / "dcgm4-r1-pass.json").read_text() + "\n\n"
    )
    assert dcgm.judge_diag(outcome(logged)) == ([], [])


def test_dcgm4_a_fail_fails_and_a_fail_of_monitor_severity_warns_a_skip_is_nothing() -> None:
    assert judged("dcgm4-r2-pcie-fail-thermal-monitor.json") == [
        (0, "fail", "DCGM diag Integration test pcie", False),
        (1, "warn", "DCGM diag Hardware test memory", False),
    ]
    findings, _ = dcgm.judge_diag(outcome((FIXTURES / "dcgm4-r2-pcie-fail-thermal-monitor.json").read_text()))
    assert "Detected 112 PCIe replay errors for GPU 0" in findings[0].message
    assert "test memory: fail, DCGM severity MONITOR (Temperature 93 of GPU 1" in findings[1].message
    assert findings[0].reason == "dcgm-diag" and findings[1].reason == "dcgm-diag:warn"


def test_dcgm3_deployment_and_per_gpu_results_name_their_gpu_and_reset_severity_is_in_the_advice() -> None:
    assert judged("dcgm3-r2-pcie-fail-retired-page.json") == [
        (1, "fail", "DCGM diag Deployment test Page Retirement/Row Remap", True),
        (0, "fail", "DCGM diag Integration test PCIe", False),
    ]


def test_a_warn_status_warns_and_a_summary_alone_is_judged_once() -> None:
    # "Warn" where a printer shows it (DCGM_DIAG_RESULT_WARN with DDR_DISPLAY_WARN); a DCGM 4 test whose
    # error is of no entity has only its test_summary.
    reply = {"DCGM Diagnostic": {"test_categories": [{"category": "Stress", "tests": [
        {"name": "targeted_power", "results": [
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 3, "status": "Warn"}],
         "test_summary": {"status": "Fail"}},
        {"name": "pulse_test", "results": [], "test_summary": {"status": "Fail", "warnings": [
            {"warning": "the plugin crashed", "error_id": 1, "error_category": 1, "error_severity": 2}]}},
    ]}]}}  # fmt: skip
    findings, _ = dcgm.judge_diag(outcome(json.dumps(reply)))
    assert [(f.gpu, f.severity) for f in findings] == [(3, "warn"), (None, "fail")]
    assert findings[1].message == "the node: DCGM diag Stress test pulse_test: fail (the plugin crashed)"


NO_VERDICT = [
    # (what the node reported, the kind, words the message must hold)
    (outcome("", timed_out=True, stdout=None), "timeout", "did not finish within its budget of 120 s"),
    (
        outcome("Error: unable to establish a connection to the specified host: localhost\n", exit_code=255),
        "unreadable",
        "printed no diag report (exit 255): Error: unable to establish a connection",
    ),
    (outcome("[]"), "unreadable", "printed no diag report"),
    (outcome('{"something": "else"}'), "unreadable", "printed no diag report"),
    (
        outcome((FIXTURES / "dcgm4-runtime-error.json").read_text()),
        "error",
        "could not run: Error: Unable to complete diagnostic for group 2147483647",
    ),
]


@pytest.mark.parametrize(
    "report, kind, words", NO_VERDICT, ids=[c[1] + str(i) for i, c in enumerate(NO_VERDICT)]
)
def test_a_diag_without_a_verdict_is_one_warning_that_says_why(
    report: dict[str, Any], kind: str, words: str
) -> None:
    findings, notes = dcgm.judge_diag(report)
    assert [(f.check, f.kind, f.severity) for f in findings] == [("dcgm-diag", kind, "warn")]
    assert words in findings[0].message and notes == []


def test_without_dcgmi_the_diag_is_a_note_not_a_finding() -> None:
    assert dcgm.judge_diag({"level": 1, "budget_s": 60.0, "installed": False}) == (
        [],
        ["dcgm-diag: DCGM is not installed (no dcgmi on PATH), diag skipped"],
    )


def test_run_diag_runs_dcgmi_from_path_and_a_slow_one_is_cut_at_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = stand_in_dcgmi(tmp_path / "bin", f"cat {FIXTURES / 'dcgm4-r1-pass.json'}")
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    done = run_diag(1, 30.0)
    assert (done["installed"], done["timed_out"], done["exit_code"]) == (True, False, 0)
    assert (folder / ARGV).read_text() == "diag -r 1 -j\n"
    assert dcgm.judge_diag(done) == ([], [])
    (folder / "dcgmi").write_text("#!/nonexistent/interpreter\n")  # found on PATH, cannot start
    findings, _ = dcgm.judge_diag(run_diag(1, 30.0))
    assert [(f.kind, f.severity) for f in findings] == [("unreadable", "warn")]
    assert "No such file or directory" in findings[0].message
    stand_in_dcgmi(folder, "sleep 30 & sleep 30")  # a child holding its output open is ended with it
    started = time.monotonic()
    done = run_diag(2, 1.0)
    assert done["timed_out"] and time.monotonic() - started < 5


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_the_node_check_runs_the_rigs_diag_and_exits_2_on_its_failure(node: Node, tmp_path: Path) -> None:
    folder = stand_in_dcgmi(tmp_path / "bin", f"cat {FIXTURES / 'dcgm4-r2-pcie-fail-thermal-monitor.json'}")
    node.expect(PAIR._replace(dcgm_diag_level=2, dcgm_diag_budget_s=30.0))
    result = node.run("--json", path_prepend=str(folder))
    report = json.loads(result.stdout)
    assert (result.returncode, report["status"], report["notes"]) == (2, "failed", [])
    assert [(f["check"], f["severity"], f["gpu"]) for f in report["findings"]] == [
        ("dcgm-diag", "fail", 0),
        ("dcgm-diag", "warn", 1),
    ]
    assert (folder / ARGV).read_text() == "diag -r 2 -j\n"
    assert 'mgpu_provision_check_passed{check="dcgm_diag"} 0\n' in node.prom.read_text()
    # Slurm's health script leaves it out (slurmd's 60 s), as does a rig without health.dcgm_diag.
    (folder / ARGV).unlink()
    assert node.run("--no-dcgm-diag", path_prepend=str(folder)).returncode == 0
    node.expect(PAIR)
    assert node.run(path_prepend=str(folder)).returncode == 0
    assert not (folder / ARGV).exists()


def test_the_node_check_without_dcgm_notes_it_and_a_slow_diag_is_a_warning(
    node: Node, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"  # a PATH without this machine's own dcgmi, if it has one
    bare.mkdir()
    node.expect(PAIR._replace(dcgm_diag_level=1, dcgm_diag_budget_s=10.0))
    result = node.run(path=str(bare))
    assert (result.returncode, result.stderr) == (0, "")
    assert (
        result.stdout.splitlines()[0]
        == "NOTE dcgm-diag: DCGM is not installed (no dcgmi on PATH), diag skipped"
    )
    assert result.stdout.splitlines()[1].startswith("OK: ")
    assert 'check="dcgm_diag"' not in node.prom.read_text()  # a skipped diag is no diag that passed
    folder = stand_in_dcgmi(tmp_path / "bin", "exec sleep 60")
    started = time.monotonic()
    result = node.run(path_prepend=str(folder))
    assert result.returncode == 0 and time.monotonic() - started < 30
    assert result.stdout.startswith(
        "WARN dcgm-diag: dcgmi diag -r 1 did not finish within its budget of 10 s"
    )


RIG = (
    "version: 1\nhosts: [{name: gpu-a, address: 10.0.0.11, rig: pair}]\nnode_check: {deadline_s: 40}\n"
    'rigs:\n  pair:\n    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}\n    health: {dcgm_diag: DIAG}\n'
)


def test_the_rigs_diag_reaches_the_expectations_and_the_timer_waits_for_its_budget(tmp_path: Path) -> None:
    (tmp_path / "rig.yaml").write_text(RIG.replace("DIAG", "{level: 2, budget_s: 300}"))
    loaded = load_rig(tmp_path / "rig.yaml")
    host = loaded.host("gpu-a")
    wanted = {Path(f.path).name: f.content for f in node_check.desired(host_context(loaded, host, facts()))}
    expect = expectation_from_json(json.loads(wanted["expectation.json"]))
    assert (expect.dcgm_diag_level, expect.dcgm_diag_budget_s) == (2, 300.0)
    # systemd ends the run only after the facts' deadline, the diag's budget and the grace.
    assert "TimeoutStartSec=355\n" in wanted["mgpu-provision-check.service"]


@pytest.mark.parametrize(
    "diag, words",
    [
        ("{level: 3}", "rigs.pair.health.dcgm_diag.level"),
        ("{budget_s: 5}", "rigs.pair.health.dcgm_diag.budget_s"),
    ],
)
def test_a_bad_diag_setting_is_a_plain_error_naming_the_field(tmp_path: Path, diag: str, words: str) -> None:
    (tmp_path / "rig.yaml").write_text(RIG.replace("DIAG", diag))
    with pytest.raises(ProvisionError) as raised:
        load_rig(tmp_path / "rig.yaml")
    assert words in str(raised.value) and "rig.yaml:7" in str(raised.value)
