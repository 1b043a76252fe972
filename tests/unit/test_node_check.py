"""`mgpu-provision-check` as Slurm and the timer run it: a fresh stdlib Python (`-S -I`), the agent on its
path, a twin for the NVIDIA layer. Exit codes, one line per finding, the JSON, the deadline kept while NVML
hangs, the lock, and every kind of bad input as a plain message with exit 1 (never a traceback, never a
half-written .prom file)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.node.verbs import check
from tests.support.factories import rtx3090_twin
from tests.support.hosts import skip_or_fail
from tests.support.node_check_helpers import PAIR, Node


@pytest.fixture
def node(tmp_path: Path) -> Node:
    if os.geteuid() != 0:
        skip_or_fail("the node check runs as root", "the node check tests need root")
    return Node(tmp_path)


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr + result.stdout


def test_a_healthy_node_exits_0_with_one_line_and_a_metrics_file(node: Node) -> None:
    result = node.run()
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("OK: ") and result.stdout.count("\n") == 1
    text = node.prom.read_text()
    assert "mgpu_provision_check_up 1\n" in text
    assert 'mgpu_provision_check_passed{check="inventory"} 1\n' in text
    assert 'mgpu_provision_check_driver_info{installed="550.54.15",loaded="550.54.15",nvml="ok"} 1' in text


def test_a_lost_gpu_exits_2_with_each_finding_on_a_line_and_the_same_in_json(node: Node) -> None:
    twin = rtx3090_twin()
    twin["gpus"][1]["health"] = {"lost": True}
    node.set_twin(twin)
    result = node.run()
    assert result.returncode == 2, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("FAIL ") for line in lines)
    report = json.loads(node.run("--json").stdout)
    assert report["status"] == "failed" and report["exit_code"] == 2
    assert [f"FAIL {f['check']}: {f['summary']}" for f in report["findings"]] == lines
    assert any(f["gpu"] == 1 for f in report["findings"])
    # The lost GPU's own series is a 0 under its index and bus id; the healthy one's a 1 with its UUID.
    text = node.prom.read_text()
    assert (
        'mgpu_provision_check_gpu_passed{check="inventory",gpu="1",UUID="",pci_bus_id="00000000:21:00.0"} 0'
        in text
    )
    assert 'check="inventory",gpu="0",UUID="GPU-' in text


def test_a_drifted_managed_file_is_drift_said_on_a_line_and_exits_0(node: Node) -> None:
    # An edited env file is apply's to put back, never a reason to drain the node (issue 38).
    managed = node.root / "environment"
    managed.write_text("export A=1\n")
    node.expect(PAIR._replace(files={str(managed): "0" * 64}))
    result = node.run()
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith(f"DRIFT file:{managed}: {managed} is not what apply wrote")
    text = node.prom.read_text()
    assert "mgpu_provision_check_drifted_resources 1\n" in text
    assert 'mgpu_provision_check_findings_by_severity{severity="drift"} 1\n' in text
    assert 'mgpu_provision_check_findings_by_severity{severity="fail"} 0\n' in text
    assert json.loads(node.run("--json").stdout)["findings"][0]["severity"] == "drift"


def test_a_thermal_violation_and_a_next_boot_kernel_warn_and_exit_0(node: Node) -> None:
    # DCGM's MonitorThermal warns on thermal violation time; a next boot's kernel without the module is a
    # risk on a box that works now. Neither fails (exit 0), both are said, with severity in the metrics.
    twin = rtx3090_twin()
    twin["gpus"][1]["health"] = {"violation_ms": {"thermal": 2500}}
    twin["kernel"] = {
        "running": "6.8.0-45-generic",
        "installed": ["6.8.0-45-generic", "6.8.0-47-generic"],
        "nvidia_module_for": ["6.8.0-45-generic"],
    }
    node.set_twin(twin)
    node.run()  # the first sample: violation time is judged over a window, never since boot
    twin["gpus"][1]["health"] = {"violation_ms": {"thermal": 5000}}
    node.set_twin(twin)
    result = node.run("--deadline", "20")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["WARN throttle", "WARN kernel"], lines
    text = node.prom.read_text()
    assert 'mgpu_provision_check_findings_by_severity{severity="warn"} 2\n' in text
    assert 'check="throttle",severity="warn",reason="throttle:violation",gpu="1"' in text
    assert 'mgpu_provision_check_passed{check="health"} 1\n' in text
    report = json.loads(node.run("--json").stdout)
    assert report["status"] == "warning" and report["exit_code"] == 0


def test_a_hanging_nvml_call_ends_within_the_deadline_with_a_finding(node: Node) -> None:
    twin = rtx3090_twin()
    twin["gpus"][0]["nvml_hang_s"] = 600
    node.set_twin(twin)
    began = time.monotonic()
    result = node.run("--deadline", "6")
    took = time.monotonic() - began
    assert took < 6.5, took
    assert result.returncode == 2, result.stderr
    assert result.stdout.startswith("FAIL nvml: the node's facts did not come within")
    assert 'mgpu_provision_check_passed{check="nvml"} 0' in node.prom.read_text()


def test_a_second_run_waits_for_the_first_and_gives_up_with_exit_1(node: Node) -> None:
    node.lock.parent.mkdir()
    with open(node.lock, "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        result = node.run("--deadline", "8")
    assert result.returncode == 1
    assert "another node check is running" in result.stderr
    no_traceback(result)


@pytest.mark.parametrize(
    ("prepare", "args", "words"),
    [
        (lambda n: n.expectations.unlink(), (), "is missing: run `mgpu-provision apply`"),
        (lambda n: n.expectations.write_text('{"version": 1, "gpu_model": '), (), "is not JSON"),
        (lambda n: n.expectations.write_text('{"version": 7}'), (), "not an expectation of version 1"),
        (lambda n: n.expectations.write_text('{"version": 1, "gpu_count": 2}'), (), "malformed expectation"),
        (lambda n: None, ("--deadline", "1"), "--deadline 1 is too short: at least 5 s"),
        (lambda n: None, ("--deadline", "soon"), "invalid float value"),
        (lambda n: None, ("--no-such-option",), "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_plain_line_and_exit_1(
    node: Node, prepare: Any, args: tuple[str, ...], words: str
) -> None:
    prepare(node)
    result = node.run(*args)
    assert result.returncode == 1, result.stdout
    assert result.stdout == ""
    assert result.stderr.startswith("mgpu-provision-check: cannot check: ") and words in result.stderr
    assert result.stderr.count("\n") == 1
    no_traceback(result)


def test_could_not_check_is_up_0_in_the_metrics_file(node: Node) -> None:
    node.expectations.unlink()
    assert node.run().returncode == 1
    text = node.prom.read_text()
    assert "mgpu_provision_check_up 0\n" in text and "mgpu_provision_check_exit_code 1\n" in text
    assert "mgpu_provision_check_passed" not in text


def test_a_textfile_folder_that_is_not_writable_is_exit_1_and_no_file_is_left(node: Node) -> None:
    node.prom.write_text("mgpu_provision_check_up 1\n")  # from an earlier run: it must stay whole
    # Root writes through file modes: a read-only bind mount in a mount namespace of this run only.
    wrap = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind -o ro "{node.textfile}" "{node.textfile}" && exec "$@"', "sh")  # fmt: skip
    result = node.run(wrap=wrap)
    assert result.returncode == 1
    assert f"the textfile folder {node.textfile} is not writable" in result.stderr
    no_traceback(result)
    assert os.listdir(node.textfile) == [check.PROM_FILE]
    assert node.prom.read_text() == "mgpu_provision_check_up 1\n"


def test_a_missing_textfile_folder_is_exit_1(node: Node) -> None:
    node.textfile.rmdir()
    result = node.run()
    assert result.returncode == 1 and "does not exist" in result.stderr
    assert not node.textfile.exists()  # it changes nothing: no folder made


def test_files_of_an_older_version_are_removed_and_no_temporary_file_stays(node: Node) -> None:
    (node.textfile / "mgpu-provision-check-v0.prom").write_text("mgpu_provision_check_up 1\n")
    (node.textfile / "other.prom").write_text("other_metric 1\n")
    assert node.run().returncode == 0
    assert sorted(os.listdir(node.textfile)) == [check.PROM_FILE, "other.prom"]


def test_without_a_textfile_folder_nothing_is_written(node: Node) -> None:
    assert node.run(textfile=False).returncode == 0
    assert os.listdir(node.textfile) == []


def test_a_user_other_than_root_is_told_so_with_exit_1(node: Node) -> None:
    """On a real node (a simulated one reads its twin, which needs no root: a rehearsal runs as a user)."""
    nobody = ("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups")
    result = node.run(wrap=nobody, simulated=False)
    assert result.returncode == 1
    assert (
        result.stderr
        == "mgpu-provision-check: cannot check: must run as root (it reads every GPU and the managed files)\n"
    )
    assert not node.prom.exists()


def test_the_node_check_reads_the_cdi_specs_it_judges(node: Node) -> None:
    """The check's own facts child asks for the containers facts the expectation's judge needs: a box
    without the spec fails on the spec, not on facts it never asked for."""
    node.set_twin(rtx3090_twin(containers={"toolkit": "1.17.8"}))
    spec = "/etc/cdi/mgpu-provision-test-absent.yaml"  # read only: no test writes the machine's /etc/cdi
    node.expect(PAIR._replace(containers=True, toolkit_version="1.17.8", cdi_spec=spec))
    result = node.run()
    assert result.returncode == 2, result.stderr
    assert f"FAIL cdi: no CDI spec at {spec} for nvidia.com/gpu" in result.stdout.splitlines()
