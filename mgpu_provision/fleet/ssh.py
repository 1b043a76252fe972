"""Opening one SSH connection safely: Fabric with host-key checking, every timeout set, plain error messages.

Fabric's defaults are wrong for a provisioning tool: it accepts unknown host keys silently, it has no bound on
the SSH banner or on opening a session (fabric issue 2197), Paramiko's failures surface as exception types a
person cannot act on, and its sockets keep Nagle's algorithm on (each agent call waited for a delayed
acknowledgement). This module fixes those four things and nothing else; the worker pool and the agent
protocol live in `pool.py` and `session.py`.

The Fabric config is not shared between connections: a Connection writes setting changes into its config
(invoke merges them), which races between threads (seen at 64 hosts). What the configs read (the ssh_config,
known_hosts, the key files) is read once per run and shared instead (`options.SharedSsh`).
"""

from __future__ import annotations

import logging
import math
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import fabric
import paramiko

from ..errors import ConnectionFailed
from .known_hosts import KnownHosts
from .options import FleetOptions, SharedSsh
from .targets import HostTarget, describe

# Paramiko logs every failed transport at ERROR, traceback included, and where nothing configured logging
# Python's last-resort handler prints those records on stderr. Each failure reaches the person as one
# message from `connect_error_message`; a program that configures logging itself still gets the records.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# How the peer ended the SSH banner exchange, as the cause Paramiko chains to its SSHException.
_HUNG_UP = (EOFError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)


def known_hosts_name(address: str, port: int) -> str:
    """How OpenSSH (and Paramiko) name a host in known_hosts: `[addr]:port` unless the port is 22."""
    return address if port == 22 else f"[{address}]:{port}"


def _key_words(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class UnknownHostKey(ConnectionFailed):
    """The host offered a key that known_hosts does not list (and new keys were not to be accepted)."""


class _RejectUnknown(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    def __init__(self, where: str, known_hosts: Path) -> None:
        self._where, self._known_hosts = where, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        address, _, port = hostname.removeprefix("[").partition("]:")
        # On a clean HOME ~/.ssh does not exist yet, and `>> ~/.ssh/known_hosts` would fail in the shell.
        folder = self._known_hosts.parent
        make = "" if folder.is_dir() else f"mkdir -p -m 700 {folder} && "
        raise UnknownHostKey(
            f"host key of {self._where} is not in known_hosts ({self._known_hosts}); it offered "
            f"{_key_words(key)}. Verify it and run with --accept-new-host-keys, or add it with "
            f"`{make}ssh-keyscan -p {port or 22} {address} >> {self._known_hosts}`"
        )


class _AcceptNew(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    """Like OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys; changed keys still fail."""

    def __init__(self, known_hosts: KnownHosts) -> None:
        self._known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self._known_hosts.record(hostname, key)
        # OpenSSH's words (sshconnect.c), so a trusted key is never recorded silently.
        kind = key.get_name().removeprefix("ssh-").split("-")[0].upper()
        print(
            f"Warning: Permanently added '{hostname}' ({kind}) to the list of known hosts "
            f"({self._known_hosts.path}).",
            file=sys.stderr,
        )


def _known_hosts_path(conn: fabric.Connection, options: FleetOptions) -> Path:
    if options.known_hosts is not None:
        return options.known_hosts
    configured = conn.ssh_config.get("userknownhostsfile")
    if configured:
        return Path(str(configured).split()[0]).expanduser()
    return Path("~/.ssh/known_hosts").expanduser()


def _guard_host_keys(conn: fabric.Connection, where: str, options: FleetOptions) -> None:
    """Replace Fabric's AutoAddPolicy on this connection and on every gateway hop before it."""
    path = _known_hosts_path(conn, options)
    known_hosts = shared_ssh(options).known_hosts(path)
    # Only this host's keys, from the run's one parse of the file: Paramiko's own lookup scans every entry.
    name = known_hosts_name(conn.host, conn.port)
    for key_type, key in known_hosts.keys_of(name).items():
        conn.client.get_host_keys().add(name, key_type, key)
    policy: paramiko.MissingHostKeyPolicy = (
        _AcceptNew(known_hosts) if options.accept_new_host_keys else _RejectUnknown(where, path)
    )
    conn.client.set_missing_host_key_policy(policy)
    if isinstance(conn.gateway, fabric.Connection):
        _guard_host_keys(conn.gateway, describe_jump(conn.gateway), options)


def describe_jump(gateway: fabric.Connection) -> str:
    return f"jump host {gateway.host} ({gateway.host}:{gateway.port})"


def _timeouts(seconds: float) -> dict[str, float]:
    # Paramiko's own bounds for the phases Fabric leaves open: banner, authentication, opening a channel.
    return {"banner_timeout": seconds, "auth_timeout": seconds, "channel_timeout": seconds}


_SHARED_LOCK = threading.Lock()


def shared_ssh(options: FleetOptions) -> SharedSsh:
    """The run's shared SSH state, kept on its options (made by whichever worker needs it first)."""
    with _SHARED_LOCK:
        if options.shared_ssh is None:
            options.shared_ssh = SharedSsh()
        return options.shared_ssh


def make_connection(target: HostTarget, options: FleetOptions) -> fabric.Connection:
    """An unopened Fabric Connection for the target with host keys guarded and every timeout set."""
    shared = shared_ssh(options)
    config = fabric.Config(ssh_config=shared.ssh_config(options.ssh_config))
    # Fabric truncates connect_timeout to an int (and 0 means none), so round up to a whole second.
    connect_timeout = max(1, math.ceil(target.connect_timeout_s))
    connect_kwargs: dict[str, Any] = _timeouts(target.connect_timeout_s)
    if target.identity_file:
        if not Path(target.identity_file).is_file():  # Paramiko would say "No such file" without the name
            raise ConnectionFailed(
                f"cannot log in to {describe(target)}: its SSH key {target.identity_file} does not exist "
                "(identity_file)"
            )
        # Read once per run: named as a file, Paramiko reads it per connection, up to once per key type.
        key = shared.private_key(target.identity_file)
        if key is not None:
            connect_kwargs["pkey"] = key
        else:
            connect_kwargs["key_filename"] = [target.identity_file]
    gateway = None
    if target.jump:
        gateway = fabric.Connection(
            target.jump,
            config=config,
            connect_timeout=connect_timeout,
            connect_kwargs=dict(connect_kwargs),
        )
    conn = fabric.Connection(
        target.address,
        user=target.user,
        port=target.port,
        config=config,
        gateway=gateway,
        connect_timeout=connect_timeout,
        connect_kwargs=connect_kwargs,
    )
    _guard_host_keys(conn, describe(target, conn), options)
    return conn


def open_connection(target: HostTarget, options: FleetOptions) -> fabric.Connection:
    """Connect and authenticate; every failure becomes a ConnectionFailed with a plain message.

    A jump host is opened first, on its own, so that its failures name it rather than the target behind
    it (Fabric would open it inside the target's `open` and raise the same exception types).
    """
    conn = make_connection(target, options)
    gateway = conn.gateway if isinstance(conn.gateway, fabric.Connection) else None
    hop, started = conn, time.monotonic()
    try:
        if gateway is not None:
            hop = gateway
            gateway.open()
            hop, started = conn, time.monotonic()
        conn.open()
    except BaseException as exc:
        close_connection(conn)
        if isinstance(exc, Exception):
            where = describe(target, conn)
            if hop is gateway:
                where = f"{describe_jump(hop)} on the way to {where}"
            elapsed = time.monotonic() - started
            known_hosts = _known_hosts_path(hop, options)
            message = connect_error_message(target, hop, exc, known_hosts, where=where, elapsed_s=elapsed)
            raise ConnectionFailed(message) from exc
        raise
    for opened in (gateway, conn):
        if opened is not None:
            _send_at_once(opened)
    return conn


def _send_at_once(conn: fabric.Connection) -> None:
    """TCP_NODELAY on the connection's own socket (a jump host's target rides a channel and has none).

    Paramiko sets no socket option, so Nagle's algorithm holds a small packet while an earlier one is not
    yet acknowledged, and the peer delays that acknowledgement (~40 ms on Linux). Every agent call sends
    its request and then its end of input as two small packets: each call waited ~25 ms for the second
    (an agent's facts 64 ms against 36 ms with this option, on one loopback host). Paramiko sends each SSH
    packet in one write, so nothing is split smaller for it; OpenSSH sets the same option on its sessions.
    """
    sock = conn.client.get_transport().sock
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def close_connection(conn: fabric.Connection) -> None:
    """Close the connection and every jump host before it: Fabric's `close` leaves the gateway logged in."""
    conn.close()
    if isinstance(conn.gateway, fabric.Connection):
        close_connection(conn.gateway)


def connect_error_message(
    target: HostTarget,
    conn: fabric.Connection,
    exc: Exception,
    known_hosts: Path,
    where: str | None = None,
    elapsed_s: float | None = None,
) -> str:
    """What went wrong while connecting `conn` (the target, or the jump host before it), in plain words.

    `where` names the hop for the person (default: the target); `elapsed_s`, how long the attempt took,
    tells a peer that hung up from one that never answered when Paramiko's exception does not.
    """
    where = where or describe(target, conn)
    if isinstance(exc, ConnectionFailed):
        return str(exc)
    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            f"HOST KEY CHANGED for {where}: known_hosts has {_key_words(exc.expected_key)} but the host "
            f"offered {_key_words(exc.key)}. Refusing to connect: this may be a man-in-the-middle attack or "
            f"a reinstalled box. If you know why it changed, remove the old entry with "
            f"`ssh-keygen -R '{known_hosts_name(conn.host, conn.port)}' -f {known_hosts}` and connect again "
            "(--accept-new-host-keys never overrides it)"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        key = f" with key {target.identity_file}" if target.identity_file else ""
        return f"authentication failed on {where} as {conn.user}{key}: {exc}"
    if isinstance(exc, paramiko.SSHException) and "No authentication methods available" in str(exc):
        return (
            f"cannot log in to {where} as {conn.user}: no SSH key to offer (no identity_file in the rig "
            "file, no ~/.ssh/id_ed25519, id_ecdsa or id_rsa, no ssh-agent); set identity_file (on the host "
            "or under defaults) or load a key with ssh-add"
        )
    if isinstance(exc, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError)):
        return f"connection refused by {where}: nothing listens there (is sshd running?)"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {where}: {exc.strerror}"
    if isinstance(exc, TimeoutError):
        return f"no answer from {where} within {target.connect_timeout_s:g}s (connect timeout)"
    if isinstance(exc, paramiko.ChannelException):  # the jump host's sshd could not reach the target
        jump = describe_jump(conn.gateway) if isinstance(conn.gateway, fabric.Connection) else "the jump host"
        return (
            f"{jump} cannot open a connection to {where}: {exc.text} "
            "(nothing listens there, or the jump host may not reach it)"
        )
    # Paramiko reports a missing banner either directly or, when its auth step wins the race against the
    # transport thread, as "No existing session" (then without a cause: the time taken tells).
    if isinstance(exc, paramiko.SSHException) and any(
        words in str(exc) for words in ("banner", "No existing session", "Negotiation failed")
    ):
        cause = exc.__context__
        hung_up = isinstance(cause, _HUNG_UP)
        if cause is None and elapsed_s is not None:
            hung_up = elapsed_s < 0.9 * target.connect_timeout_s
        if hung_up:
            after = f" after {elapsed_s:.2f}s" if elapsed_s is not None else ""
            return (
                f"{where} closed the connection during the SSH banner{after} (not an SSH server, or sshd "
                "turned the connection away: MaxStartups, a firewall, TCP wrappers)"
            )
        return (
            f"{where} accepted the connection but sent no SSH banner within {target.connect_timeout_s:g}s "
            "(not an SSH server, or sshd is hung)"
        )
    if isinstance(exc, EOFError):
        return f"{where} closed the connection during the SSH handshake"
    if isinstance(exc, OSError):
        return f"cannot connect to {where}: {exc.strerror or exc}"
    return f"cannot connect to {where}: {type(exc).__name__}: {exc}"
