"""Smoke names the bad node, and judges each box against its own baseline: real sshd test hosts, the real
agent, real torchrun and torch.distributed (Gloo) across real processes on loopback.

Four test hosts of one rank each form a DDP group. A failure drill (`MGPU_SMOKE_FAIL_HOST`: every rank on
that host fails at once) and a slow-node drill (`MGPU_SMOKE_SLOW_HOST`: that host's ranks wait before each
timed all_reduce, so every run it joins is slower) make one host bad; the report must name that host and
only it, with the evidence, in at most ceil(log2 4) + 1 = 3 rounds. The baseline a passing run records on
each node's state folder must survive a reboot of a test host (the agent's simulated reboot: its boot id
changes, its files stay), and a corrupt one must be reported, not trusted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.cli import main
from mgpu_provision.node.__main__ import handle
from tests.support.hosts import HostFactory, TestHost
from tests.support.smoke_helpers import (
    FAIL_TIMEOUT_S,
    apply_env_files,
    processes_of_run,
    site_packages,
    smoke_rig,
    start_hosts,
)

BASELINE = "/var/lib/mgpu-provision/smoke-baseline.json"
MAX_ROUNDS = 3  # ceil(log2 4) + 1


def smoke(capsys: pytest.CaptureFixture[str], factory: HostFactory, rig: Path, *more: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["smoke", str(rig), "--json", "--known-hosts", str(factory.known_hosts), *more])
    return code, json.loads(capsys.readouterr().out)


def drill_rig(factory: HostFactory, tmp_path: Path, hosts: list[TestHost], **drills: str) -> Path:
    rig = smoke_rig(
        factory,
        tmp_path / "rig.yaml",
        hosts,
        FAIL_TIMEOUT_S,
        site_packages(),
        nproc_per_node=1,
        drills=drills,
    )
    apply_env_files(factory, rig)
    return rig


def baseline_on(host: TestHost) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(host.run_in_ns(f"cat {BASELINE}").stdout)
    return loaded


def test_a_failing_node_is_named_by_bisection_and_only_it(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = start_hosts(test_hosts, 4)
    rig = drill_rig(test_hosts, tmp_path, hosts, MGPU_SMOKE_FAIL_HOST="gpu-2")
    code, report = smoke(capsys, test_hosts, rig)
    group = report["groups"][0]
    assert code == 2
    isolation = group["isolation"]
    assert isolation["mode"] == "bisect" and isolation["culprits"] == ["gpu-2"], isolation
    assert "every rank of this host fails on purpose" in isolation["evidence"]["gpu-2"]
    assert len(isolation["rounds"]) <= MAX_ROUNDS
    assert isolation["rounds"][0] == [
        {**isolation["rounds"][0][0], "nodes": ["gpu-0", "gpu-1"], "ok": True, "why": None},
        {**isolation["rounds"][0][1], "nodes": ["gpu-2", "gpu-3"], "ok": False},
    ]
    assert group["problems"][-1].startswith("bad node: gpu-2 with gpu-")
    assert processes_of_run(report["run_id"]) == []
    assert hosts[0].run_in_ns(f"test -e {BASELINE}", check=False).returncode == 1  # a failed group: none


def test_a_slow_node_fails_against_the_boxes_own_baseline_and_is_named(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = start_hosts(test_hosts, 4)
    rig = drill_rig(test_hosts, tmp_path, hosts)
    code, report = smoke(capsys, test_hosts, rig, "--burn-in", "1s")  # at least two runs
    group = report["groups"][0]
    assert code == 0, group["problems"]
    key = "gpu-0,gpu-1,gpu-2,gpu-3 x1 gloo"
    recorded = baseline_on(hosts[2])["groups"][key]
    figure = max(b["busbw_gbps"] for b in group["bandwidth"][-2:])
    assert recorded["busbw_gbps"] == figure and recorded["run_id"] == report["run_id"]
    assert recorded["burn_in"] == group["burn_in"] and group["burn_in"]["runs"] == 2
    assert group["burn_in"]["min_gbps"] <= figure <= group["burn_in"]["max_gbps"]
    assert baseline_on(hosts[0])["node"] == {"group": key, "busbw_gbps": figure, "pair_busbw_gbps": None}

    # gpu-1 reboots; its baseline is on disk in the state folder and is what the next run reads.
    reply, _ = handle("reboot", json.dumps({"args": {}, "simulate": str(hosts[1].twin_path)}))
    assert reply["ok"], reply
    hosts[3].run_in_ns(f'echo \'{{"format": 1, "groups": \' > {BASELINE}')  # torn by hand: not trusted

    rig = drill_rig(test_hosts, tmp_path, hosts, MGPU_SMOKE_SLOW_HOST="gpu-1:0.05")
    code, report = smoke(capsys, test_hosts, rig)
    group = report["groups"][0]
    assert code == 2
    corrupt = [n for n in report["notices"] if n.startswith(f"gpu-3: smoke baseline {BASELINE} is corrupt")]
    assert len(corrupt) == 1 and "not trusted" in corrupt[0], report["notices"]
    drop = next(p for p in group["problems"] if "below this group's baseline" in p)
    assert f"below this group's baseline of {figure:g} GB/s" in drop
    assert group["baseline"]["busbw_gbps"] == figure
    isolation = group["isolation"]
    assert isolation["culprits"] == ["gpu-1"], isolation
    assert len(isolation["rounds"]) <= MAX_ROUNDS
    assert "GB/s against" in isolation["evidence"]["gpu-1"]
    assert processes_of_run(report["run_id"]) == []
    assert baseline_on(hosts[0])["groups"][key]["busbw_gbps"] == figure  # a failed run records nothing

    code, report = smoke(capsys, test_hosts, rig, "--pairs")
    isolation = report["groups"][0]["isolation"]
    assert code == 2 and isolation["mode"] == "pairs" and isolation["culprits"] == ["gpu-1"], isolation
    assert [t["nodes"] for t in isolation["rounds"][0]] == [["gpu-0", "gpu-1"], ["gpu-2", "gpu-3"]]
