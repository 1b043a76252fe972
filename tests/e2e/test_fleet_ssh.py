"""The fleet layer against real sshd test hosts, mostly with a tiny fake agent (apart from the real one)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.pool import run_fleet
from mgpu_provision.fleet.session import AgentSession
from mgpu_provision.fleet.targets import HostTarget
from tests.support.hosts import FakeAgent, HostFactory, TestHost, fake_agent, over_ssh


def target(host: TestHost, factory: HostFactory, **changes: Any) -> HostTarget:
    base = HostTarget(
        name=host.name,
        address=host.address,
        port=host.port,
        user="root",
        identity_file=str(factory.client_key),
        jump=None,
        become=True,
        python="/usr/bin/python3",
        connection="ssh",
        simulate=None,
        connect_timeout_s=2.0,
        command_timeout_s=20.0,
    )
    return base._replace(**changes)


def options(factory: HostFactory, agent: FakeAgent, **changes: Any) -> FleetOptions:
    return dataclasses.replace(FleetOptions(known_hosts=factory.known_hosts, agent=agent), **changes)


Answer = tuple[dict[str, Any], int]


def call(verb: str, args: dict[str, Any] | None = None) -> Callable[[AgentSession], Answer]:
    def fn(session: AgentSession) -> Answer:
        return session.call(verb, args or {}), session.commands

    return fn


def test_agent_is_uploaded_once_then_costs_one_command(test_hosts: HostFactory) -> None:
    hosts = [test_hosts.start("gpu-a"), test_hosts.start("gpu-b")]
    agent = fake_agent("upload-once")
    targets = [target(h, test_hosts) for h in hosts]

    first = run_fleet(targets, call("facts", {"n": 1}), options(test_hosts, agent))
    second = run_fleet(targets, call("facts", {"n": 2}), options(test_hosts, agent))

    for host in hosts:
        assert first[host.name].status == "ok", first[host.name].error
        empty: Answer = ({}, -1)
        result, commands = first[host.name].value or empty
        assert commands == 2  # missing (exit 97), upload over sftp, run again
        assert result["hostname"] == host.name  # its own UTS namespace
        assert result["env_simulate"] == str(host.twin_path)  # sshd's SetEnv reaches the agent
        assert result["args"] == {"n": 1}
        assert result["argv0"] == f"/root/.cache/mgpu-provision/{agent.name}"
        result, commands = second[host.name].value or empty
        assert commands == 1
        assert result["args"] == {"n": 2}
        mode = host.run_in_ns("stat -c %a /root/.cache/mgpu-provision").stdout.strip()
        assert mode == "700"
        assert host.run_in_ns("ls -A /root/.cache/mgpu-provision").stdout.split() == [agent.name]


def test_request_simulate_field_is_sent(test_hosts: HostFactory) -> None:
    host = test_hosts.start("gpu-a")
    outcome = run_fleet(
        [target(host, test_hosts, simulate="/srv/twin.yaml")],
        call("facts"),
        options(test_hosts, fake_agent()),
    )["gpu-a"]
    assert outcome.value is not None
    assert outcome.value[0]["simulate"] == "/srv/twin.yaml"


def test_dead_and_silent_hosts_are_unreachable_within_the_timeout(test_hosts: HostFactory) -> None:
    live = test_hosts.start("gpu-a")
    silent = test_hosts.silent_server()
    dead = test_hosts.dead_address()
    targets = [
        target(live, test_hosts),
        target(live, test_hosts, name="silent", address=silent.address),
        target(live, test_hosts, name="dead", address=dead),
    ]
    started = time.monotonic()
    outcomes = run_fleet(targets, call("facts"), options(test_hosts, fake_agent()))
    elapsed = time.monotonic() - started

    assert outcomes["gpu-a"].status == "ok"
    assert outcomes["silent"].status == "unreachable"
    assert "sent no SSH banner within 2s" in (outcomes["silent"].error or "")
    assert outcomes["dead"].status == "unreachable"
    assert "connection refused by dead" in (outcomes["dead"].error or "")
    assert outcomes["silent"].elapsed_s < 2.0 + 1.5
    assert outcomes["dead"].elapsed_s < 1.0
    assert elapsed < 2.0 + 3.0


def test_unknown_host_key_is_refused_with_advice_then_accepted_on_request(
    test_hosts: HostFactory, tmp_path: Path
) -> None:
    host = test_hosts.start("gpu-a")
    known_hosts = tmp_path / "ssh" / "known_hosts"
    agent = fake_agent()
    refused = run_fleet(
        [target(host, test_hosts)], call("facts"), options(test_hosts, agent, known_hosts=known_hosts)
    )
    outcome = refused["gpu-a"]
    assert outcome.status == "unreachable"
    assert outcome.error is not None
    assert f"host key of gpu-a ({host.address}:2222) is not in known_hosts" in outcome.error
    assert "--accept-new-host-keys" in outcome.error
    assert f"ssh-keyscan -p 2222 {host.address}" in outcome.error
    assert not known_hosts.exists()

    accept = options(test_hosts, agent, known_hosts=known_hosts, accept_new_host_keys=True)
    accepted = run_fleet([target(host, test_hosts)], call("facts"), accept)["gpu-a"]
    assert accepted.status == "ok", accepted.error
    assert known_hosts.read_text().split() == host.known_hosts_line.split()

    # Now known: the default (reject) policy connects without the flag.
    again = run_fleet(
        [target(host, test_hosts)], call("facts"), options(test_hosts, agent, known_hosts=known_hosts)
    )
    assert again["gpu-a"].status == "ok"


def test_changed_host_key_is_refused_loudly_even_with_accept_new(
    test_hosts: HostFactory, tmp_path: Path
) -> None:
    host = test_hosts.start("gpu-a")
    other = test_hosts.start("gpu-b")
    known_hosts = tmp_path / "known_hosts"
    # gpu-b's key recorded under gpu-a's name: what a reinstalled box (or an impostor) looks like.
    known_hosts.write_text(
        f"[{host.address}]:2222 {other.host_key_pub.split()[0]} {other.host_key_pub.split()[1]}\n"
    )
    for accept in (False, True):
        opts = options(test_hosts, fake_agent(), known_hosts=known_hosts, accept_new_host_keys=accept)
        outcome = run_fleet([target(host, test_hosts)], call("facts"), opts)["gpu-a"]
        assert outcome.status == "unreachable"
        assert outcome.error is not None
        assert outcome.error.startswith(f"HOST KEY CHANGED for gpu-a ({host.address}:2222)")
        assert "man-in-the-middle" in outcome.error
        assert f"ssh-keygen -R '[{host.address}]:2222'" in outcome.error
    assert len(known_hosts.read_text().splitlines()) == 1


def test_a_known_hosts_line_that_cannot_be_read_is_skipped(test_hosts: HostFactory, tmp_path: Path) -> None:
    host = test_hosts.start("gpu-a")
    known_hosts = tmp_path / "known_hosts"
    # Another host's line with a broken key (bad base64), as hand edits leave: OpenSSH skips it.
    known_hosts.write_text(f"10.0.0.99 ssh-ed25519 not-base64!\n{host.known_hosts_line}\n")
    opts = options(test_hosts, fake_agent(), known_hosts=known_hosts)
    outcome = run_fleet([target(host, test_hosts)], call("facts"), opts)["gpu-a"]
    assert outcome.status == "ok", outcome.error


def test_wrong_key_is_an_authentication_failure(test_hosts: HostFactory, tmp_path: Path) -> None:
    host = test_hosts.start("gpu-a")
    stranger = tmp_path / "id_other"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    outcome = run_fleet(
        [target(host, test_hosts, identity_file=str(stranger))],
        call("facts"),
        options(test_hosts, fake_agent()),
    )["gpu-a"]
    assert outcome.status == "unreachable"
    assert (outcome.error or "").startswith(f"authentication failed on gpu-a ({host.address}:2222) as root")


def test_a_missing_key_file_is_named(test_hosts: HostFactory, tmp_path: Path) -> None:
    host = test_hosts.start("gpu-a")
    missing = tmp_path / "id_gone"
    chosen = [target(host, test_hosts, identity_file=str(missing))]
    outcome = run_fleet(chosen, call("facts"), options(test_hosts, fake_agent()))["gpu-a"]
    assert outcome.status == "unreachable"
    assert outcome.error == (
        f"cannot log in to gpu-a ({host.address}:2222): its SSH key {missing} does not exist (identity_file)"
    )


def test_no_key_at_all_says_so_and_how_to_give_one(
    test_hosts: HostFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = test_hosts.start("gpu-a")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh keys
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # no ssh-agent
    outcome = run_fleet(
        [target(host, test_hosts, identity_file=None)], call("facts"), options(test_hosts, fake_agent())
    )["gpu-a"]
    assert outcome.status == "unreachable"
    assert (outcome.error or "").startswith(
        f"cannot log in to gpu-a ({host.address}:2222) as root: no SSH key to offer (no identity_file"
    ), outcome.error
    assert "ssh-add" in (outcome.error or "")


@pytest.mark.parametrize(
    ("verb", "args", "message"),
    [
        (
            "crash",
            {},
            "agent crash crashed on gpu-a ({addr}:2222) (exit 3): RuntimeError: the fake agent crashed",
        ),
        ("garbage", {}, "agent garbage on gpu-a ({addr}:2222) answered something that is not JSON"),
        ("refuse", {}, "agent refuse failed on gpu-a ({addr}:2222) (locked): held by 42"),
        ("sleep", {"seconds": 30}, "agent sleep did not finish within 1s on gpu-a ({addr}:2222)"),
    ],
)
def test_agent_failures_are_plain_messages(
    test_hosts: HostFactory, verb: str, args: dict[str, Any], message: str
) -> None:
    host = test_hosts.start("gpu-a")
    tgt = target(host, test_hosts, command_timeout_s=1.0)
    started = time.monotonic()
    outcome = run_fleet([tgt], call(verb, args), options(test_hosts, fake_agent()))["gpu-a"]
    assert outcome.status == "failed"
    assert (outcome.error or "").startswith(message.format(addr=host.address))
    assert time.monotonic() - started < 10


def test_forks_bound_the_worker_pool(test_hosts: HostFactory) -> None:
    hosts = [test_hosts.start(f"gpu-{i}") for i in range(3)]
    agent = fake_agent()
    targets = [target(h, test_hosts) for h in hosts]
    run_fleet(targets, call("facts"), options(test_hosts, agent))  # upload first, so timings are comparable
    started = time.monotonic()
    outcomes = run_fleet(targets, call("sleep", {"seconds": 1}), options(test_hosts, agent, forks=1))
    assert all(o.status == "ok" for o in outcomes.values())
    assert time.monotonic() - started >= 3.0
    assert list(outcomes) == [h.name for h in hosts]


def test_jump_host_is_a_gateway_with_its_key_checked(test_hosts: HostFactory, tmp_path: Path) -> None:
    jump, inner = test_hosts.start("bastion"), test_hosts.start("gpu-b")
    via = target(inner, test_hosts, jump=f"root@{jump.address}:{jump.port}")
    outcome = run_fleet([via], call("facts"), options(test_hosts, fake_agent()))["gpu-b"]
    assert outcome.status == "ok", outcome.error
    assert outcome.value is not None and outcome.value[0]["hostname"] == "gpu-b"
    assert "Accepted publickey for root" in jump.log()  # only the gateway hop ever logs in to the bastion

    # The jump host's own key is checked too.
    only_inner = tmp_path / "known_hosts"
    only_inner.write_text(inner.known_hosts_line + "\n")
    opts = options(test_hosts, fake_agent(), known_hosts=only_inner)
    refused = run_fleet([via], call("facts"), opts)["gpu-b"]
    assert refused.status == "unreachable"
    assert f"host key of jump host {jump.address} ({jump.address}:2222) is not in known_hosts" in (
        refused.error or ""
    )


def test_a_jump_host_that_cannot_reach_the_target_is_named(test_hosts: HostFactory) -> None:
    jump, dead = test_hosts.start("bastion"), test_hosts.dead_address()
    hop = f"root@{jump.address}:{jump.port}"
    via = target(jump, test_hosts, name="gpu-b", address=dead)._replace(jump=hop)
    outcome = run_fleet([via], call("facts"), options(test_hosts, fake_agent()))["gpu-b"]
    assert outcome.status == "unreachable"
    assert (outcome.error or "").startswith(
        f"jump host {jump.address} ({jump.address}:2222) cannot open a connection to gpu-b ({dead}:2222): "
    ), outcome.error


def test_a_jump_host_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    """The name lookup runs in a network namespace of its own: it fails at once and no query leaves."""
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "version: 1\n"
        "hosts:\n"
        "  - {name: gpu-a, address: 10.0.0.11, rig: pair, jump: bastion.invalid}\n"
        "rigs:\n"
        "  pair:\n"
        '    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}\n'
        "    ddp: {master: gpu-a, port: 29500, backend: gloo, nproc_per_node: 2}\n"
    )
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-m", "mgpu_provision", "plan", str(rig)],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    jump = "jump host bastion.invalid (bastion.invalid:22)"
    assert f"gpu-a: unreachable: cannot resolve {jump} on the way to gpu-a (10.0.0.11:22): " in done.stdout
    assert "cannot resolve gpu-a" not in done.stdout


def test_ssh_config_alias_user_port_and_key_are_honoured(test_hosts: HostFactory, tmp_path: Path) -> None:
    host = test_hosts.start("gpu-a")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host box-alias\n  HostName {host.address}\n  Port {host.port}\n  User root\n"
        f"  IdentityFile {test_hosts.client_key}\n"
    )
    aliased = target(
        host, test_hosts, name="box", address="box-alias", port=None, user=None, identity_file=None
    )
    outcome = run_fleet([aliased], call("facts"), options(test_hosts, fake_agent(), ssh_config=config))["box"]
    assert outcome.status == "ok", outcome.error
    assert outcome.value is not None and outcome.value[0]["hostname"] == "gpu-a"


def test_become_with_a_non_root_login_uses_sudo_n(test_hosts: HostFactory) -> None:
    host = test_hosts.start("gpu-a", login_user="ops", sudo="nopasswd")
    agent = fake_agent()
    ops = target(host, test_hosts, user="ops")
    outcome = run_fleet([ops], call("facts"), options(test_hosts, agent))["gpu-a"]
    assert outcome.status == "ok", outcome.error
    assert outcome.value is not None and outcome.value[0]["uid"] == 1000
    home = host.dir / "home-ops"
    cached = f"{home}/.cache/mgpu-provision/{agent.name}"
    # The login shell's simulation setting goes on as an argument: real sudo would reset the environment.
    assert (home / "sudo.log").read_text() == f"-n /usr/bin/python3 -S -I {cached} facts {host.twin_path}\n"

    plain = run_fleet(
        [target(host, test_hosts, user="ops", become=False)], call("facts"), options(test_hosts, agent)
    )["gpu-a"]
    assert plain.status == "ok"
    assert len((home / "sudo.log").read_text().splitlines()) == 1  # no sudo without become


def test_sudo_that_wants_a_password_is_a_clear_error(test_hosts: HostFactory) -> None:
    host = test_hosts.start("gpu-a", login_user="ops", sudo="password")
    tgt = target(host, test_hosts, user="ops")
    outcome = run_fleet([tgt], call("facts"), options(test_hosts, fake_agent()))["gpu-a"]
    assert outcome.status == "failed"
    assert (outcome.error or "").startswith(
        f"sudo needs a password on gpu-a ({host.address}:2222); allow NOPASSWD for the login user"
    )


def test_a_stopped_host_is_refused_and_the_namespace_is_gone(test_hosts: HostFactory) -> None:
    host = test_hosts.start("gpu-a")
    assert host.run_in_ns("hostname").stdout.strip() == "gpu-a"
    host.stop()
    outcome = run_fleet([target(host, test_hosts)], call("facts"), options(test_hosts, fake_agent()))["gpu-a"]
    assert outcome.status == "unreachable"
    assert (outcome.error or "").startswith("connection refused by gpu-a")
    with pytest.raises(RuntimeError, match="test host gpu-a is not running"):
        host.run_in_ns("true")


def test_real_agent_unpacks_once_then_runs_from_its_folder(test_hosts: HostFactory) -> None:
    from mgpu_provision.fleet.bundle import build_agent

    host = test_hosts.start("gpu-a", login_user="ops", sudo="nopasswd")
    agent = build_agent()
    ops = target(host, test_hosts, user="ops")
    for round_ in range(3):
        real = FleetOptions(known_hosts=test_hosts.known_hosts, agent=agent)
        outcome = run_fleet([ops], call("facts"), real)["gpu-a"]
        assert outcome.status == "ok", outcome.error
        assert outcome.value is not None and outcome.value[1] == (2 if round_ == 0 else 1)
    home = host.dir / "home-ops"
    folder = f"{home}/.cache/mgpu-provision/{agent.name.removesuffix('.pyz')}"
    assert (home / "sudo.log").read_text().splitlines() == [
        f"-n /usr/bin/python3 -S -I {folder}.pyz facts {host.twin_path}",  # the zipapp unpacks itself
        f"-n /usr/bin/python3 -S -I {folder} facts {host.twin_path}",
        f"-n /usr/bin/python3 -S -I {folder} facts {host.twin_path}",
    ]
    assert list(Path(folder, "mgpu_provision", "node", "verbs", "__pycache__").glob("facts.*.pyc"))


def test_dash_v_shows_each_ssh_step_with_its_time(test_hosts: HostFactory, tmp_path: Path) -> None:
    host = test_hosts.start("gpu-a")
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [host])
    known = ["--known-hosts", str(test_hosts.known_hosts)]
    done = subprocess.run(
        [sys.executable, "-m", "mgpu_provision", "facts", str(rig), *known, "-v"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()

    def logged(pattern: str) -> bool:
        return any(re.match(r"\d\d:\d\d:\d\d\.\d{3} " + pattern, line) for line in lines)

    assert logged(r"mgpu_provision\.fleet\.pool: gpu-a: connected and logged in after "), lines
    assert logged(r"paramiko\.transport: Authentication \(publickey\) successful"), lines
    assert logged(r"mgpu_provision\.fleet\.pool: gpu-a: done after "), lines


def test_a_login_on_a_test_host_keeps_its_temporary_files_in_the_factorys_folder(
    test_hosts: HostFactory,
) -> None:
    """What an agent leaves in its temporary folder when its host is killed under it (a smoke's work
    folder, torchrun's torchelastic_*) goes with the test's hosts, never to this machine's /tmp: every
    login's TMPDIR is the factory's `node_tmp`, beside the twin that logins simulate."""
    host = test_hosts.start("gpu-a")
    done = over_ssh(test_hosts, host, 'python3 -c "import tempfile; print(tempfile.gettempdir())" && '
                    'printf "%s\\n" "$MGPU_PROVISION_SIMULATE"')  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(test_hosts.node_tmp), str(host.twin_path)]
