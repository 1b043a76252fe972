"""`mgpu-provision facts` end to end: real sshd test hosts, the real agent, simulated NVIDIA layers."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.catalog.topology import parse_topology
from mgpu_provision.cli import main
from tests.support.hosts import HostFactory, TestHost, load_twin

TWINS = {"gpu-a": "rtx3090-nvlink", "hgx-1": "h100-hgx", "pcie-5": "rtx4090-pcie"}


def facts_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["facts", *argv])
    return code, capsys.readouterr().out


def facts_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code, out = facts_cli(capsys, *argv, "--json")
    return code, json.loads(out)


def commands_run(host: TestHost) -> int:
    """SSH commands the host's sshd started (LogLevel VERBOSE logs each; sftp is a subsystem, not counted)."""
    return len(re.findall(r"Starting session: command ", host.log()))


@pytest.fixture
def fleet(test_hosts: HostFactory, tmp_path: Path) -> tuple[list[TestHost], Path]:
    hosts = [test_hosts.start(name, load_twin(twin)) for name, twin in TWINS.items()]
    return hosts, test_hosts.write_rig(tmp_path / "rig.yaml", hosts)


def test_facts_equal_the_twins_link_by_link(
    fleet: tuple[list[TestHost], Path], test_hosts: HostFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts, rig = fleet
    code, answer = facts_json(capsys, str(rig), "--known-hosts", str(test_hosts.known_hosts))
    assert code == 0, answer
    for host in hosts:
        entry = answer["hosts"][host.name]
        assert entry["status"] == "ok", entry
        facts, twin = entry["facts"], host.twin()
        assert facts["host"]["hostname"] == host.name
        assert facts["host"]["simulated"] is True
        assert facts["driver"]["nvml"] == "ok"
        assert facts["driver"]["version"] == twin["driver"]["version"]
        assert facts["driver"]["cuda"] == twin["driver"]["cuda"]
        assert facts["nvswitch"] == twin.get("nvswitch", False)
        assert len(facts["gpus"]) == len(twin["gpus"])
        for index, (gpu, described) in enumerate(zip(facts["gpus"], twin["gpus"], strict=True)):
            assert gpu["index"] == index
            assert gpu["name"] == described["name"]
            assert gpu["memory_mib"] == described["memory_mib"]
            if "pci_bus_id" in described:
                assert gpu["pci_bus_id"] == described["pci_bus_id"]
            for key, value in described.get("pcie", {}).items():
                assert gpu["pcie"][key] == value
        matrix = parse_topology(twin["topology"])
        count = len(twin["gpus"])
        pairs = {(p["a"], p["b"]): p for p in facts["pairs"]}
        assert set(pairs) == {(a, b) for a in range(count) for b in range(a + 1, count)}
        for (a, b), pair in pairs.items():
            cell = matrix.gpu_cell(a, b)
            assert pair["nvlinks"] == matrix.nvlinks(a, b), (host.name, a, b)
            if not cell.startswith("NV"):
                assert pair["pcie"] == cell, (host.name, a, b)


def test_facts_table_shows_gpus_and_the_link_matrix(
    fleet: tuple[list[TestHost], Path], test_hosts: HostFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    _, rig = fleet
    known = str(test_hosts.known_hosts)
    code, out = facts_cli(capsys, str(rig), "--known-hosts", known, "--limit", "gpu-a,hgx-*")
    assert code == 0
    assert "pcie-5" not in out
    assert "NVIDIA GeForce RTX 3090" in out and "NVIDIA H100 80GB HBM3" in out
    assert "driver 550.54.15, CUDA 12.4" in out
    assert "00000000:21:00.0" in out
    assert "Gen5 x16 / Gen5 x16" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("GPU")]
    assert ["GPU0", "X", "NV4"] in rows
    assert ["GPU1", "NV4", "X"] in rows
    assert ["GPU7", *["NV18"] * 7, "X"] in rows


def test_dead_and_silent_hosts_are_reported_within_the_timeout(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = test_hosts.start("gpu-a", load_twin("rtx3090-nvlink"))
    silent = test_hosts.silent_server()
    extra = [
        {"name": "dead", "address": test_hosts.dead_address(), "port": 2222, "rig": "ghost"},
        {"name": "silent", "address": silent.address, "port": 2222, "rig": "ghost"},
    ]
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [live], extra_hosts=extra)
    started = time.monotonic()
    code, answer = facts_json(
        capsys, str(rig), "--known-hosts", str(test_hosts.known_hosts), "--timeout", "2"
    )
    elapsed = time.monotonic() - started
    assert code == 2
    assert answer["hosts"]["gpu-a"]["status"] == "ok"
    assert len(answer["hosts"]["gpu-a"]["facts"]["gpus"]) == 2
    assert answer["hosts"]["dead"] == {
        "status": "unreachable",
        "error": f"connection refused by dead ({extra[0]['address']}:2222): "
        "nothing listens there (is sshd running?)",
    }
    assert answer["hosts"]["silent"]["status"] == "unreachable"
    assert "sent no SSH banner within 2s" in answer["hosts"]["silent"]["error"]
    assert elapsed < 2 + 4  # the silent host's 2 s, plus building the agent and the live host's facts

    code, out = facts_cli(capsys, str(rig), "--known-hosts", str(test_hosts.known_hosts), "--timeout", "2")
    assert code == 2
    assert "silent  unreachable: silent" in out
    assert "NVIDIA GeForce RTX 3090" in out


def test_unknown_host_key_is_refused_until_accepted(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = test_hosts.start("gpu-a", load_twin("rtx3090-nvlink"))
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [host])
    known_hosts = tmp_path / "known_hosts"
    code, answer = facts_json(capsys, str(rig), "--known-hosts", str(known_hosts))
    assert code == 2
    error = answer["hosts"]["gpu-a"]["error"]
    assert error.startswith(f"host key of gpu-a ({host.address}:2222) is not in known_hosts ({known_hosts})")
    assert "run with --accept-new-host-keys, or add it with `ssh-keyscan -p 2222" in error

    capsys.readouterr()
    accept = ["--known-hosts", str(known_hosts), "--accept-new-host-keys", "--json"]
    assert main(["facts", str(rig), *accept]) == 0
    assert known_hosts.read_text().split() == host.known_hosts_line.split()
    # Said as OpenSSH says it: a key is never trusted silently.
    added = f"Warning: Permanently added '[{host.address}]:2222' (ED25519) to the list of known hosts"
    assert f"{added} ({known_hosts})." in capsys.readouterr().err
    assert facts_json(capsys, str(rig), "--known-hosts", str(known_hosts))[0] == 0


def test_changed_host_key_is_a_loud_refusal(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host, impostor = test_hosts.start("gpu-a"), test_hosts.start("gpu-b")
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [host])
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{host.address}]:2222 " + " ".join(impostor.host_key_pub.split()[:2]) + "\n")
    code, answer = facts_json(capsys, str(rig), "--known-hosts", str(known_hosts), "--accept-new-host-keys")
    assert code == 2
    assert answer["hosts"]["gpu-a"]["error"].startswith(f"HOST KEY CHANGED for gpu-a ({host.address}:2222)")


def test_once_the_agent_is_there_facts_cost_one_ssh_command_per_host(
    fleet: tuple[list[TestHost], Path], test_hosts: HostFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts, rig = fleet
    argv = (str(rig), "--known-hosts", str(test_hosts.known_hosts))
    assert facts_json(capsys, *argv)[0] == 0
    assert [commands_run(h) for h in hosts] == [2, 2, 2]  # not there (exit 97), upload, run
    for _ in range(2):
        before = [commands_run(h) for h in hosts]
        assert facts_json(capsys, *argv)[0] == 0
        assert [commands_run(h) - b for h, b in zip(hosts, before, strict=True)] == [1, 1, 1]
