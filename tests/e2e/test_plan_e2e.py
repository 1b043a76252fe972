"""`mgpu-provision plan` end to end: real sshd test hosts, the real agent, each box drifted in its own way.

Four hosts of one rig type each carry one fault (an old driver, a missing env file, a loose bridge link, a
mismatched GPU) and must report exactly that fault; a fifth, converged host reports nothing and exits 0.
The env files of the hosts that should have them are written from the plan's desired files
(`tests.hosts.desired_files_on`) into the host's private /etc, so the test does not depend on apply.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision.cli import main
from mgpu_provision.plan.files import DesiredFile
from tests.support.hosts import HostFactory, TestHost, desired_files_on, load_twin

RIG = {
    "pair": {
        "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
        "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
        "driver": {"version": "550.54.15", "reboot": "never"},
    }
}
# Per host: how its twin differs from the healthy 2x RTX 3090, and which env files it lacks.
DRIFT: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "old-driver": ({"driver": {"version": "535.161.08", "loaded": "535.161.08", "cuda": "12.2"}}, ()),
    "no-env": ({}, ("/etc/mgpu-provision/environment",)),
    "loose-link": ({"nvlink_down": [{"gpu": 1, "link": 2}]}, ()),
    "odd-gpu": ({"gpus": 1}, ()),
    "converged": ({}, ()),
}
EXPECTED = {
    "old-driver": [
        ("driver", "update", "driver 535.161.08 → 550.54.15"),
        ("reboot", "manual", "reboot required to load driver 550.54.15 (policy: never)"),
    ],
    "no-env": [("file:/etc/mgpu-provision/environment", "create", "new file, ")],
    # One loose link is down at both of its ends.
    "loose-link": [
        (
            "topology",
            "verify-failed",
            "GPU 0 link 2 and GPU 1 link 2 are inactive: a loose bridge? "
            "(GPU 0 and GPU 1 share 3 of 4 NVLinks)",
        )
    ],
    "odd-gpu": [
        (
            "gpus",
            "verify-failed",
            "GPU 1 is an NVIDIA GeForce RTX 2080, the others are NVIDIA GeForce RTX 3090",
        )
    ],
    "converged": [],
}


def twin_for(name: str) -> dict[str, Any]:
    twin: dict[str, Any] = yaml.safe_load(load_twin("rtx3090-nvlink"))
    changes, _ = DRIFT[name]
    for key, value in changes.items():
        if key == "gpus":
            odd = {"name": "NVIDIA GeForce RTX 2080", "memory_mib": 8192}
            twin["gpus"][value] = {**twin["gpus"][value], **odd}
        else:
            twin[key] = copy.deepcopy(value)
    return twin


def write_env_files(host: TestHost, wanted_files: list[DesiredFile], skip: tuple[str, ...]) -> None:
    for wanted in wanted_files:
        if wanted.path in skip:
            continue
        host.run_in_ns(f"mkdir -p $(dirname {wanted.path})")
        write = f"cat > {wanted.path} <<'MGPU_EOF'\n{wanted.content}MGPU_EOF\n"
        host.run_in_ns(f"{write}chmod {wanted.mode} {wanted.path}")


@pytest.fixture
def fleet(test_hosts: HostFactory, tmp_path: Path) -> tuple[list[TestHost], Path]:
    hosts = [test_hosts.start(name, twin_for(name), rig="pair") for name in DRIFT]
    # No smoke python: no torch probe (the hosts' private /root hides the pyenv python that has torch).
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", hosts, rigs=RIG)
    wanted = desired_files_on(rig, test_hosts.known_hosts)
    for host in hosts:
        write_env_files(host, wanted[host.name], DRIFT[host.name][1])
    return hosts, rig


def plan_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["plan", *argv])
    return code, capsys.readouterr().out


def test_each_drifted_host_reports_exactly_its_fault(
    fleet: tuple[list[TestHost], Path], test_hosts: HostFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    _, rig = fleet
    code, out = plan_cli(capsys, str(rig), "--known-hosts", str(test_hosts.known_hosts), "--json")
    assert code == 2, out
    doc = json.loads(out)
    for name, expected in EXPECTED.items():
        entry = doc["hosts"][name]
        assert entry["status"] == "ok", entry
        got = [(c["resource"], c["action"], c["summary"]) for c in entry["changes"]]
        assert [(r, a) for r, a, _ in got] == [(r, a) for r, a, _ in expected], (name, got)
        for (_, _, summary), (_, _, wanted) in zip(got, expected, strict=True):
            assert wanted in summary, (name, summary)
    assert doc["totals"] == {
        "to_change": 2,
        "checks_failed": 2,
        "warnings": 0,
        "manual": 1,
        "hosts_with_changes": 4,
        "hosts": 5,
        "unreachable": 0,
        "failed": 0,
    }


def test_human_plan_and_a_converged_host(
    fleet: tuple[list[TestHost], Path], test_hosts: HostFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    _, rig = fleet
    known = str(test_hosts.known_hosts)
    code, out = plan_cli(capsys, str(rig), "--known-hosts", known, "--limit", "no-env,converged", "--diff")
    assert code == 2
    assert "  + file:/etc/mgpu-provision/environment: new file, " in out
    assert "+CUDA_DEVICE_ORDER=PCI_BUS_ID" in out  # --diff: the new file's content
    assert "no changes on 1 host: converged" in out
    assert out.rstrip().splitlines()[-1] == "Plan: 1 to change, on 1 of 2 hosts"

    code, out = plan_cli(capsys, str(rig), "--known-hosts", known, "--limit", "converged")
    assert code == 0, out
    assert out.rstrip().splitlines()[-1] == "No changes. 1 host matches the rig file."


def test_unreachable_host_is_in_the_plan_and_the_exit_code(
    fleet: tuple[list[TestHost], Path],
    test_hosts: HostFactory,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    hosts, _ = fleet
    converged = [h for h in hosts if h.name == "converged"]
    dead = {"name": "dead", "address": test_hosts.dead_address(), "rig": "pair"}
    rig = test_hosts.write_rig(tmp_path / "with-dead.yaml", converged, rigs=RIG, extra_hosts=[dead])
    code, out = plan_cli(capsys, str(rig), "--known-hosts", str(test_hosts.known_hosts))
    assert code == 2
    assert "dead: unreachable: " in out
    assert out.rstrip().splitlines()[-1] == "Plan: 0 to change, on 0 of 2 hosts (1 unreachable)"
