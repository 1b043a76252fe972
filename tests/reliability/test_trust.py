"""Trust: host keys the tool has not seen are refused, changed ones loudly, and secrets are never printed.

Runs the real CLI (`plan`) against test hosts. A passphrase-protected key is used the way the tool supports
(its passphrase given only to ssh-agent); the passphrase and a sudo prompt must appear in no output or log.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.support.hosts import HostFactory, TestHost
from tests.support.nodes import CLI, Run, cli_env, wait_for
from tests.support.trial import Trial

PASSPHRASE = "correct-horse-battery-staple-4711"


def plan(rig: Path, known_hosts: Path, *more: str, env: dict[str, str] | None = None) -> Run:
    done = subprocess.run(
        [*CLI, "plan", str(rig), "--known-hosts", str(known_hosts), "--json", *more],
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def test_unknown_host_key_is_refused(test_hosts: HostFactory, tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "trust", "plan against a host whose key is not in known_hosts"
    trial.expect = "unreachable with advice, known_hosts untouched; accepted only with --accept-new-host-keys"
    host = test_hosts.start("gpu-a")
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [host])
    known = tmp_path / "known_hosts"
    known.write_text("")
    run = plan(rig, known)
    assert run.code == 2
    assert run.host("gpu-a")["status"] == "unreachable"
    assert "is not in known_hosts" in run.host("gpu-a")["error"]
    assert known.read_text() == ""
    assert plan(rig, known, "--accept-new-host-keys").code in (0, 2)
    assert known.read_text().split() == host.known_hosts_line.split()
    trial.count("examples", 2)


def test_changed_host_key_is_a_loud_refusal(test_hosts: HostFactory, tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "trust", "plan against a host whose key differs from known_hosts (MITM)"
    trial.expect = "HOST KEY CHANGED error, also with --accept-new-host-keys; known_hosts untouched"
    host, other = test_hosts.start("gpu-a"), test_hosts.start("gpu-b")
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [host])
    known = tmp_path / "known_hosts"
    key_type, key = other.host_key_pub.split()[:2]
    known.write_text(f"[{host.address}]:{host.port} {key_type} {key}\n")
    before = known.read_text()
    for flags in ([], ["--accept-new-host-keys"]):
        run = plan(rig, known, *flags)
        trial.count("examples")
        assert run.code == 2
        assert run.host("gpu-a")["error"].startswith("HOST KEY CHANGED for gpu-a")
    human = subprocess.run(
        [*CLI, "plan", str(rig), "--known-hosts", str(known)],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "HOST KEY CHANGED" in human.stdout + human.stderr  # loud in the human output too
    assert known.read_text() == before


def agent_with_key(tmp_path: Path, key: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """An ssh-agent holding `key`, its passphrase typed by an askpass program (never by the tool)."""
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho {PASSPHRASE}\n")
    askpass.chmod(0o700)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    wait_for(sock.exists, "ssh-agent's socket")
    env = {
        **cli_env(),
        "SSH_AUTH_SOCK": str(sock),
        "SSH_ASKPASS": str(askpass),
        "SSH_ASKPASS_REQUIRE": "force",
        "DISPLAY": ":0",
    }
    subprocess.run(["ssh-add", str(key)], env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return agent, env


def rig_without_key(factory: HostFactory, rig: Path, host: TestHost, key: Path | None) -> Path:
    factory.write_rig(rig, [host])
    document = yaml.safe_load(rig.read_text())
    if key is None:
        del document["defaults"]["identity_file"]
    else:
        document["defaults"]["identity_file"] = str(key)
    rig.write_text(yaml.safe_dump(document, sort_keys=False))
    return rig


def test_passphrase_and_sudo_password_never_printed(
    test_hosts: HostFactory, tmp_path: Path, trial: Trial
) -> None:
    trial.area = "trust"
    trial.tried = "passphrase-protected key (file, then via ssh-agent); login whose sudo wants a password"
    trial.expect = "clear errors; passphrase appears in no output or sshd log; no prompt, no hang"
    host = test_hosts.start("gpu-a", login_user="ops", sudo="password")
    key = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(key)], check=True)
    authorized = host.dir / "authorized_keys"
    authorized.write_text(authorized.read_text() + key.with_suffix(".pub").read_text())
    outputs: list[str] = []

    # With no agent running, validate names the key and what to do (issue 40 item 13) before any login.
    no_agent = {k: v for k, v in cli_env().items() if k != "SSH_AUTH_SOCK"}
    rig = rig_without_key(test_hosts, tmp_path / "locked.yaml", host, key)
    locked = plan(rig, test_hosts.known_hosts, env=no_agent)
    outputs += [locked.out, locked.err]
    assert locked.code == 1
    assert "is protected by a passphrase and no SSH agent runs (SSH_AUTH_SOCK): load it with ssh-add" in (
        locked.out + locked.err
    )

    agent, env = agent_with_key(tmp_path, key)
    try:
        via_agent = plan(
            rig_without_key(test_hosts, tmp_path / "agent.yaml", host, None), test_hosts.known_hosts, env=env
        )
        outputs += [via_agent.out, via_agent.err]
        assert via_agent.host("gpu-a")["status"] != "unreachable", via_agent.host("gpu-a")
        document = yaml.safe_load((tmp_path / "agent.yaml").read_text())
        document["defaults"].update(user="ops", become=True)
        (tmp_path / "sudo.yaml").write_text(yaml.safe_dump(document))
        sudo = plan(tmp_path / "sudo.yaml", test_hosts.known_hosts, env=env)
        outputs += [sudo.out, sudo.err]
        assert "sudo needs a password on gpu-a" in sudo.host("gpu-a")["error"]
    finally:
        agent.kill()
        agent.wait()
    outputs.append(host.log())
    outputs += [p.read_text(errors="replace") for p in host.dir.rglob("*.log")]
    trial.figures.update(outputs_checked=len(outputs), bytes_checked=sum(len(o) for o in outputs))
    assert all(PASSPHRASE not in text for text in outputs)
    assert all("password:" not in text.lower() for text in outputs[:-1])  # no prompt was ever shown
