"""How the agent reaches hosts that differ from the usual box: no SFTP, a HOME the login does not expect,
and a non-root login that runs the agent through the real sudo (whose env_reset drops variables)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.cli import main
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.pool import run_fleet
from mgpu_provision.fleet.session import AgentSession
from mgpu_provision.fleet.targets import HostTarget
from tests.support.factories import rtx3090_twin
from tests.support.hosts import HostFactory, TestHost, fake_agent


def target(host: TestHost, factory: HostFactory, user: str = "root") -> HostTarget:
    return HostTarget(
        host.name, host.address, host.port, user, str(factory.client_key), None, True, "/usr/bin/python3",
        "ssh", None, 5.0, 60.0,
    )  # fmt: skip


def facts_twice(host: TestHost, factory: HostFactory) -> list[tuple[dict[str, Any], int]]:
    """The fake agent's answer and the SSH commands it took, for a first call and a second."""
    agent = fake_agent(host.name)
    answers = []
    for _ in range(2):

        def fn(session: AgentSession) -> tuple[dict[str, Any], int]:
            return session.call("facts", {}), session.commands

        options = FleetOptions(known_hosts=factory.known_hosts, agent=agent)
        outcome = run_fleet([target(host, factory)], fn, options)
        assert outcome[host.name].status == "ok", outcome[host.name].error
        assert outcome[host.name].value is not None
        answers.append(outcome[host.name].value)
    return answers  # type: ignore[return-value]


def test_without_sftp_the_agent_goes_through_the_command_channel(test_hosts: HostFactory) -> None:
    host = test_hosts.start("gpu-a", sftp=False)
    (first, first_commands), (second, second_commands) = facts_twice(host, test_hosts)
    # First call: the command says the agent is missing, the agent is piped to it, the command runs again.
    assert (first_commands, second_commands) == (3, 1)
    assert first["env_simulate"] == second["env_simulate"] == str(host.twin_path)
    assert "subsystem request for sftp by user root failed, subsystem not found" in host.log()


def test_the_agent_lands_where_the_command_looks_when_home_differs(test_hosts: HostFactory) -> None:
    elsewhere = test_hosts.root / "elsewhere"
    elsewhere.mkdir()
    # sshd sets HOME from passwd (where SFTP starts); ~/.ssh/environment gives the commands another one.
    host = test_hosts.start("gpu-a", extra_sshd_config="PermitUserEnvironment yes\n")
    (host.dir / "home" / ".ssh").mkdir()
    (host.dir / "home" / ".ssh" / "environment").write_text(f"HOME={elsewhere}\n")
    (first, _), (_, commands) = facts_twice(host, test_hosts)
    assert commands == 1
    assert first["argv0"].startswith(f"{elsewhere}/.cache/mgpu-provision/")
    assert not (host.dir / "home" / ".cache" / "mgpu-provision").exists()


def test_become_through_real_sudo_keeps_a_simulated_node_simulated(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = test_hosts.start("gpu-a", rtx3090_twin(), rig="pair", login_user="ops", sudo="real")
    rig = {
        "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2, "persistence_mode": True},
        "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
        "driver": {"version": "550.54.15"},
    }
    ops = {"user": "ops", "become": True}
    path = test_hosts.write_rig(tmp_path / "rig.yaml", [host], rigs={"pair": rig}, defaults=ops)
    common = ["--known-hosts", str(test_hosts.known_hosts)]

    assert main(["facts", str(path), "--json", *common]) == 0
    facts = json.loads(capsys.readouterr().out)["hosts"]["gpu-a"]["facts"]
    assert (facts["host"]["user"], facts["host"]["simulated"]) == ("root", True)
    assert main(["plan", str(path), *common]) == 2
    assert "persistence" in capsys.readouterr().out
    assert main(["apply", str(path), "--yes", *common]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(["plan", str(path), *common]) == 0, capsys.readouterr().out
    state = json.loads(host.twin_state_path.read_text())
    # Persistence went through the (simulated) nvidia-persistenced: the twin changed, not the machine.
    assert state["services"]["nvidia-persistenced"] == {"enabled": True, "running": True}, state
