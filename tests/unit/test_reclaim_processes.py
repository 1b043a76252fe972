"""Node side of reclaim on real processes spawned here.

Leftover multiprocessing workers, live children, a torchrun job, a process that ignores SIGTERM, a defunct
leader whose threads run on and a job a wrapper put in the background are all real; only the GPU layer is
faked (which pids hold how much memory).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.host import procs
from mgpu_provision.node.host.procs import ProcInfo
from mgpu_provision.node.nvidia.backend import NvmlUnavailable
from mgpu_provision.node.verbs import reclaim
from tests.support.reclaim_programs import IGNORE_TERM, SLEEP, SPAWN_MAIN, pids_in, script

MIB = 1024 * 1024
# The main thread leaves through pthread_exit while another thread sleeps: the leader shows state Z.
DEFUNCT_LEADER = (
    "import ctypes, threading, time; threading.Thread(target=time.sleep, args=(300,)).start(); "
    "ctypes.CDLL(None).pthread_exit(None)"
)
FAKE_TORCHRUN = (
    "import subprocess, sys; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); p.wait()\n"
)


class FakeBackend:
    """The NVML side: these pids hold GPU memory (pid -> (gpu, MiB)); `released` ones closed the GPU since."""

    reports_host_pids = False  # its pids are the processes this test started, as the agent sees them

    def __init__(
        self,
        holders: dict[int, tuple[int, int]],
        released: tuple[int, ...] = (),
        mps_clients: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        self.holders = holders
        self.released = released
        self.mps_clients = mps_clients or {}
        self.opened = 0

    def open(self) -> None:
        self.opened += 1

    def close(self) -> None:
        self.opened -= 1

    def device_count(self) -> int:
        return 2

    def processes(self, gpu: int) -> list[tuple[int, int | None]]:
        return [(pid, mib * MIB) for pid, (g, mib) in self.holders.items() if g == gpu]

    def mps_processes(self, gpu: int) -> list[tuple[int, int | None]]:
        return [(pid, mib * MIB) for pid, (g, mib) in self.mps_clients.items() if g == gpu]

    def holds_gpu(self, pid: int) -> bool:
        held = {**self.holders, **self.mps_clients}
        return pid in held and pid not in self.released


def wait_for(predicate: object, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def state(pid: int) -> str:
    """The comm of a live process, or its state letter when the leader is defunct."""
    info = procs.read_proc(pid)
    assert info is not None
    return info.state if info.state == "Z" else info.comm


def alive(pid: int) -> bool:
    info = procs.read_proc(pid)
    return info is not None and info.alive


class Spawner:
    """Starts test processes and ends whatever is left of them afterwards."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[ProcInfo] = []
        self.children: list[subprocess.Popen[str]] = []

    def _track(self, pid: int) -> int:
        info = procs.read_proc(pid)
        assert info is not None
        self.started.append(info)
        return pid

    def background(self, program: str, session: bool = True) -> int:
        """`program` started in the background by a shell that exits at once; in a session of that shell's
        own (so the job's leaders are gone with it) unless `session` is False."""
        setsid = ["setsid"] if session else []
        out = subprocess.run(
            [*setsid, "sh", "-c", f"{program} >/dev/null 2>&1 & echo $!"],
            capture_output=True,
            text=True,
            check=True,
        )
        pid = int(out.stdout)
        wait_for(lambda: state(pid) not in ("sh", "setsid", "nohup"), "the program to exec")
        return self._track(pid)

    def orphan(self, python_code: str = SLEEP) -> int:
        """A leftover: a multiprocessing spawn worker whose main process was SIGKILLed."""
        main = script(self.tmp, "spawn_main.py", SPAWN_MAIN)
        pid_file = self.tmp / f"workers-{len(self.started)}"
        proc = subprocess.Popen(
            [str(main), python_code, "1", str(pid_file)], start_new_session=True, stdout=subprocess.DEVNULL
        )
        (worker,) = pids_in(pid_file)
        self._track(worker)
        proc.kill()
        proc.wait()
        wait_for(lambda: procs.read_proc(worker).ppid != proc.pid, "the worker to be re-parented")  # type: ignore[union-attr]
        return worker

    def child(self) -> int:
        """A member of a live job: a session-leading shell waiting for its background sleep."""
        proc = subprocess.Popen(
            ["sh", "-c", "sleep 300 & echo $!; wait"],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.children.append(proc)
        assert proc.stdout is not None
        self._track(proc.pid)
        pid = int(proc.stdout.readline())
        wait_for(lambda: state(pid) == "sleep", "the child to exec")
        return self._track(pid)

    def torchrun_worker(self) -> tuple[int, int]:
        launcher = self.tmp / "torchrun"
        launcher.write_text(FAKE_TORCHRUN)
        proc = subprocess.Popen([sys.executable, str(launcher)], stdout=subprocess.PIPE, text=True)
        self.children.append(proc)
        assert proc.stdout is not None
        worker = int(proc.stdout.readline())
        self._track(proc.pid)
        return proc.pid, self._track(worker)

    def cleanup(self) -> None:
        for info in self.started:
            now = procs.read_proc(info.pid)
            if now is not None and now.start_ticks == info.start_ticks and now.alive:
                os.kill(info.pid, signal.SIGKILL)
        for proc in self.children:
            proc.wait(timeout=10)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(tmp_path)
    yield spawner
    spawner.cleanup()


def ignores_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def by_pid(result: dict[str, object]) -> dict[int, dict[str, object]]:
    return {row["pid"]: row for row in result["processes"]}  # type: ignore[attr-defined, index, misc]


def test_reclaim_ends_exactly_the_orphans(spawn: Spawner) -> None:
    orphan = spawn.orphan()
    stubborn = spawn.orphan(IGNORE_TERM)
    defunct = spawn.orphan(DEFUNCT_LEADER)
    child = spawn.child()
    launcher, worker = spawn.torchrun_worker()
    wait_for(lambda: ignores_sigterm(stubborn), "the SIGTERM handler")
    wait_for(lambda: state(defunct) == "Z", "the defunct leader")
    backend = FakeBackend(
        {orphan: (0, 1000), stubborn: (1, 2000), defunct: (0, 300), child: (1, 4000), worker: (0, 8000)}
    )

    dry = by_pid(reclaim.run(protocol.check_args("reclaim", {"policy": "orphans", "grace_s": 0.5}), backend))
    assert {pid: row["action"] for pid, row in dry.items()} == {
        orphan: "would-end",
        stubborn: "would-end",
        defunct: "would-end",
        child: "keep",
        worker: "keep",
    }
    assert dry[orphan]["reason"].startswith(  # type: ignore[union-attr]
        "orphaned: a multiprocessing spawn worker left behind: its parent is gone: re-parented to pid "
    )
    assert (
        dry[defunct]["reason"] == "orphaned: zombie: its main thread exited, other threads still hold the GPU"
    )
    parent = procs.read_proc(child)
    assert parent is not None
    assert dry[child]["reason"] == f"its process group leader pid {parent.pgid} (sh) is alive"
    assert dry[worker]["reason"] == f"part of the live torchrun job of pid {launcher} ({state(launcher)})"
    assert dry[worker]["torchrun_job"] and not dry[worker]["orphaned"]
    assert dry[orphan]["owner"] == "root" and dry[orphan]["command"].endswith(" --multiprocessing-fork")  # type: ignore[union-attr]
    assert abs(dry[orphan]["start_time"] - time.time()) < 60  # type: ignore[operator]
    assert all(alive(pid) for pid in (orphan, stubborn, defunct, child, worker))

    started = time.monotonic()
    done = reclaim.run(
        protocol.check_args("reclaim", {"policy": "orphans", "grace_s": 0.5, "dry_run": False}), backend
    )
    rows = by_pid(done)
    assert time.monotonic() - started >= 0.5
    assert rows[orphan]["action"] == "ended" and rows[orphan]["reason"].endswith("; ended by SIGTERM")  # type: ignore[union-attr]
    assert rows[defunct]["action"] == "ended" and rows[defunct]["reason"].endswith("; ended by SIGTERM")  # type: ignore[union-attr]
    assert rows[stubborn]["action"] == "ended"
    assert rows[stubborn]["reason"].endswith("; ended by SIGKILL after the 0.5s grace period")  # type: ignore[union-attr]
    assert done["freed_mib"] == 1000 + 2000 + 300
    assert not any(alive(pid) for pid in (orphan, stubborn, defunct))
    assert alive(child) and alive(worker) and alive(launcher)

    assert backend.opened == 0  # NVML is released after each listing
    again = reclaim.run(
        protocol.check_args("reclaim", {"policy": "orphans", "grace_s": 0.5, "dry_run": False}), backend
    )
    assert {pid: row["action"] for pid, row in by_pid(again).items()} == {child: "keep", worker: "keep"}
    assert again["freed_mib"] == 0


def test_patterns_end_a_live_child_and_refuse_the_agent_and_its_ancestors(spawn: Spawner) -> None:
    child = spawn.child()
    me, parent = os.getpid(), os.getppid()
    backend = FakeBackend({child: (0, 500), me: (0, 10), parent: (1, 10)})
    args = {"policy": "orphans+patterns", "patterns": ["^sleep 300$", "."], "grace_s": 2}
    rows = by_pid(reclaim.run(protocol.check_args("reclaim", {**args, "dry_run": False}), backend))
    assert rows[child]["action"] == "ended"
    assert rows[child]["reason"] == "command matches '^sleep 300$'; ended by SIGTERM"
    assert rows[me]["action"] == "refused"
    assert rows[me]["reason"] == f"refusing to end pid {me} (the agent itself)"
    assert rows[parent]["reason"] in (
        f"refusing to end pid {parent} (an ancestor of the agent)",
        f"refusing to end pid {parent} (init)",
    )
    assert alive(me) and alive(parent)


def test_a_reused_pid_is_left_alone(spawn: Spawner) -> None:
    pid = spawn.child()
    listed = procs.read_proc(pid)
    assert listed is not None
    impostor = listed._replace(start_ticks=listed.start_ticks - 1)
    outcomes = procs.end_processes([impostor], grace_s=0.1)
    assert outcomes == {pid: f"left alone: pid {pid} now names another process (pid reused)"}
    assert alive(pid)


def test_a_process_gone_before_the_signal_counts_as_ended(spawn: Spawner) -> None:
    pid = spawn.orphan()
    listed = procs.read_proc(pid)
    assert listed is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), "the process to die")
    assert procs.end_processes([listed], grace_s=0.1) == {pid: "ended before it was signalled"}


def test_dead_holders_are_not_listed() -> None:
    finished = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    result = reclaim.run(
        protocol.check_args("reclaim", {"policy": "orphans"}), FakeBackend({int(finished.stdout): (0, 100)})
    )
    assert result == {"processes": [], "freed_mib": 0, "not_holders": []}


def test_nvml_unavailable_is_an_agent_failure_with_the_reason() -> None:
    class NoDriver(FakeBackend):
        def open(self) -> None:
            raise NvmlUnavailable("driver-not-loaded", "the NVIDIA kernel module is not loaded")

    with pytest.raises(AgentFailure) as err:
        reclaim.run(protocol.check_args("reclaim", {"policy": "orphans"}), NoDriver({}))
    assert err.value.kind == "nvml"  # a declared kind (protocol.ERROR_KINDS); NVML's reason in the words
    assert err.value.message == (
        "cannot list the processes holding GPU memory (driver-not-loaded): "
        "the NVIDIA kernel module is not loaded"
    )


def test_jobs_whose_shell_exited_are_kept_when_started_with_nohup_or_setsid(spawn: Spawner) -> None:
    nohup = spawn.background("nohup sleep 300")
    setsid = spawn.background("setsid sleep 300", session=False)
    leftover = spawn.orphan()
    backend = FakeBackend({nohup: (0, 100), setsid: (0, 200), leftover: (1, 300)})
    rows = by_pid(
        reclaim.run(
            protocol.check_args("reclaim", {"policy": "orphans", "grace_s": 1, "dry_run": False}), backend
        )
    )
    assert {pid: (row["action"], row["reason"]) for pid, row in rows.items() if pid != leftover} == {
        nohup: ("keep", "it ignores SIGHUP: started with nohup to outlive its shell"),
        setsid: ("keep", reclaim.OWN_GROUP),
    }
    assert rows[leftover]["action"] == "ended"
    assert alive(nohup) and alive(setsid) and not alive(leftover)


def test_pid_ends_exactly_the_named_process(spawn: Spawner) -> None:
    backgrounded = spawn.background("sleep 300")  # by a wrapper that exited: nothing marks it as a worker
    other = spawn.background("sleep 300")
    backend = FakeBackend({backgrounded: (0, 100), other: (1, 200)})
    rows = by_pid(reclaim.run(protocol.check_args("reclaim", {"policy": "orphans"}), backend))
    info = procs.read_proc(backgrounded)
    assert info is not None
    assert rows[backgrounded]["action"] == "keep"
    assert rows[backgrounded]["reason"] == (
        f"its process group leader pid {info.pgid} is gone and nothing marks it as that job's worker "
        f"(a backgrounded job? a fork-mode child?); `reclaim --pid {backgrounded}` ends exactly it"
    )
    done = reclaim.run(
        protocol.check_args(
            "reclaim", {"policy": "orphans", "grace_s": 1, "dry_run": False, "pids": [backgrounded, 1]}
        ),
        backend,
    )
    rows = by_pid(done)
    assert (rows[backgrounded]["action"], rows[other]["action"]) == ("ended", "keep")
    assert rows[backgrounded]["reason"].startswith("named by --pid; its process group leader")  # type: ignore[union-attr]
    assert done["freed_mib"] == 100 and done["not_holders"] == [1]
    assert not alive(backgrounded) and alive(other)


def test_mps_clients_are_listed_with_their_server(spawn: Spawner, tmp_path: Path) -> None:
    server_program = tmp_path / "nvidia-cuda-mps-server"
    server_program.symlink_to("/bin/sleep")
    server = spawn.background(f"{server_program} 300")
    client = spawn.child()
    backend = FakeBackend({server: (0, 300)}, mps_clients={client: (0, 900)})
    args = {"policy": "orphans+patterns", "patterns": ["mps"]}
    rows = by_pid(reclaim.run(protocol.check_args("reclaim", args), backend))
    assert rows[client]["mps_server"] == server and rows[client]["action"] == "keep"
    assert rows[server]["mps_server"] is None
    assert (rows[server]["action"], rows[server]["reason"]) == (
        "refused",
        f"refusing to end pid {server} (nvidia-cuda-mps-server)",
    )


def test_a_process_that_let_go_of_the_gpu_is_left_alone(spawn: Spawner) -> None:
    pid = spawn.orphan()
    backend = FakeBackend({pid: (0, 100)}, released=(pid,))
    row = by_pid(
        reclaim.run(
            protocol.check_args("reclaim", {"policy": "orphans", "grace_s": 1, "dry_run": False}), backend
        )
    )[pid]
    assert row["action"] == "keep"
    assert row["reason"].endswith("; left alone: it has no /dev/nvidia* file open any more")  # type: ignore[union-attr]
    assert alive(pid)


def test_holds_device_sees_an_open_device_file(tmp_path: Path) -> None:
    device = tmp_path / "dev" / "nvidia0"
    device.parent.mkdir()
    device.write_text("")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; f = open({str(device)!r}); print(1, flush=True); time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    other = subprocess.Popen(["sleep", "300"])
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "1\n"
        prefix = str(tmp_path / "dev" / "nvidia")
        assert procs.holds_device(holder.pid, prefix=prefix) is True
        assert procs.holds_device(other.pid, prefix=prefix) is False
        assert procs.holds_device(2**22 + 1, prefix=prefix) is False  # no such process
    finally:
        for proc in (holder, other):
            proc.kill()
            proc.wait()


def test_a_process_whose_open_files_cannot_be_seen_is_not_signalled(spawn: Spawner) -> None:
    pid = spawn.orphan()
    listed = procs.read_proc(pid)
    assert listed is not None
    outcomes = procs.end_processes([listed], 0.1, holds_gpu=lambda _: None)
    assert outcomes == {pid: f"failed: cannot see the open files of pid {pid} (run the agent as root)"}
    assert alive(pid)


NOBODY = 65534


def seen_by_nobody(pid: int) -> list[bool | str | None]:
    """What an agent running as user nobody reads about `pid`: (holds_device, torchrun_run)."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the forked child reports through the pipe)
        try:
            os.setuid(NOBODY)
            info = procs.read_proc(pid)
            os.write(writer, json.dumps([procs.holds_device(pid), info and info.torchrun_run]).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        text = answer.read()
    os.waitpid(child, 0)
    return json.loads(text)  # type: ignore[no-any-return]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to look as another user")
def test_another_users_process_cannot_be_confirmed_and_its_environment_is_not_read() -> None:
    # A root-owned torchrun worker seen by an agent running as nobody: /proc hides its fds and environment.
    worker = subprocess.Popen(["sleep", "300"], env={"TORCHELASTIC_RUN_ID": "r1"})
    try:
        assert seen_by_nobody(worker.pid) == [None, None]
        assert procs.read_proc(worker.pid).torchrun_run == "r1"  # type: ignore[union-attr]
    finally:
        worker.kill()
        worker.wait()
