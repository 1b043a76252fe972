"""How a run goes over the fleet: how many hosts at a time, host-key policy, and what its connections share.

Each known_hosts file is parsed once per run and shared by its connections (`SharedSsh`): parsed per host,
it cost time that grew with the square of the fleet.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import paramiko

MAX_FORKS = 64


class AgentPayload(Protocol):
    """What the fleet needs of `agent.bundle.AgentBundle`: the zipapp bytes and its content-addressed name."""

    @property
    def data(self) -> bytes: ...

    @property
    def name(self) -> str: ...


@dataclass
class SharedSsh:
    """One run's parsed known_hosts files (per path), read by every worker; new keys added under a lock."""

    host_keys: dict[Path, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def known_hosts(self, path: Path) -> paramiko.HostKeys:
        import paramiko  # only once a connection opens

        with self.lock:
            if path not in self.host_keys:
                self.host_keys[path] = paramiko.HostKeys(str(path) if path.exists() else None)
            return self.host_keys[path]


@dataclass
class FleetOptions:
    """How to run over the fleet. `agent` (an extension) lets tests and callers supply a prebuilt bundle.

    `shared_ssh` is filled in by the first connection of a run: what all its connections read alike.
    """

    forks: int | None = None
    accept_new_host_keys: bool = False
    known_hosts: Path | None = None
    ssh_config: Path | None = None
    agent: AgentPayload | None = None
    shared_ssh: SharedSsh | None = field(default=None, repr=False, compare=False)


