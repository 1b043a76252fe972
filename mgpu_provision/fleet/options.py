"""How a run goes over the fleet: how many hosts at a time, host-key policy, and what its connections share.

What every connection of a run reads alike is read once per run and shared (`SharedSsh`): the known_hosts
files, the private key files and the ssh_config. Read per host, they cost CPU on every connection (known_hosts
even time growing with the square of the fleet).
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

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
                        with path.open(encoding="utf-8") as text:
                            config.parse(text)
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
    accept_new_host_keys: bool = False
    known_hosts: Path | None = None
    ssh_config: Path | None = None
    agent: AgentPayload | None = None
    sessions: SessionOpener | None = field(default=None, repr=False, compare=False)
    shared_ssh: SharedSsh | None = field(default=None, repr=False, compare=False)
    # Told each host's name as its job ends (from the worker thread): the commands' "still waiting for".
    on_host_done: Callable[[str], None] | None = field(default=None, repr=False, compare=False)


