"""What one host costs the control side, counted rather than timed (issue 20): files read per run, SSH
commands per facts call, and how the wait for a command's answer is spent."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paramiko
import pytest

from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.pool import run_fleet
from mgpu_provision.fleet.session import AgentSession, exec_channel
from mgpu_provision.fleet.ssh import close_connection, open_connection
from mgpu_provision.fleet.targets import HostTarget
from tests.support.hosts import HostFactory, TestHost, fake_agent

_OPENED: list[str] | None = None  # paths opened while `counting_opens` is active


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, Path)):
        _OPENED.append(str(args[0]))


sys.addaudithook(_audit)  # process-wide and permanent: it records nothing outside `counting_opens`


@contextmanager
def counting_opens() -> Iterator[list[str]]:
    """Every file opened meanwhile, by any thread and any means (open, io.open, pathlib): audit events."""
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def target(host: TestHost, factory: HostFactory) -> HostTarget:
    return HostTarget(
        host.name, host.address, host.port, "root", str(factory.client_key), None, True, "/usr/bin/python3",
        "ssh", None, 5.0, 30.0,
    )  # fmt: skip


def test_a_run_reads_the_key_file_and_known_hosts_once_whatever_the_hosts(test_hosts: HostFactory) -> None:
    hosts = [test_hosts.start(f"gpu-{i}") for i in range(4)]
    options = FleetOptions(known_hosts=test_hosts.known_hosts, agent=fake_agent("once"))
    with counting_opens() as opened:
        outcomes = run_fleet([target(h, test_hosts) for h in hosts], lambda s: s.call("facts", {}), options)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    # Paramiko named a key file reads it once per key type it tries, on every connection (12 opens here).
    assert 1 <= opened.count(str(test_hosts.client_key)) <= 2  # read, then parsed as its type
    assert opened.count(str(test_hosts.known_hosts)) == 1


def test_a_facts_call_on_a_host_holding_the_agent_is_one_login_and_one_ssh_command(
    test_hosts: HostFactory,
) -> None:
    host = test_hosts.start("gpu-a")
    options = FleetOptions(known_hosts=test_hosts.known_hosts, agent=fake_agent("one-command"))

    def facts(session: AgentSession) -> dict[str, Any]:
        return session.call("facts", {})

    assert run_fleet([target(host, test_hosts)], facts, options)[host.name].status == "ok"  # uploads it
    before = host.log()
    assert run_fleet([target(host, test_hosts)], facts, options)[host.name].status == "ok"
    after = host.log()[len(before) :]
    # sshd at LogLevel VERBOSE logs every exec and subsystem channel: no probe before the command, no SFTP.
    assert after.count("Accepted publickey for root") == 1
    assert after.count("Starting session: ") == 1


def test_waiting_for_a_command_sleeps_instead_of_polling(
    test_hosts: HostFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = test_hosts.start("gpu-a")
    conn = open_connection(target(host, test_hosts), FleetOptions(known_hosts=test_hosts.known_hosts))
    checks = 0
    recv_ready = paramiko.Channel.recv_ready

    def counted(channel: paramiko.Channel) -> bool:
        nonlocal checks
        checks += 1
        return bool(recv_ready(channel))

    monkeypatch.setattr(paramiko.Channel, "recv_ready", counted)
    try:
        command = "read line; sleep 0.6; echo \"got $line\"; echo oops >&2; exit 3"
        answer = exec_channel(conn.client.get_transport(), command, b"hello\n", 10.0)
        with pytest.raises(TimeoutError):
            exec_channel(conn.client.get_transport(), "sleep 5", b"", 0.3)
    finally:
        conn.close()
    assert answer == (3, "got hello\n", "oops\n")
    # Woken by data and by the end of the command only: polling every 2 ms checked ~300 times here.
    assert checks < 40


def test_output_that_comes_after_the_exit_status_is_kept(test_hosts: HostFactory) -> None:
    """sshd sends the exit status when the command's process ends; a child still holding its stdout writes
    afterwards. The answer is all the output up to the EOF, not what had come when the status did."""
    host = test_hosts.start("gpu-a")
    conn = open_connection(target(host, test_hosts), FleetOptions(known_hosts=test_hosts.known_hosts))
    try:
        command = "(sleep 0.3; echo late; sleep 0.3; echo later; echo on stderr >&2) & exit 4"
        answer = exec_channel(conn.client.get_transport(), command, b"", 10.0)
    finally:
        conn.close()
    assert answer == (4, "late\nlater\n", "on stderr\n")


def test_a_run_through_a_jump_host_leaves_no_connection_open(test_hosts: HostFactory) -> None:
    jump, inner = test_hosts.start("bastion"), test_hosts.start("gpu-b")
    via = target(inner, test_hosts)._replace(jump=f"root@{jump.address}:{jump.port}")
    before = set(threading.enumerate())
    options = FleetOptions(known_hosts=test_hosts.known_hosts, agent=fake_agent("jump"))
    outcome = run_fleet([via], lambda s: s.call("facts", {}), options)["gpu-b"]
    assert outcome.status == "ok", outcome.error
    # Fabric closes a connection but not its gateway: each host reached through a bastion kept a login and
    # a Paramiko transport thread to it until the program ended.
    started = [t for t in set(threading.enumerate()) - before if isinstance(t, paramiko.Transport)]
    for thread in started:  # a closed transport's thread ends on its own, a moment after `close`
        thread.join(2.0)
    assert [t for t in started if t.is_alive()] == []


def test_every_socket_a_run_opens_sends_each_packet_at_once(test_hosts: HostFactory) -> None:
    """Issue 41: an agent call sends its request, then its end of input, as two small packets. With
    Nagle's algorithm on (Paramiko sets no socket option) the second waited for the first's delayed
    acknowledgement: a one-host facts call took 64 ms instead of 36. Every TCP socket of a run is
    TCP_NODELAY, a jump host's too; the target behind it rides the jump host's channel."""
    jump, inner = test_hosts.start("bastion"), test_hosts.start("gpu-c")
    options = FleetOptions(known_hosts=test_hosts.known_hosts)
    direct = open_connection(target(inner, test_hosts), options)
    hop = f"root@{jump.address}:{jump.port}"
    via = open_connection(target(inner, test_hosts)._replace(jump=hop), options)
    try:
        sockets = [c.client.get_transport().sock for c in (direct, via.gateway)]
        assert [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0 for s in sockets] == [True, True]
        assert isinstance(via.client.get_transport().sock, paramiko.Channel)
    finally:
        close_connection(via)
        close_connection(direct)
