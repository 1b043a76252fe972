"""Speaking the agent protocol with one host: `AgentSession.call`, the tool's one transport seam.

The same command and envelope (docs/ARCHITECTURE.md, "The agent protocol") over SSH and for `local` hosts:
the agent is uploaded once per version, every call is one command with its request on stdin, and every
failure comes back as a plain-words error.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import AgentError, ConnectionFailed
from ..facts import Facts
from ..protocol import ERROR_KINDS, SIMULATE_ENV
from ..records import Record, RecordError
from .options import AgentPayload, FleetOptions
from .targets import HostTarget, describe

if TYPE_CHECKING:
    import fabric
    import paramiko
    from pydantic import BaseModel, ValidationError

CONNECTION_LOST = -1  # Paramiko's exit status when the channel closed without one (sshd killed, link cut)
AGENT_MISSING = 97  # the cached-agent command's "upload me, then run again" exit code
CACHE_DIR = ".cache/mgpu-provision"  # under the login user's home


def agent_command(agent_name: str, python: str, verb: str, sudo: bool) -> str:
    """The one shell command that runs the cached agent, or prints its cache folder and exits 97 when the
    agent is not there yet (the upload then goes exactly where this command looks, whatever HOME is).

    It prefers the folder the agent unpacks itself into on its first run (`agent-H/` beside `agent-H.pyz`):
    Python caches bytecode there, never for a zipapp. The zipapp stays the fallback (read-only homes). The
    login shell's MGPU_PROVISION_SIMULATE travels as an argument: sudo's env_reset would drop the variable,
    and the agent would then read the real machine instead of its twin. The agent is stdlib only: `-S -I`
    skip site-packages and their .pth files (start-up every call pays) and the login's PYTHON* variables
    (PYTHONDONTWRITEBYTECODE would keep the unpacked agent from caching its bytecode).
    """
    run = f"exec {'sudo -n ' if sudo else ''}{shlex.quote(python)} -S -I"
    args = f'{shlex.quote(verb)} "${{{SIMULATE_ENV}-}}"'
    folder = agent_name.removesuffix(".pyz")
    return (
        f'c=~/{CACHE_DIR}; d="$c/{folder}"; [ -f "$d/__main__.py" ] && {run} "$d" {args}; '
        f'f="$c/{agent_name}"; [ -f "$f" ] || {{ printf %s "$c"; exit {AGENT_MISSING}; }}; {run} "$f" {args}'
    )


def partial_name(folder: str, agent_name: str) -> str:
    """Where an upload writes before its rename, so that a concurrent run never executes half a zipapp."""
    return f"{folder}/.{agent_name}.{os.urandom(16).hex()}.partial"


def upload_command(folder: str, partial: str, final: str) -> str:
    """The shell command that stores the agent's bytes from its stdin as `final` by way of `partial`, as
    Ansible's piped transfer does (no SFTP needed)."""
    quoted = {name: shlex.quote(path) for name, path in (("f", folder), ("p", partial), ("t", final))}
    return (
        f"umask 077 && mkdir -p {quoted['f']} && chmod 700 {quoted['f']} && cat > {quoted['p']} "
        f"&& mv -f {quoted['p']} {quoted['t']}"
    )


def cache_folder(stdout: str) -> str:
    """Where the command looks for the agent, from its last line (a login's startup files may print first);
    the login home's relative folder, where SFTP starts, when it printed no absolute path."""
    lines = stdout.strip().splitlines()
    return lines[-1] if lines and lines[-1].startswith("/") else CACHE_DIR


def folder_chain(folder: str) -> list[str]:
    """Each folder from the top down to `folder`, absolute or relative as `folder` is: a relative one is
    under the login home, where SFTP starts, and must not be made at the server's root instead."""
    root = "/" if folder.startswith("/") else ""
    parts = [part for part in folder.split("/") if part]
    return [root + "/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]


def _first_missing(sftp: paramiko.SFTPClient, folder: str, refused: dict[str, OSError]) -> OSError:
    """Why `folder` is not there: the first folder of its chain that is missing, with the error its mkdir
    met (a chmod's "No such file" names neither). Costs round trips only when the upload has failed."""
    for path in folder_chain(folder):
        try:
            sftp.stat(path)
        except OSError:
            return OSError(f"cannot make {path}: {refused.get(path, 'it vanished')}")
    return FileNotFoundError(f"{folder} vanished during the upload")


def parse_response(where: str, verb: str, exit_code: int, stdout: str, stderr: str) -> dict[str, Any]:
    """The agent's `result`, or an AgentError that says in plain words what went wrong."""
    if exit_code == AGENT_MISSING:
        raise AgentError(f"agent is still missing on {where} after uploading it (is ~/{CACHE_DIR} writable?)")
    if "a password is required" in stderr:
        raise AgentError(
            f"sudo needs a password on {where}; allow NOPASSWD for the login user to run the agent's "
            "python (or log in as root, or set become: false)"
        )
    if exit_code == CONNECTION_LOST:
        raise AgentError(f"the connection to {where} was lost during agent {verb} (no exit status came back)")
    if exit_code != 0:
        lines = [line for line in stderr.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "no error output"
        raise AgentError(f"agent {verb} crashed on {where} (exit {exit_code}): {last}")
    try:
        response = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise AgentError(f"agent {verb} on {where} answered something that is not JSON: {exc}") from exc
    if not isinstance(response, dict) or not isinstance(response.get("ok"), bool):
        raise AgentError(f"agent {verb} on {where} answered JSON without an `ok` field")
    if not response["ok"]:
        error = response.get("error") or {}
        kind = error.get("kind", "error") if isinstance(error, dict) else "error"
        message = error.get("message", error) if isinstance(error, dict) else error
        if kind not in ERROR_KINDS:
            raise AgentError(
                f"agent {verb} on {where} answered an error of a kind this version does not know ({kind!r}; "
                f"it knows {', '.join(ERROR_KINDS)}): {message}"
            )
        raise AgentError(f"agent {verb} failed on {where} ({kind}): {message}")
    result = response.get("result")
    if not isinstance(result, dict):
        raise AgentError(f"agent {verb} on {where} answered ok without a `result` object")
    return result


class AgentSession(ABC):
    """Speaks the agent protocol with one host; one per host and worker thread, never shared."""

    def __init__(self, target: HostTarget, agent: AgentPayload) -> None:
        self.target = target
        self.agent = agent
        self.commands = 0  # agent commands run on this host so far (uploads are not commands)

    @property
    def where(self) -> str:
        return describe(self.target)

    def call(self, verb: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Run one agent verb and return its result; uploads the agent first if the host lacks it."""
        request = json.dumps({"args": args, "simulate": self.target.simulate})
        limit = timeout if timeout is not None else self.target.command_timeout_s
        command = agent_command(self.agent.name, self.target.python, verb, self._needs_sudo())
        code, out, err = self._run(command, request, limit, verb)
        if code == AGENT_MISSING:
            self._upload(cache_folder(out))
            code, out, err = self._run(command, request, limit, verb)
        return parse_response(self.where, verb, code, out, err)

    def close(self) -> None:  # noqa: B027 - only SSH sessions hold something to release
        """Release the connection; idempotent."""

    @abstractmethod
    def _run(self, command: str, stdin: str, limit: float, verb: str) -> tuple[int, str, str]:
        """Run the shell command with `stdin`; (exit code, stdout, stderr)."""

    @abstractmethod
    def _upload(self, folder: str) -> None:
        """Put the agent at <folder>/<name> atomically; `folder` is the cache folder the command looks in."""

    @abstractmethod
    def _needs_sudo(self) -> bool:
        """Whether `become` needs `sudo -n` for this login."""

    def _timed_out(self, verb: str, limit: float) -> AgentError:
        return AgentError(f"agent {verb} did not finish within {limit:g}s on {self.where}")


class SshAgentSession(AgentSession):
    """The agent over one Fabric Connection (opened by `ssh.open_connection`)."""

    def __init__(self, target: HostTarget, agent: AgentPayload, conn: fabric.Connection) -> None:
        super().__init__(target, agent)
        self.conn = conn

    @property
    def where(self) -> str:
        return describe(self.target, self.conn)

    def close(self) -> None:
        from .ssh import close_connection  # loaded already: this session's connection was opened by it

        close_connection(self.conn)

    def _needs_sudo(self) -> bool:
        return self.target.become and self.conn.user != "root"

    def _run(self, command: str, stdin: str, limit: float, verb: str) -> tuple[int, str, str]:
        import paramiko  # SSH only: a local-only run never loads it (docs/ARCHITECTURE.md, "Start-up")

        self.commands += 1
        try:
            return exec_channel(self.conn.client.get_transport(), command, stdin.encode(), limit)
        except TimeoutError as exc:
            raise self._timed_out(verb, limit) from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectionFailed(f"lost the connection to {self.where} during agent {verb}: {exc}") from exc

    def _upload(self, folder: str) -> None:
        import paramiko  # SSH only: a local-only run never loads it

        # Upload under a temporary name and rename, so a concurrent run never executes half a zipapp.
        final = f"{folder}/{self.agent.name}"
        partial = partial_name(folder, self.agent.name)
        try:
            sftp = self.conn.sftp()
        except (paramiko.SSHException, EOFError):  # the server offers no SFTP (hardened images disable it)
            self._upload_through_shell(folder, partial, final)
            return
        try:
            refused: dict[str, OSError] = {}
            for path in folder_chain(folder):
                try:
                    sftp.mkdir(path, mode=0o700)
                except OSError as exc:  # most often: it is there already
                    refused[path] = exc
            try:
                sftp.chmod(folder, 0o700)
            except FileNotFoundError:
                raise _first_missing(sftp, folder, refused) from None
            with sftp.open(partial, "wb") as out:
                out.write(self.agent.data)
            sftp.chmod(partial, 0o600)
            sftp.posix_rename(partial, final)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise AgentError(f"cannot upload the agent to {folder} on {self.where}: {exc}") from exc

    def _upload_through_shell(self, folder: str, partial: str, final: str) -> None:
        """The agent's bytes on the command's stdin, as Ansible's piped transfer does without SFTP."""
        import paramiko  # SSH only: a local-only run never loads it

        command = upload_command(folder, partial, final)
        self.commands += 1
        try:
            code, _, err = exec_channel(self.conn.client.get_transport(), command, self.agent.data, 120.0)
        except (TimeoutError, paramiko.SSHException, EOFError, OSError) as exc:
            raise AgentError(f"cannot send the agent to {folder} on {self.where}: {exc}") from exc
        if code != 0:
            last = (err.strip().splitlines() or [f"exit {code}"])[-1]
            raise AgentError(f"cannot send the agent to {folder} on {self.where} (no SFTP): {last}")


class LocalAgentSession(AgentSession):
    """The agent on this machine (`connection: local`): same command and protocol, no SSH."""

    def _needs_sudo(self) -> bool:
        return self.target.become and os.geteuid() != 0

    def _run(self, command: str, stdin: str, limit: float, verb: str) -> tuple[int, str, str]:
        self.commands += 1
        # A session of its own: on timeout the whole group goes (sh, sudo and the agent under it);
        # killing only `sh` would leave the agent running, as root under sudo.
        with subprocess.Popen(
            ["sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as process:
            try:
                stdout, stderr = process.communicate(stdin, timeout=limit)
            except subprocess.TimeoutExpired as exc:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise self._timed_out(verb, limit) from exc
        return process.returncode, stdout, stderr

    def _upload(self, folder: str) -> None:
        cache = Path(folder) if folder.startswith("/") else Path.home() / folder
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = cache / f".{self.agent.name}.{os.urandom(16).hex()}.partial"
        partial.write_bytes(self.agent.data)
        partial.chmod(0o600)
        partial.replace(cache / self.agent.name)


Reply = TypeVar("Reply", bound="BaseModel | Record")


def read_reply(
    session: AgentSession,
    verb: str,
    args: dict[str, Any],
    model: type[Reply],
    timeout: float | None = None,
    what: str = "a reply",
) -> Reply:
    """One verb's result, validated against its contract at the seam (a drift is an AgentError naming the
    fields, never a traceback from the job that reads it)."""
    return validated(session.call(verb, args, timeout), model, verb, session.where, what)


def validated(
    answer: dict[str, Any], model: type[Reply], verb: str, where: str, what: str = "a reply"
) -> Reply:
    """`answer` as `model` (a plain record such as Facts, or a pydantic model: pydantic is imported only
    for those), or an AgentError naming the fields that drifted from the contract."""
    drift: type[RecordError | ValidationError] = RecordError
    if not issubclass(model, Record):
        from pydantic import ValidationError as drift
    try:
        return model.model_validate(answer)  # type: ignore[return-value]
    except drift as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'result'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        raise AgentError(
            f"agent {verb} on {where} answered {what} this version cannot read: {problems}"
        ) from exc


def read_facts(session: AgentSession, request: dict[str, Any], timeout: float | None = None) -> Facts:
    """The `facts` verb, validated against the Facts contract at the seam (a drift is an AgentError)."""
    return read_reply(session, "facts", request, Facts, timeout, what="facts")


def exec_channel(
    transport: paramiko.Transport, command: str, stdin: bytes, limit: float
) -> tuple[int, str, str]:
    """Run one command on its own channel: write stdin, collect both streams, all within `limit` seconds.

    Paramiko directly rather than Fabric's `run`: invoke's stdin thread fails with "Socket is closed" when the
    command ends before reading its input, which the cached-agent command does on purpose (exit 97).
    Opening the channel is bounded by the transport's `channel_timeout` (set in ssh.py).

    The wait sleeps in `select` on the channel's pipe, which Paramiko makes readable whenever either stream
    has data or the channel ends. Polling it every 2 ms instead, while each host's agent works for a few
    hundred milliseconds, cost ~3 ms of CPU per host: a quarter of the control side's whole share.
    """
    deadline = time.monotonic() + limit
    channel = transport.open_session()
    try:
        ready = channel.fileno()
        channel.exec_command(command)
        with contextlib.suppress(OSError):  # the command may exit without reading its input
            channel.sendall(stdin)
            channel.shutdown_write()
        out, err = bytearray(), bytearray()
        # Both streams drained as data comes: an unread stream would fill the channel's shared window and
        # stall the other.
        while True:
            # Read before draining. The end is the EOF (or the close), not the exit status: sshd sends the
            # status when the command's process exits, which can come before the last of its output (a
            # child that still holds stdout, or an sshd slow to read the pipe), and no data follows an EOF.
            ended = channel.eof_received or channel.closed
            finished = channel.exit_status_ready()
            while channel.recv_ready():
                out += channel.recv(65536)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            if ended and finished:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(command)
            if ended:  # no more data can come and the pipe stays readable: wait for the status
                channel.status_event.wait(remaining)
            else:  # readable at the next data or at the EOF
                select.select([ready], [], [], remaining)
        return channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace")
    finally:
        channel.close()


def open_session(target: HostTarget, options: FleetOptions, agent: AgentPayload) -> AgentSession:
    """A session ready for `call`; raises ConnectionFailed when the host cannot be reached. `options.sessions`
    opens it instead where set (the tests' injected fake: tests/support/factories.py)."""
    if options.sessions is not None:
        opened = options.sessions(target, options, agent)
        if not isinstance(opened, AgentSession):
            raise TypeError(f"FleetOptions.sessions returned {type(opened).__name__}, not an AgentSession")
        return opened
    if target.connection == "local":
        return LocalAgentSession(target, agent)
    from .ssh import open_connection  # Fabric and Paramiko load with the first SSH connection, not before

    return SshAgentSession(target, agent, open_connection(target, options))
