"""The `apply` and `reboot` verbs: carry out a host's planned steps in order, under the host lock.

Steps are data from the control side's plan (their kinds are defined in `protocol.py`). Each reports
whether it changed anything, so a second apply of the same plan reports (and writes) nothing; the first
failure stops the rest, which are reported as skipped, because later steps may depend on earlier ones.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess

from ... import protocol
from ...typing_lite import TYPE_CHECKING
from ..core import archive
from ..core.atomic import HostLock, atomic_write
from ..core.errors import AgentFailure
from ..nvidia.backend import Backend
from . import gpu_settings

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

BACKUP_SUFFIX = ".mgpu-provision.bak"
RESTART_TIMEOUT_S = 120

if TYPE_CHECKING:
    StepResult = Tuple[bool, str]


def same_node(args: Dict[str, Any], backend: Backend) -> None:
    """Refuse to change a node that is not what its facts said: a rehearsal on a simulated node must never
    reach the real machine (e.g. when sudo dropped the variable that points the agent at its twin)."""
    expected = args["simulated"]
    if expected is not None and expected != backend.simulated:
        said, now = ("simulated", "a real machine") if expected else ("a real machine", "simulated")
        raise AgentFailure(
            "refused",
            f"this node answered as {said} when it was planned and answers as {now} now: nothing was "
            "changed (check that MGPU_PROVISION_SIMULATE reaches the agent, also under sudo)",
        )


def apply(args: Dict[str, Any], backend: Backend) -> Dict[str, Any]:
    same_node(args, backend)
    lock = args["lock"]
    steps = args["steps"]
    results: List[Dict[str, Any]] = []
    with HostLock(str(lock), float(args["lock_wait_s"])):
        failed = False
        for index, step in enumerate(steps):
            kind = step["kind"]
            entry: Dict[str, Any] = {"index": index, "kind": kind, "changed": False, "error": None}
            if failed:
                entry.update(message="skipped: an earlier step failed", skipped=True)
            else:
                try:
                    changed, message = run_step(step, backend)
                    entry.update(changed=changed, message=message)
                except AgentFailure as exc:
                    entry.update(message=f"{kind} step failed", error=exc.message)
                    failed = True
                except OSError as exc:
                    entry.update(message=f"{kind} step failed", error=f"{exc.filename or ''}: {exc.strerror}")
                    failed = True
                except Exception as exc:  # e.g. an NVML error: reported on the step, the lock is released
                    entry.update(message=f"{kind} step failed", error=f"{type(exc).__name__}: {exc}")
                    failed = True
            results.append(entry)
    return {"results": results}


def run_step(step: Dict[str, Any], backend: Backend) -> StepResult:
    """One step as the door checked it (protocol.STEP_FIELDS: every field there, of its type)."""
    kinds: Dict[str, Callable[[Dict[str, Any], Backend], StepResult]] = {
        protocol.FILE: lambda s, b: write_file(s["path"], s["content"], int(s["mode"], 8)),
        protocol.DRIVER: lambda s, b: b.install_driver(s),
        protocol.FABRICMANAGER: lambda s, b: b.install_fabric_manager(s),
        protocol.PERSISTENCED: lambda s, b: b.set_persistence_daemon(s),
        protocol.SERVICE: lambda s, b: b.switch_service(s["unit"], s["enable"], s["start"], s["restart"]),
        protocol.NOUVEAU: lambda s, b: b.blacklist_nouveau(),
        protocol.PERSISTENCE: gpu_settings.set_persistence,
        protocol.COMPUTE_MODE: gpu_settings.set_compute_mode,
        protocol.POWER_LIMIT: gpu_settings.set_power_limit,
        protocol.REMOVE: lambda s, b: remove_file(s["path"]),
        protocol.AGENT: lambda s, b: archive.install(s["path"], s["sha256"]),
        protocol.RESTART: lambda s, b: restart(s["command"]),
        protocol.CONTAINER_TOOLKIT: lambda s, b: b.install_container_toolkit(s),
        protocol.CDI_GENERATE: lambda s, b: b.generate_cdi(s),
        protocol.RUNTIME_CONFIGURE: lambda s, b: b.configure_runtime(s["runtime"]),
    }
    return kinds[step["kind"]](step, backend)


def write_file(path: str, content: str, mode: int) -> StepResult:
    """Make `path` hold `content` with `mode`; an equal file is not touched (its mtime stays)."""
    data = content.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            old: Optional[bytes] = handle.read()
            old_mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
    except FileNotFoundError:
        old, old_mode = None, 0
    if old == data:
        if old_mode == mode:
            return False, f"{path} is up to date"
        os.chmod(path, mode)
        return True, f"{path}: mode {old_mode:04o} -> {mode:04o}"
    if old is not None:
        atomic_write(path + BACKUP_SUFFIX, old, old_mode)
    atomic_write(path, data, mode)
    digest = hashlib.sha256(data).hexdigest()[:12]
    return True, f"{'updated' if old is not None else 'created'} {path} (sha256 {digest}…)"


def restart(command: List[str]) -> StepResult:
    """Run the restart command the rig names; a failure is the step's, with the command's own words."""
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RESTART_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        words = " ".join(command)
        message = "{} did not finish within {} s".format(words, RESTART_TIMEOUT_S)
        raise AgentFailure("restart", message) from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-500:]
        raise AgentFailure("restart", "{} exited {}: {}".format(" ".join(command), done.returncode, said))
    return True, "ran {}".format(" ".join(command))


def remove_file(path: str) -> StepResult:
    """Make `path` absent; its last content stays beside it as the backup a write would have kept."""
    try:
        with open(path, "rb") as handle:
            old = handle.read()
            old_mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
    except FileNotFoundError:
        return False, f"{path} is already absent"
    atomic_write(path + BACKUP_SUFFIX, old, old_mode)
    os.unlink(path)
    return True, f"removed {path} (backup {path + BACKUP_SUFFIX})"


def reboot(args: Dict[str, Any], backend: Backend) -> Tuple[Dict[str, Any], Optional[Callable[[], None]]]:
    """Reboot; the reply carries the old boot id so the control side can wait for a new one.

    With `lock`, the reboot waits for the host lock like an apply does, so it never lands in the middle of
    another apply's steps; the lock is then held until this process ends with the reboot.
    """
    same_node(args, backend)
    lock = HostLock(str(args["lock"]), float(args["lock_wait_s"])) if args["lock"] else None
    if lock is not None:
        lock.__enter__()
    old = backend.boot_id()
    return {"boot_id": old}, backend.reboot()
