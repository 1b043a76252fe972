"""Crash-safe file replacement and the per-host apply lock.

Managed files live on machines that hold weeks of training, and apply may be killed at any moment (SIGKILL
of the control side drops the SSH session, and with it this process). Writing to a temporary file in the
same folder, fsyncing it, renaming it over the target and fsyncing the folder means every reader, and every
later boot, sees either the old file or the new one, never a torn one. The lock keeps two applies from
interleaving their steps on one box.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import time

from ...typing_lite import TYPE_CHECKING
from .errors import AgentFailure

if TYPE_CHECKING:
    from typing import IO, Optional


def atomic_write(path: str, data: bytes, mode: int) -> None:
    """Replace `path` with `data` (permission bits `mode`) so that it is never seen half-written."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o755, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        _remove_quietly(temp)
        raise
    fsync_dir(folder)


def fsync_dir(folder: str) -> None:
    """Make a rename in `folder` durable (the directory entry, not only the file's data)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class HostLock:
    """An exclusive `flock` on a lock file, held by this process; the holder's pid is written into it."""

    def __init__(self, path: str, wait_s: float, poll_s: float = 0.05, holder: str = "apply") -> None:
        self.path = path
        self.holder = holder  # what holds the lock, in the message to whoever waited for it
        self.wait_s = wait_s
        self.poll_s = poll_s
        self._handle: Optional[IO[str]] = None

    def __enter__(self) -> "HostLock":
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, mode=0o755, exist_ok=True)
            # Opened without truncation: the holder's pid must survive until we own the lock.
            handle = open(self.path, "a+", encoding="utf-8")  # held until __exit__
        except OSError as exc:
            raise AgentFailure(
                "lock",
                f"cannot take the host lock {self.path}: {exc.strerror} (the state folder {folder} must be "
                "creatable and writable by the user the agent runs as; set files.state_dir)",
            ) from None
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    handle.close()
                    raise
                if time.monotonic() >= deadline:
                    holder = _read_holder(self.path)
                    handle.close()
                    raise AgentFailure(
                        "locked",
                        f"another {self.holder} is running on this host (pid {holder}, lock {self.path}); "
                        f"waited {self.wait_s:g} s",
                    ) from None
                time.sleep(self.poll_s)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the descriptor releases the flock
            self._handle = None


def _read_holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or "unknown"
    except OSError:
        return "unknown"
