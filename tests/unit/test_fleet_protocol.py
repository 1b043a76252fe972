"""The fleet layer's pure parts and local sessions: agent command, response parsing, targets, error words."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest

from mgpu_provision.errors import AgentError
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.pool import run_fleet
from mgpu_provision.fleet.session import (
    AGENT_MISSING,
    CACHE_DIR,
    SshAgentSession,
    agent_command,
    cache_folder,
    folder_chain,
    parse_response,
)
from mgpu_provision.fleet.ssh import connect_error_message, known_hosts_name, make_connection
from mgpu_provision.fleet.targets import targets_for
from mgpu_provision.rig import load_rig
from tests.support.factories import local_target, ssh_target
from tests.support.hosts import fake_agent

WHERE = "gpu-a (10.0.0.1:22)"


def ok(result: Any) -> str:
    return json.dumps({"ok": True, "agent_version": "1", "result": result})


def run_agent_command(home: Path, sudo: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
    """The agent command in `sh` with HOME=home, and a stand-in python that prints its arguments."""
    python = home / "py 3" / "python3"
    python.parent.mkdir(exist_ok=True)
    python.write_text('#!/bin/sh\nprintf "%s|" "$@"\n')
    python.chmod(0o755)
    command = agent_command("agent-0123.pyz", str(python), "facts", sudo=sudo)
    return subprocess.run(
        ["sh", "-c", command], env={"HOME": str(home), "PATH": "/usr/bin:/bin", **env},
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_agent_command_prints_its_cache_folder_and_exits_97_without_the_agent(tmp_path: Path) -> None:
    done = run_agent_command(tmp_path)
    assert (done.returncode, done.stdout) == (AGENT_MISSING, f"{tmp_path}/.cache/mgpu-provision")


def test_agent_command_prefers_the_unpacked_folder_and_passes_the_login_simulation_on(tmp_path: Path) -> None:
    cache = tmp_path / ".cache" / "mgpu-provision"
    cache.mkdir(parents=True)
    (cache / "agent-0123.pyz").write_bytes(b"zip")
    done = run_agent_command(tmp_path, MGPU_PROVISION_SIMULATE="/twins/a b.yaml")
    assert done.stdout == f"-S|-I|{cache}/agent-0123.pyz|facts|/twins/a b.yaml|"
    (cache / "agent-0123").mkdir()
    (cache / "agent-0123" / "__main__.py").write_text("")
    assert run_agent_command(tmp_path).stdout == f"-S|-I|{cache}/agent-0123|facts||"


@pytest.mark.parametrize(
    ("stdout", "folder"),
    [
        ("/home/ops/.cache/mgpu-provision", "/home/ops/.cache/mgpu-provision"),
        ("Welcome to gpu-a\n/srv/ops/.cache/mgpu-provision\n", "/srv/ops/.cache/mgpu-provision"),
        ("", ".cache/mgpu-provision"),
        ("~/.cache/mgpu-provision", ".cache/mgpu-provision"),  # no HOME: SFTP's start folder instead
    ],
)
def test_the_upload_goes_where_the_command_said_it_looks(stdout: str, folder: str) -> None:
    assert cache_folder(stdout) == folder


@pytest.mark.parametrize(
    ("folder", "chain"),
    [
        ("/home/ops/.cache/x", ["/home", "/home/ops", "/home/ops/.cache", "/home/ops/.cache/x"]),
        (CACHE_DIR, [".cache", ".cache/mgpu-provision"]),
        ("//srv//x/", ["/srv", "/srv/x"]),
    ],
)
def test_folder_chain_keeps_a_relative_folder_relative(folder: str, chain: list[str]) -> None:
    assert folder_chain(folder) == chain


class FolderSftp:
    """Paramiko's SFTPClient calls an upload makes, on a local folder: absolute paths under `root`,
    relative ones under the login home (where OpenSSH's sftp-server starts)."""

    def __init__(self, root: Path, refuse: str = "") -> None:
        self.root, self.home, self.refuse = root, root / "home" / "ops", refuse
        self.home.mkdir(parents=True)

    def _at(self, path: str) -> Path:
        return self.root / path.lstrip("/") if path.startswith("/") else self.home / path

    def mkdir(self, path: str, mode: int) -> None:
        if path == self.refuse:
            raise PermissionError(13, "Permission denied")
        self._at(path).mkdir(mode=mode)

    def chmod(self, path: str, mode: int) -> None:
        self._at(path).chmod(mode)

    def stat(self, path: str) -> object:
        return self._at(path).stat()

    def open(self, path: str, how: str) -> Any:
        return self._at(path).open(how)

    def posix_rename(self, old: str, new: str) -> None:
        self._at(old).rename(self._at(new))


class SftpConnection:
    host, port, user = "10.0.0.1", 2222, "ops"

    def __init__(self, sftp: FolderSftp) -> None:
        self._sftp = sftp

    def sftp(self) -> FolderSftp:
        return self._sftp


def test_an_upload_to_the_relative_cache_folder_lands_in_the_login_home(tmp_path: Path) -> None:
    """Where the command printed no absolute folder (a login shell's noise cut it), the upload used to make
    /.cache at the server's root and then fail with "[Errno 2]" on the folder it never made."""
    sftp = FolderSftp(tmp_path)
    agent = fake_agent("relative")
    session = SshAgentSession(ssh_target(), agent, SftpConnection(sftp))  # type: ignore[arg-type]
    session._upload(CACHE_DIR)
    cache = sftp.home / CACHE_DIR
    assert (cache / agent.name).read_bytes() == agent.data
    assert cache.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_a_folder_the_upload_cannot_make_is_named_with_its_error(tmp_path: Path) -> None:
    sftp = FolderSftp(tmp_path, refuse="/home/ops/.cache")
    session = SshAgentSession(ssh_target(), fake_agent(), SftpConnection(sftp))  # type: ignore[arg-type]
    with pytest.raises(AgentError) as caught:
        session._upload("/home/ops/.cache/mgpu-provision")
    assert str(caught.value) == (
        "cannot upload the agent to /home/ops/.cache/mgpu-provision on me (10.0.0.1:2222): "
        "cannot make /home/ops/.cache: [Errno 13] Permission denied"
    )


def test_agent_command_runs_python_under_sudo_with_become() -> None:
    sudo = agent_command("a.pyz", "python3", "apply", sudo=True)
    assert sudo.count('exec sudo -n python3 -S -I "$') == 2 and '"${MGPU_PROVISION_SIMULATE-}"' in sudo


def test_parse_response_returns_result() -> None:
    assert parse_response(WHERE, "facts", 0, ok({"x": 1}), "") == {"x": 1}


@pytest.mark.parametrize(
    ("code", "stdout", "stderr", "message"),
    [
        (AGENT_MISSING, "", "", "agent is still missing on gpu-a (10.0.0.1:22) after uploading it"),
        (
            1,
            "",
            "sudo: a password is required\n",
            "sudo needs a password on gpu-a (10.0.0.1:22); allow NOPASSWD",
        ),
        (
            1,
            "",
            "Traceback...\n  x\nKeyError: 'gpus'\n\n",
            "agent facts crashed on gpu-a (10.0.0.1:22) (exit 1): KeyError",
        ),
        (139, "", "", "agent facts crashed on gpu-a (10.0.0.1:22) (exit 139): no error output"),
        (-1, "", "", "the connection to gpu-a (10.0.0.1:22) was lost during agent facts (no exit status"),
        (0, "<html>", "", "agent facts on gpu-a (10.0.0.1:22) answered something that is not JSON"),
        (0, "[1, 2]", "", "agent facts on gpu-a (10.0.0.1:22) answered JSON without an `ok` field"),
        (0, json.dumps({"ok": True}), "", "answered ok without a `result` object"),
        (
            0,
            json.dumps({"ok": False, "error": {"kind": "locked", "message": "held by pid 7"}}),
            "",
            "agent facts failed on gpu-a (10.0.0.1:22) (locked): held by pid 7",
        ),
    ],
)
def test_parse_response_failures_are_plain_words(code: int, stdout: str, stderr: str, message: str) -> None:
    with pytest.raises(AgentError) as caught:
        parse_response(WHERE, "facts", code, stdout, stderr)
    assert message in str(caught.value)


def test_known_hosts_name_follows_openssh() -> None:
    assert known_hosts_name("10.0.0.1", 22) == "10.0.0.1"
    assert known_hosts_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"


RIG = """\
version: 1
defaults: {user: ubuntu, port: 2200, identity_file: keys/id, become: true, connect_timeout_s: 4}
hosts:
  - {name: gpu-a, address: 10.0.0.11, rig: pair}
  - {name: gpu-b, rig: pair, user: root, port: 22, python: /opt/py/bin/python3, simulate: twins/b.yaml}
  - {name: me, rig: pair, connection: local, become: false}
rigs:
  pair: {gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}}
"""


def test_targets_merge_defaults_and_resolve_paths(tmp_path: Path) -> None:
    (tmp_path / "rig.yaml").write_text(RIG)
    (tmp_path / "keys").mkdir()
    # validate checks that a named key exists and looks like a private key (it is not read as one here)
    (tmp_path / "keys" / "id").write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    loaded = load_rig(tmp_path / "rig.yaml")
    a, b, me = targets_for(loaded, list(loaded.spec.hosts))
    assert (a.address, a.port, a.user, a.become, a.python) == ("10.0.0.11", 2200, "ubuntu", True, "python3")
    assert a.identity_file == str(tmp_path / "keys" / "id")
    assert (a.connect_timeout_s, a.command_timeout_s, a.simulate) == (4.0, 300.0, None)
    assert (b.address, b.port, b.user, b.python) == ("gpu-b", 22, "root", "/opt/py/bin/python3")
    assert b.simulate == str(tmp_path / "twins" / "b.yaml")
    assert (me.connection, me.become) == ("local", False)


def test_local_session_uploads_once_and_speaks_the_protocol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    agent = fake_agent("local")
    options = FleetOptions(agent=agent)

    def fn(session: Any) -> tuple[dict[str, Any], int]:
        return session.call("facts", {"k": "v"}), session.commands

    first = run_fleet([local_target()], fn, options)["me"]
    second = run_fleet([local_target()], fn, options)["me"]
    assert first.status == "ok", first.error
    assert first.value is not None and second.value is not None
    result, commands = first.value
    assert commands == 2
    assert result["simulate"] == "/twins/x.yaml"
    assert result["args"] == {"k": "v"}
    assert result["hostname"] == socket.gethostname()
    assert second.value[1] == 1
    cache = tmp_path / ".cache" / "mgpu-provision"
    assert sorted(p.name for p in cache.iterdir()) == [agent.name]
    assert cache.stat().st_mode & 0o777 == 0o700


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended while we looked
        return b""


def test_local_timeouts_and_crashes_are_failed_outcomes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    options = FleetOptions(agent=fake_agent("local"))
    slow = run_fleet(
        [local_target(command_timeout_s=0.5)], lambda s: s.call("sleep", {"seconds": 5}), options
    )["me"]
    assert (slow.status, slow.error) == ("failed", "agent sleep did not finish within 0.5s on me (local)")
    # The timed-out agent's children are gone too, not only the process that was started: under sudo the
    # agent is sudo's child, and it would go on running as root.
    forked = run_fleet(
        [local_target(command_timeout_s=0.5)], lambda s: s.call("fork-sleep", {"seconds": 30}), options
    )["me"]
    assert forked.status == "failed"
    agent_name = options.agent.name if options.agent else ""

    def left() -> list[Path]:
        return [p for p in Path("/proc").glob("[0-9]*/cmdline") if agent_name.encode() in _read(p)]

    deadline = time.monotonic() + 5  # SIGKILL is delivered at once, but a loaded kernel reaps a moment later
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == []
    crash = run_fleet([local_target()], lambda s: s.call("crash", {}), options)["me"]
    assert crash.status == "failed"
    assert crash.error == "agent crash crashed on me (local) (exit 3): RuntimeError: the fake agent crashed"


def test_a_bug_in_the_callback_is_a_failed_outcome_not_a_traceback(tmp_path: Path) -> None:
    def broken(session: Any) -> None:
        raise KeyError("gpus")

    outcome = run_fleet([local_target()], broken, FleetOptions(agent=fake_agent()))["me"]
    assert (outcome.status, outcome.error) == ("failed", "KeyError: 'gpus'")


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (
            ConnectionRefusedError(111, "refused"),
            "connection refused by gpu (10.0.0.1:2222): nothing listens",
        ),
        (
            paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.1", 2222): OSError(111, "x")}),
            "connection refused by gpu (10.0.0.1:2222)",
        ),
        (TimeoutError(), "no answer from gpu (10.0.0.1:2222) within 5s (connect timeout)"),
        (
            socket.gaierror(-2, "Name or service not known"),
            "cannot resolve gpu (10.0.0.1:2222): Name or service",
        ),
        (
            paramiko.SSHException("Error reading SSH protocol banner"),
            "gpu (10.0.0.1:2222) accepted the connection but sent no SSH banner within 5s",
        ),
        (
            paramiko.AuthenticationException("Authentication failed."),
            "authentication failed on gpu (10.0.0.1:2222)",
        ),
        (EOFError(), "gpu (10.0.0.1:2222) closed the connection during the SSH handshake"),
        (OSError(113, "No route to host"), "cannot connect to gpu (10.0.0.1:2222): No route to host"),
        (ValueError("odd"), "cannot connect to gpu (10.0.0.1:2222): ValueError: odd"),
    ],
)
def test_connect_errors_are_plain_words(exc: Exception, message: str, tmp_path: Path) -> None:
    target = ssh_target(name="gpu")
    conn = make_connection(target, FleetOptions(known_hosts=tmp_path / "kh"))
    assert message in connect_error_message(target, conn, exc, tmp_path / "kh")


def test_changed_key_message_names_the_known_hosts_entry(tmp_path: Path) -> None:
    target = ssh_target(name="gpu")
    conn = make_connection(target, FleetOptions(known_hosts=tmp_path / "kh"))
    keys = [paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)]
    message = connect_error_message(
        target, conn, paramiko.BadHostKeyException("10.0.0.1", keys[0], keys[1]), tmp_path / "kh"
    )
    assert message.startswith("HOST KEY CHANGED for gpu (10.0.0.1:2222): known_hosts has ssh-rsa SHA256:")
    assert f"ssh-keygen -R '[10.0.0.1]:2222' -f {tmp_path / 'kh'}" in message


def _banner_error(cause: BaseException | None, text: str = "Error reading SSH protocol banner") -> Exception:
    """An SSHException as Paramiko raises it: chained to what the banner read hit, if anything."""
    try:
        try:
            if cause is not None:
                raise cause
        finally:
            raise paramiko.SSHException(text)
    except paramiko.SSHException as exc:
        return exc


@pytest.mark.parametrize(
    ("cause", "text", "elapsed", "message"),
    [
        (
            EOFError(),
            "Error reading SSH protocol banner",
            0.02,
            "closed the connection during the SSH banner after 0.02s",
        ),
        (
            ConnectionResetError(104, "reset"),
            "Error reading SSH protocol banner",
            None,
            "closed the connection during the SSH banner (",
        ),
        (TimeoutError(), "Error reading SSH protocol banner", 5.0, "sent no SSH banner within 5s"),
        (None, "No existing session", 0.4, "closed the connection during the SSH banner after 0.40s"),
        (None, "No existing session", 5.01, "sent no SSH banner within 5s"),
    ],
)
def test_a_banner_failure_says_hung_up_or_timed_out(
    cause: BaseException | None, text: str, elapsed: float | None, message: str, tmp_path: Path
) -> None:
    target = ssh_target(name="gpu")
    conn = make_connection(target, FleetOptions(known_hosts=tmp_path / "kh"))
    said = connect_error_message(target, conn, _banner_error(cause, text), tmp_path / "kh", elapsed_s=elapsed)
    assert said.startswith("gpu (10.0.0.1:2222) ") and message in said, said
