"""A known_hosts file read once per run and indexed by host name; each connection gets only its host's keys.

Paramiko's `HostKeys` compares every line with all lines before it while loading and scans every entry on
each lookup: shared by a run's connections it still cost time growing with the fleet times the file's length
(and a person's known_hosts often has thousands of lines). Here each line is filed under its host names
once, keys are decoded only for the hosts a run reaches, and each connection checks against its own host's
keys only. Hashed names (HashKnownHosts) cannot be filed by name: each host is hashed against them once, as
OpenSSH does for every connection. A line Paramiko cannot read no longer stops the whole run (its loader
raised on bad base64 in any line, a traceback from every worker).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko

_HASHED = "|1|"


class KnownHosts:
    """One known_hosts file: its lines by host name, and the keys accepted during the run (`record`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Looking a host up and recording a new key for it happen under this lock: workers run concurrently.
        self.lock = threading.Lock()
        self._named: dict[str, list[tuple[int, str]]] = {}
        self._hashed: list[tuple[str, int, str]] = []
        self._lines = 0
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            text = ""
        for line in text.splitlines():
            self._file(line)

    def _file(self, line: str) -> None:
        line = line.strip()
        if not line or line.startswith("#"):
            return
        self._lines += 1
        for name in line.split(None, 1)[0].split(","):
            if name.startswith(_HASHED):
                self._hashed.append((name, self._lines, line))
            else:
                self._named.setdefault(name, []).append((self._lines, line))

    def keys_of(self, name: str) -> dict[str, paramiko.PKey]:
        """`name`'s keys by type (`[addr]:port` unless port 22); the file's first key of a type counts, as in
        Paramiko. Lines Paramiko cannot read (unknown key types, bad base64) are skipped, as OpenSSH does."""
        with self.lock:
            return self._keys_of(name)

    def record(self, name: str, key: paramiko.PKey) -> None:
        """Append a newly accepted key (StrictHostKeyChecking=accept-new); a host that meanwhile got a
        different key of that type (another worker reached it first) is a changed key."""
        from paramiko import BadHostKeyException

        line = f"{name} {key.get_name()} {key.get_base64()}"
        with self.lock:
            recorded = self._keys_of(name).get(key.get_name())
            if recorded is not None:
                if recorded != key:
                    raise BadHostKeyException(name, key, recorded)
                return
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.path.open("a", encoding="ascii") as out:
                out.write(line + "\n")
            self._file(line)

    def _keys_of(self, name: str) -> dict[str, paramiko.PKey]:
        from paramiko import HostKeys, SSHException
        from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

        lines = list(self._named.get(name, ()))
        lines += [(n, line) for hashed, n, line in self._hashed if HostKeys.hash_host(name, hashed) == hashed]
        keys: dict[str, paramiko.PKey] = {}
        for _, line in sorted(lines):
            try:
                entry = HostKeyEntry.from_line(line)
            except (SSHException, InvalidHostKey, ValueError):
                continue
            if entry is not None and entry.key is not None:
                keys.setdefault(entry.key.get_name(), entry.key)
        return keys
