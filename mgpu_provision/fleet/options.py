"""How a run goes over the fleet: how many hosts at a time, host-key policy, and what its connections share.

What every connection of a run reads alike is read once per run and shared (`SharedSsh`): the known_hosts
files, the private key files and the ssh_config. Read per host, they cost CPU on every connection (known_hosts
even time growing with the square of the fleet).
"""

from __future__ import annotations

import errno
import io
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from ..errors import ConnectionFailed
from .known_hosts import KnownHosts

if TYPE_CHECKING:
    import paramiko

    from .targets import HostTarget

MAX_FORKS = 64
# Where Fabric looks for ssh_config when none is given, in its order.
USER_SSH_CONFIG = Path("~/.ssh/config")
SYSTEM_SSH_CONFIG = Path("/etc/ssh/ssh_config")


class AgentPayload(Protocol):
    """What the fleet needs of `agent.bundle.AgentBundle`: the zipapp bytes and its content-addressed name."""

    @property
    def data(self) -> bytes: ...

    @property
    def name(self) -> str: ...


class SessionOpener(Protocol):
    """Opens a host's session in place of SSH or a local process; what it returns must be a
    `session.AgentSession` (checked where it is opened: naming that class here would tie this module and
    session.py in a circle)."""

    def __call__(self, target: HostTarget, options: FleetOptions, agent: AgentPayload) -> object: ...


# ssh_config(5) keywords whose value is a number: Paramiko takes `Port abc` and fails later, deep inside.
_NUMERIC_KEYWORDS = {
    "port", "connecttimeout", "connectionattempts", "serveraliveinterval", "serveralivecountmax",
}  # fmt: skip


def ssh_config_problem(lines: list[str]) -> tuple[int, str] | None:
    """The first line of an ssh_config Paramiko cannot use, as (line number, why), or None."""
    import paramiko

    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = paramiko.SSHConfig.SETTINGS_REGEX.match(line)
        if match is None:
            return number, f"{line.split()[0]} has no value"
        keyword, value = match.group(1).lower(), match.group(2).strip().strip('"')
        if keyword in _NUMERIC_KEYWORDS and not value.isdigit():
            return number, f"{match.group(1)} {value!r} is not a whole number"
    return None


def parse_ssh_config(config: paramiko.SSHConfig, path: Path) -> None:
    """Add the ssh_config file `path` to `config`; a line that cannot be used is a ConnectionFailed naming
    the file, the line and why (Paramiko's own error names neither file nor line, and a bad number only
    surfaces as a traceback when a connection reads it)."""
    import paramiko

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConnectionFailed(f"cannot read the ssh_config {path}: {exc}") from None
    problem = ssh_config_problem(text.splitlines())
    if problem is None:
        try:
            config.parse(io.StringIO(text))
            return
        except paramiko.ssh_exception.ConfigParseError as exc:
            problem = (0, str(exc))
    number, why = problem
    where = f"{path}, line {number}" if number else str(path)
    raise ConnectionFailed(
        f"{where}: {why}: fix or remove that line (ssh_config(5)), or pass --ssh-config FILE"
    )


@dataclass
class SharedSsh:
    """One run's parsed known_hosts files and private keys (per path) and its ssh_config, made on first use
    by whichever worker needs them, then read by all (keys and SSHConfig lookups change nothing; known_hosts
    gains accepted keys under its own lock)."""

    host_keys: dict[Path, KnownHosts] = field(default_factory=dict)
    private_keys: dict[str, paramiko.PKey | None] = field(default_factory=dict)
    parsed_ssh_config: paramiko.SSHConfig | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def known_hosts(self, path: Path) -> KnownHosts:
        with self.lock:
            if path not in self.host_keys:
                self.host_keys[path] = KnownHosts(path)
            return self.host_keys[path]

    def private_key(self, path: str) -> paramiko.PKey | None:
        """The key in `path` (and its `-cert.pub` certificate), or None when it cannot be read without help
        (a passphrase, a missing file): the connection then names the file to Paramiko, which tries it and
        goes on to the ssh-agent and the default keys, and reports why it failed as before."""
        import paramiko  # only once a connection opens

        with self.lock:
            if path not in self.private_keys:
                try:
                    self.private_keys[path] = paramiko.PKey.from_path(path)
                except (OSError, ValueError, TypeError, paramiko.SSHException, paramiko.pkey.UnknownKeyType):
                    self.private_keys[path] = None
            return self.private_keys[path]

    def ssh_config(self, runtime: Path | None) -> paramiko.SSHConfig:
        """The ssh_config Fabric would read for each connection: `runtime` alone (OpenSSH's -F) when given,
        else ~/.ssh/config then /etc/ssh/ssh_config, where they exist."""
        import paramiko

        with self.lock:
            if self.parsed_ssh_config is None:
                if runtime is not None and not runtime.exists():
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(runtime))
                paths = [runtime] if runtime is not None else [USER_SSH_CONFIG, SYSTEM_SSH_CONFIG]
                config = paramiko.SSHConfig()
                for path in (p.expanduser() for p in paths):
                    if path.is_file():
                        parse_ssh_config(config, path)
                self.parsed_ssh_config = config
            return self.parsed_ssh_config


@dataclass
class FleetOptions:
    """How to run over the fleet. `agent` (an extension) lets tests and callers supply a prebuilt bundle;
    `sessions` opens every host's session in place of SSH or a local process (the tests' fake node).

    `shared_ssh` is filled in by the first connection of a run: what all its connections read alike.
    """

    forks: int | None = None
    # The batch seam's engine (pool.call_many): Fabric's worker pool, or ClusterShell over OpenSSH.
    via: Literal["fabric", "clush"] = "fabric"
    # --via clush through gateways: ClusterShell's topology file (fleet/clush_tree.py); None: flat.
    topology: Path | None = None
    accept_new_host_keys: bool = False
    known_hosts: Path | None = None
    ssh_config: Path | None = None
    agent: AgentPayload | None = None
    sessions: SessionOpener | None = field(default=None, repr=False, compare=False)
    shared_ssh: SharedSsh | None = field(default=None, repr=False, compare=False)
    # Told each host's name as its job ends (from the worker thread): the commands' "still waiting for".
    on_host_done: Callable[[str], None] | None = field(default=None, repr=False, compare=False)


# A command's limit: one for every host, one per host (`{name: seconds}`), or None: each host's own
# command_timeout_s (the batch seam's `timeout`).
Timeouts = float | Mapping[str, float | None] | None


def limit_of(timeout: Timeouts, name: str) -> float | None:
    return timeout.get(name) if isinstance(timeout, Mapping) else timeout
