"""DCGM's diag as a gate of the node check, end to end: `apply` over real SSH installs the check with the
rig's `health.dcgm_diag`, and the installed command, run over SSH on each test host, runs the `dcgmi` it
finds on the box's PATH. dcgmi is part of the simulated NVIDIA layer: a stand-in in the box's own
/usr/local/bin prints a composed DCGM 4 reply (tests/fixtures/dcgm/README.md) or hangs; a box without one
has no DCGM. A failing diag exits 2 and names the GPU, a hanging one is ended at its budget with a warning,
a box without DCGM says the diag was skipped and stays healthy.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from mgpu_provision import cli
from tests.support.dcgm import ARGV, FIXTURES, dcgmi_on_host
from tests.support.factories import rtx3090_twin
from tests.support.hosts import HostFactory, over_ssh

FIXTURE = FIXTURES / "dcgm4-r2-pcie-fail-thermal-monitor.json"
COMMAND = "/usr/local/bin/mgpu-provision-check"
BUDGET_S, DEADLINE_S = 10, 20
PAIR = {
    "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
    "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
    "driver": {"version": "550.54.15", "reboot": "never"},
    "health": {"dcgm_diag": {"level": 2, "budget_s": BUDGET_S}},
}


def test_the_installed_check_runs_the_boxs_dcgmi_within_its_budget(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failing, hanging, without = (
        test_hosts.start(n, rtx3090_twin(), rig="pair") for n in ("diag", "hung", "bare")
    )
    hosts = [failing, hanging, without]
    rig = test_hosts.write_rig(
        tmp_path / "rig.yaml", hosts, rigs={"pair": PAIR}, node_check={"deadline_s": DEADLINE_S}
    )
    capsys.readouterr()
    code = cli.main(["apply", str(rig), "--known-hosts", str(test_hosts.known_hosts), "--yes", "--json"])
    assert code == 0, capsys.readouterr().out
    folder = dcgmi_on_host(failing, f"cat {FIXTURE}")
    dcgmi_on_host(hanging, "exec sleep 117.5")  # a length no other process on this machine sleeps

    result = over_ssh(test_hosts, failing, f"{COMMAND} --json")
    report = json.loads(result.stdout)
    assert (result.returncode, report["status"]) == (2, "failed"), result.stderr
    assert [(f["check"], f["severity"], f["gpu"]) for f in report["findings"]] == [
        ("dcgm-diag", "fail", 0),
        ("dcgm-diag", "warn", 1),
    ]
    assert "Detected 112 PCIe replay errors for GPU 0" in report["findings"][0]["message"]
    assert (folder / ARGV).read_text() == "diag -r 2 -j\n"
    lines = over_ssh(test_hosts, failing, COMMAND).stdout.splitlines()
    assert lines[0].startswith("FAIL dcgm-diag: GPU 0: DCGM diag Integration test pcie: fail")
    assert lines[1].startswith("WARN dcgm-diag: GPU 1: DCGM diag Hardware test memory: fail")

    began = time.monotonic()
    result = over_ssh(test_hosts, hanging, COMMAND)
    took = time.monotonic() - began
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(
        f"WARN dcgm-diag: dcgmi diag -r 2 did not finish within its budget of {BUDGET_S} s"
    )
    assert BUDGET_S <= took < BUDGET_S + DEADLINE_S, took
    assert subprocess.run(["pgrep", "-fx", "sleep 117.5"], check=False).returncode == 1  # it was ended

    result = over_ssh(test_hosts, without, COMMAND)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "NOTE dcgm-diag: DCGM is not installed (no dcgmi on PATH), diag skipped",
        "OK: bare is healthy and as the rig says",
    ]
