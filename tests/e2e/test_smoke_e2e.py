"""`mgpu-provision smoke` end to end: real sshd test hosts, the real agent, real torchrun on loopback (Gloo).

Each test host has its own 127.x address; the rendezvous master is the first host's address, and Gloo runs
on `lo`. Hosts share this machine's process table, so "no process of the smoke remains" is checked here with
a /proc scan for the run's marker. A test host's /root is private, which hides this venv's interpreter
(it links into /root/.pyenv); the nodes run the system python3 (the same 3.11) with the venv's
site-packages on PYTHONPATH, passed through the rig file's `env` as any site-specific setting would be.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.cli import main
from tests.hosts import NODE_PYTHON, HostFactory, TestHost, load_twin
from tests.smoke_helpers import FAIL_TIMEOUT_S, PASS_TIMEOUT_S, free_port, listening, processes_of_run


def site_packages() -> str:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    return str(Path(spec.origin).parents[1])


def smoke_rig(
    factory: HostFactory, path: Path, hosts: list[TestHost], timeout_s: float, torch_path: str | None = None
) -> Path:
    env = {"OMP_NUM_THREADS": "1", **({"PYTHONPATH": torch_path} if torch_path else {})}
    ddp = {
        "master": hosts[0].name,
        "port": free_port(),
        "backend": "gloo",
        "nproc_per_node": 2,
        "ifname": "lo",
    }
    return factory.write_rig(
        path,
        hosts,
        rigs={"pair": {"gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2}, "ddp": ddp}},
        env=env,
        smoke={"python": NODE_PYTHON, "timeout_s": timeout_s, "batch_size": 4, "sizes_mib": [0.0625, 0.25]},
    )


def smoke(capsys: pytest.CaptureFixture[str], factory: HostFactory, rig: Path) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["smoke", str(rig), "--json", "--known-hosts", str(factory.known_hosts)])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("count", [2, 3])
def test_hosts_of_two_processes_each_pass_with_per_rank_results(
    count: int, test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twin = load_twin("rtx3090-nvlink")
    hosts = [test_hosts.start(f"gpu-{i}", twin, rig="pair") for i in range(count)]
    code, report = smoke(
        capsys,
        test_hosts,
        smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, PASS_TIMEOUT_S, site_packages()),
    )
    group = report["groups"][0]
    assert code == 0, group["problems"]
    assert (group["world_size"], group["ranks_joined"], group["nnodes"]) == (2 * count, 2 * count, count)
    for node_rank, node in enumerate(group["nodes"]):
        assert node["host"] == f"gpu-{node_rank}" and node["ok"] is True
        assert [r["rank"] for r in node["ranks"]] == [2 * node_rank, 2 * node_rank + 1]
        for rank in node["ranks"]:
            assert rank["hostname"] == node["host"]  # it ran inside that host's UTS namespace, over SSH
            assert rank["world_size"] == 2 * count and all(c["ok"] for c in rank["checks"])
    assert [b["size_mib"] for b in group["bandwidth"]] == [0.0625, 0.25]
    assert processes_of_run(report["run_id"]) == []


def test_node_that_never_starts_fails_the_others_in_time_and_leaves_no_process(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpu-1's sshd is gone, so its part never starts: gpu-0 (master) and gpu-2 must end within the timeout,
    saying who they waited for, with nothing of the run left on any host and the port free again."""
    twin = load_twin("rtx3090-nvlink")
    hosts = [test_hosts.start(f"gpu-{i}", twin, rig="pair") for i in range(3)]
    rig = smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, FAIL_TIMEOUT_S, site_packages())
    hosts[1].kill()
    started = time.monotonic()
    code, report = smoke(capsys, test_hosts, rig)
    elapsed = time.monotonic() - started
    group = report["groups"][0]
    assert code == 2
    assert elapsed < FAIL_TIMEOUT_S + 20  # the node deadline, plus SSH and the kill grace
    nodes = {n["host"]: n for n in group["nodes"]}
    assert nodes["gpu-1"]["kind"] == "unreachable"
    endpoint = group["endpoint"]
    assert nodes["gpu-0"]["kind"] == "rendezvous-timeout"
    assert f"timed out waiting for peers at {endpoint}: 2 of 3 nodes joined" in nodes["gpu-0"]["diagnosis"]
    assert nodes["gpu-2"]["ok"] is False  # its peers never all arrived
    assert processes_of_run(report["run_id"]) == []
    assert not listening(int(endpoint.rsplit(":", 1)[1]))


def test_node_without_torch_is_named_with_its_interpreter(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twin = load_twin("rtx3090-nvlink")
    hosts = [test_hosts.start(f"gpu-{i}", twin, rig="pair") for i in range(2)]
    code, report = smoke(
        capsys, test_hosts, smoke_rig(test_hosts, tmp_path / "rig.yaml", hosts, FAIL_TIMEOUT_S)
    )
    assert code == 2
    problems = report["groups"][0]["problems"]
    assert "gpu-0: torch is not installed in /usr/bin/python3 on gpu-0" in problems
    assert "gpu-1: torch is not installed in /usr/bin/python3 on gpu-1" in problems
