"""Where the running agent came from: the zipapp the control side uploaded, or the folder it unpacked into.

The node check runs the agent from a stable path, so apply installs the very archive that answered its
facts: the facts report that archive's digest, and apply's `agent` step copies it (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import os

from ...typing_lite import TYPE_CHECKING
from .errors import AgentFailure

if TYPE_CHECKING:
    from typing import Optional, Tuple


def agent_root() -> str:
    """The archive (or folder) the `mgpu_provision` package is imported from: what a child puts on its
    path to run the same code."""
    import mgpu_provision

    return os.path.dirname(os.path.dirname(os.path.abspath(mgpu_provision.__file__)))


def agent_archive() -> Optional[str]:
    """The zipapp this agent runs from (`agent-H.pyz`, or the one beside its unpacked `agent-H/`); None when
    it runs from a source tree."""
    root = agent_root()
    if root.endswith(".pyz") and os.path.isfile(root):
        return root
    beside = root + ".pyz"
    return beside if os.path.isfile(beside) else None


# Beside the unpacked agent's code: the digest of the zipapp it was unpacked from, written by the unpacking
# (`record_digest`), so that every facts call reads 64 bytes instead of hashing the whole archive.
DIGEST_FILE = ".sha256"


def archive_digest() -> Optional[str]:
    """sha256 of the agent's zipapp, as the facts report a managed file's; None without one."""
    path = agent_archive()
    if path is None:
        return None
    recorded = os.path.join(path[: -len(".pyz")], DIGEST_FILE)
    if agent_root() + ".pyz" == path and os.path.isfile(recorded):
        with open(recorded, encoding="ascii", errors="replace") as handle:
            digest = handle.read().strip()
        if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
            return digest
    return _sha256_of(path)


def _sha256_of(path: str) -> str:
    import hashlib  # only a zipapp run, or a folder unpacked by an older agent, hashes

    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def record_digest(archive: str, folder: str) -> None:
    """Write `archive`'s digest into the folder it is being unpacked into (before the folder appears)."""
    with open(os.path.join(folder, DIGEST_FILE), "w", encoding="ascii") as handle:
        handle.write(_sha256_of(archive) + "\n")


def install(path: str, sha256: str) -> Tuple[bool, str]:
    """apply's `agent` step: this agent's zipapp at `path` (0644), when it is the one that was planned."""
    import hashlib

    from .atomic import atomic_write  # only apply's step writes; the facts verb only hashes

    source = agent_archive()
    if source is None:
        raise AgentFailure(
            "bad-request", "this agent runs from a source tree, not a zipapp: nothing to install"
        )
    with open(source, "rb") as handle:
        data = handle.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise AgentFailure("refused", f"this agent is not the one planned (sha256 {sha256[:12]}): plan again")
    try:
        with open(path, "rb") as handle:
            if hashlib.sha256(handle.read()).hexdigest() == sha256:
                return False, f"{path} is up to date"
    except FileNotFoundError:
        pass
    atomic_write(path, data, 0o644)
    return True, f"installed the agent at {path} (sha256 {sha256[:12]}…)"
