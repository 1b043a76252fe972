"""`mgpu-provision smoke` end to end: real sshd test hosts, the real agent, real torchrun on loopback (Gloo).

Each test host has its own 127.x address; the rendezvous master is the first host's address, and Gloo runs
on `lo`. Hosts share this machine's process table, so "no process of the smoke remains" is checked here with
a /proc scan for the run's marker. A test host's /root is private, which hides this venv's interpreter
(it links into /root/.pyenv); the nodes run the system python3 (the same 3.11) with the venv's
site-packages on PYTHONPATH, passed through the rig file's `env` as any site-specific setting would be.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision.cli import main
from tests.support.hosts import HostFactory
from tests.support.smoke_helpers import (
    FAIL_TIMEOUT_S,
    PASS_TIMEOUT_S,
    apply_env_files,
    listening,
    processes_of_run,
    site_packages,
    smoke_rig,
    start_hosts,
)


def smoke(
    capsys: pytest.CaptureFixture[str], factory: HostFactory, rig: Path, *more: str
) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["smoke", str(rig), "--json", "--known-hosts", str(factory.known_hosts), *more])
    return code, json.loads(capsys.readouterr().out)


LAUNCHER = "/usr/local/bin/mgpu-torchrun"
PROFILE = "/etc/profile.d/mgpu-provision.sh"


@pytest.mark.parametrize("count", [2, 3])
def test_hosts_of_two_processes_each_pass_with_per_rank_results(
    count: int, test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = start_hosts(test_hosts, count)
    # The rig's NCCL on test hosts, whose GPUs are a twin's: Gloo runs, and the report says so.
    rig = smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, PASS_TIMEOUT_S, site_packages(), "nccl")
    apply_env_files(test_hosts, rig)
    code, report = smoke(capsys, test_hosts, rig)
    group = report["groups"][0]
    assert code == 0, group["problems"]
    assert (group["backend"], group["requested_backend"]) == ("gloo", "nccl")
    assert [(d["rank"], d["host"], d["device"], d["simulated"]) for d in group["devices"]] == [
        (rank, f"gpu-{rank // 2}", "cpu", True) for rank in range(2 * count)
    ]
    assert report["notices"] == [] and {n["launcher"] for n in group["nodes"]} == {LAUNCHER}
    assert (group["world_size"], group["ranks_joined"], group["nnodes"]) == (2 * count, 2 * count, count)
    for node_rank, node in enumerate(group["nodes"]):
        assert node["host"] == f"gpu-{node_rank}" and node["ok"] is True
        assert [r["rank"] for r in node["ranks"]] == [2 * node_rank, 2 * node_rank + 1]
        for rank in node["ranks"]:
            assert rank["hostname"] == node["host"]  # it ran inside that host's UTS namespace, over SSH
            assert rank["world_size"] == 2 * count and all(c["ok"] for c in rank["checks"])
    assert [b["size_mib"] for b in group["bandwidth"]] == [0.0625, 0.25]
    assert processes_of_run(report["run_id"]) == []


def test_torch_found_through_path_prepend_and_a_hostile_value_pass_through_launcher_and_agent(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch is on PYTHONPATH only through path_prepend: the agent's torch probe (node/envpath) and the ranks
    # (the launcher sourcing the profile under `set -eu`, PYTHONPATH unset) both find it, or smoke fails.
    hosts = start_hosts(test_hosts, 1)
    rig = smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, PASS_TIMEOUT_S)
    document = yaml.safe_load(rig.read_text())
    document["path_prepend"] = {"PYTHONPATH": [site_packages()]}
    document["env"]["NOTE"] = f"$(touch {tmp_path}/canary) `touch {tmp_path}/canary` \"\n'\\"
    rig.write_text(yaml.safe_dump(document))
    apply_env_files(test_hosts, rig)
    code, report = smoke(capsys, test_hosts, rig)
    assert code == 0, report["groups"][0]["problems"]
    assert report["groups"][0]["nodes"][0]["launcher"] == LAUNCHER
    assert not (tmp_path / "canary").exists()


def test_node_that_never_starts_fails_the_others_in_time_and_leaves_no_process(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpu-1's sshd is gone, so its part never starts: gpu-0 (master) and gpu-2 are stopped for it at once
    (before, they waited for it until the rendezvous timeout), with nothing of the run left on any host and
    the port free again."""
    hosts = start_hosts(test_hosts, 3)
    rig = smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, FAIL_TIMEOUT_S, site_packages())
    apply_env_files(test_hosts, rig)
    hosts[1].kill()
    started = time.monotonic()
    code, report = smoke(capsys, test_hosts, rig)
    elapsed = time.monotonic() - started
    group = report["groups"][0]
    assert code == 2
    assert elapsed < FAIL_TIMEOUT_S * 0.25  # within the rendezvous timeout the peers waited before
    nodes = {n["host"]: n for n in group["nodes"]}
    assert nodes["gpu-1"]["kind"] == "unreachable"
    endpoint = group["endpoint"]
    for peer in ("gpu-0", "gpu-2"):
        assert (nodes[peer]["kind"], nodes[peer]["diagnosis"]) == ("stopped", "stopped after gpu-1 failed")
    assert group["problems"][0].startswith("gpu-1: ")
    assert processes_of_run(report["run_id"]) == []
    assert not listening(int(endpoint.rsplit(":", 1)[1]))


def test_node_without_torch_is_named_with_its_interpreter(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = start_hosts(test_hosts, 2)
    rig = smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, FAIL_TIMEOUT_S)
    apply_env_files(test_hosts, rig)
    code, report = smoke(capsys, test_hosts, rig)
    assert code == 2
    problems = report["groups"][0]["problems"]
    assert "gpu-0: torch is not installed in /usr/bin/python3 on gpu-0" in problems
    assert "gpu-1: torch is not installed in /usr/bin/python3 on gpu-1" in problems


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (
            f"sed -i 's/^node_rank=1$/node_rank=0/' {LAUNCHER}",
            f"launcher {LAUNCHER} is stale: run apply (line 10 is `node_rank=0`, the rig file renders "
            "`node_rank=1`)",
        ),
        (f"chmod 0644 {LAUNCHER}", f"launcher {LAUNCHER} is not executable (mode 0644): run apply"),
        (f"rm {PROFILE}", f"env file {PROFILE} is missing: run apply"),
        (
            f"sed -i 's/^export OMP_NUM_THREADS=1$/export OMP_NUM_THREADS=8/' {PROFILE}",
            f"env file {PROFILE} is stale: run apply (line ",
        ),
    ],
)
def test_a_node_whose_launcher_or_env_file_was_changed_after_apply_fails_with_the_reason(
    tamper: str, reason: str, test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpu-1 refuses before any rank starts, naming the file and line; gpu-0's run is stopped for it."""
    hosts = start_hosts(test_hosts, 2)
    rig = smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, FAIL_TIMEOUT_S, site_packages())
    apply_env_files(test_hosts, rig)
    hosts[1].run_in_ns(tamper)
    code, report = smoke(capsys, test_hosts, rig)
    assert code == 2
    nodes = {n["host"]: n for n in report["groups"][0]["nodes"]}
    assert nodes["gpu-1"]["kind"] == "not-applied" and nodes["gpu-1"]["ranks"] == []
    assert nodes["gpu-1"]["diagnosis"].startswith(reason), nodes["gpu-1"]["diagnosis"]
    assert (nodes["gpu-0"]["kind"], nodes["gpu-0"]["diagnosis"]) == ("stopped", "stopped after gpu-1 failed")
    assert processes_of_run(report["run_id"]) == []


def test_limit_to_part_of_a_ddp_group_is_refused(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = start_hosts(test_hosts, 2)
    rig = smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, FAIL_TIMEOUT_S)
    capsys.readouterr()
    assert main(["smoke", str(rig), "--limit", "gpu-1", "--known-hosts", str(test_hosts.known_hosts)]) == 1
    assert (
        "smoke runs whole DDP groups: the launchers of gpu-0, gpu-1 were written for 2 nodes, but gpu-0 is "
        "not selected; add it to --limit" in " ".join(capsys.readouterr().err.split())
    )
