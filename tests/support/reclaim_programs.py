"""Real programs that leave GPU memory holders behind the way training jobs do, for reclaim's tests, and
the helpers that start them on a test host and list them in its twin.

Plain Python (no torch): what reclaim reads is the process tree, the command lines and the environment,
and these programs make them as multiprocessing and torch's elastic agent do. Each writes the pids of its
workers to the file named by its last argument, then waits to be killed.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mgpu_provision.node.host.procs import read_proc
from tests.support.hosts import TWINS_DIR, TestHost

# `python SPAWN_MAIN CODE COUNT PIDFILE`: COUNT workers of multiprocessing's spawn context (as
# torch.multiprocessing.spawn starts them), each running CODE, then the main process waits.
SPAWN_MAIN = """import multiprocessing, os, sys, time
if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=exec, args=(sys.argv[1],)) for _ in range(int(sys.argv[2]))]
    for worker in workers:
        worker.start()
    with open(sys.argv[3] + ".part", "w") as f:
        f.write(" ".join(str(w.pid) for w in workers))
    os.rename(sys.argv[3] + ".part", sys.argv[3])
    time.sleep(300)
"""
# `python accelerate launch PIDFILE`: a launcher that runs torch's elastic agent in its own process, as
# `accelerate launch` and deepspeed do: two workers, each in a session of its own (start_new_session, as
# torch/distributed/elastic/multiprocessing/subprocess_handler does) with TORCHELASTIC_RUN_ID set.
ELASTIC_AGENT = """import os, subprocess, sys, time
env = dict(os.environ, TORCHELASTIC_RUN_ID="e2e-run")
workers = [
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True)
    for _ in range(2)
]
with open(sys.argv[-1] + ".part", "w") as f:
    f.write(" ".join(str(w.pid) for w in workers))
os.rename(sys.argv[-1] + ".part", sys.argv[-1])
time.sleep(300)
"""
SLEEP = "import time; time.sleep(300)"
IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"


def script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{text}")
    path.chmod(0o755)
    return path


def wait_until(what: str, done: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def pids_in(path: Path) -> list[int]:
    """The pids a program above wrote (it renames the file into place once it is complete)."""
    wait_until(f"{path}", path.exists)
    return [int(p) for p in path.read_text().split()]


def background(host: TestHost, command: str) -> int:
    """Start `command` in the host's namespaces from a shell that exits at once; the pid of the process."""
    out = host.run_in_ns(f"{command} </dev/null >/dev/null 2>&1 & echo $!")
    return int(out.stdout)


def spawn_leftovers(host: TestHost, tmp: Path, name: str, code: str, count: int) -> tuple[int, list[int]]:
    """A script's `count` multiprocessing spawn workers running `code`, started in a session of its own
    with the script SIGKILLed: (the script's pid, the workers' pids)."""
    main_py = script(tmp, "spawn_main.py", SPAWN_MAIN)
    pid_file = tmp / f"{host.name}-{name}.pids"
    killed = background(host, f"setsid {main_py} {shlex.quote(code)} {count} {pid_file}")
    workers = pids_in(pid_file)
    host.run_in_ns(f"kill -9 {killed}")
    wait_until("the workers to lose their parent", lambda: all(parent_of(w) != killed for w in workers))
    return killed, workers


def parent_of(pid: int) -> int | None:
    info = read_proc(pid)
    return None if info is None else info.ppid


def twin_with(holders: list[tuple[int, int, int]], mps: tuple[int, ...] = ()) -> str:
    """The example 2x RTX 3090 twin, its text kept verbatim (the agent's YAML reader reads what people
    write), with these (pid, gpu, MiB) as GPU memory holders, those in `mps` listed as clients of MPS."""
    text = (TWINS_DIR / "rtx3090-nvlink.yaml").read_text()
    return (
        text
        + "processes:\n"
        + "".join(
            f"  - {{pid: {pid}, gpu: {gpu}, used_mib: {mib}{', mps_client: true' if pid in mps else ''}}}\n"
            for pid, gpu, mib in holders
        )
    )


def alive(pid: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.alive
