"""Helpers for reliability tests on test hosts: run the real CLI, find a host's processes, check its files.

The CLI runs in-process where nothing else must happen meanwhile (no interpreter start-up to pay), and as a
subprocess (`python -m mgpu_provision`) where a test injects a fault while an apply is under way. Either way
the test sees everything the tool printed, as a user would.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mgpu_provision import cli
from tests.support.hosts import MANAGED_DIRS, REPO, HostFactory, TestHost, desired_files_on

CLI = [sys.executable, "-m", "mgpu_provision"]


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.out)
        return loaded

    def host(self, name: str) -> dict[str, Any]:
        host: dict[str, Any] = self.json()["hosts"][name]
        return host


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def run_cli(*args: str, timeout: float = 120) -> Run:
    done = subprocess.run([*CLI, *args], env=cli_env(), capture_output=True, text=True, timeout=timeout)
    return Run(done.returncode, done.stdout, done.stderr)


def run_in_process(*args: str) -> Run:
    """The CLI in this process (no interpreter start-up): what a user would see on stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return Run(code, out.getvalue(), err.getvalue())


def start_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> Run:
    out, err = proc.communicate(timeout=timeout)
    return Run(proc.returncode, out, err)


def set_defaults(rig: Path, **defaults: Any) -> Path:
    """Change `defaults:` of a rig file written by the harness (e.g. a short command timeout)."""
    document = yaml.safe_load(rig.read_text())
    document["defaults"].update(defaults)
    rig.write_text(yaml.safe_dump(document, sort_keys=False))
    return rig


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def descendants(pid: int) -> Iterator[int]:
    for child in _children(pid):
        yield child
        yield from descendants(child)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def session_sshds(host: TestHost) -> list[int]:
    """The sshd processes serving this host's open connections (not the listener itself)."""
    assert host.process is not None
    return [pid for pid in descendants(host.process.pid) if _comm(pid).startswith("sshd")]


def _mount_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def agent_pids(host: TestHost, verb: str) -> list[int]:
    """Agent processes running `verb` on this host: in its mount namespace, even once orphaned (their sshd
    killed), when they are no longer below the host's sshd."""
    assert host.process is not None
    namespace = _mount_ns(host.process.pid)
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [pid for pid in pids if _is_agent(_cmdline(pid), verb) and _mount_ns(pid) == namespace]


def _is_agent(cmdline: str, verb: str) -> bool:
    # `python3 ~/.cache/mgpu-provision/agent-H[.pyz] VERB [TWIN]`: the zipapp, or the folder it unpacks into.
    words = cmdline.split()
    return any(
        "/mgpu-provision/agent-" in word and words[i + 1] == verb for i, word in enumerate(words[:-1])
    )


def wait_for(predicate: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # already gone: nothing left to signal
            os.kill(pid, sig)


def want_files(rig: Path, host: TestHost, factory: HostFactory) -> dict[str, str]:
    """Path on the node -> the content apply must leave there (rendered from the node's own facts)."""
    return {f.path: f.content for f in desired_files_on(rig, factory.known_hosts)[host.name]}


def node_files(host: TestHost) -> dict[str, str]:
    """Every file in the host's managed folders as the host sees them (mounts inside its namespace too)."""
    listing = host.run_in_ns(f"find {' '.join(MANAGED_DIRS)} -type f").stdout.split()
    return {path: host.run_in_ns(f"cat {path}").stdout for path in listing}


def assert_no_partial_files(host: TestHost, want: dict[str, str], old: dict[str, str]) -> None:
    """Each managed file is absent, its old content or its new content; no temp file is left behind."""
    files = node_files(host)
    temps = [p for p in files if Path(p).name.startswith(".") and p.endswith(".tmp")]
    assert not temps, f"temp files left on {host.name}: {temps}"
    for path, content in want.items():
        if path in files:
            assert files[path] in (content, old.get(path)), (
                f"{path} on {host.name} is partial: {files[path]!r}"
            )


def assert_converged(host: TestHost, want: dict[str, str]) -> None:
    files = node_files(host)
    for path, content in want.items():
        assert files.get(path) == content, f"{path} on {host.name} not converged"
