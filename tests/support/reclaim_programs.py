"""Real programs that leave GPU memory holders behind the way training jobs do, for reclaim's tests.

Plain Python (no torch): what reclaim reads is the process tree, the command lines and the environment,
and these programs make them as multiprocessing and torch's elastic agent do. Each writes the pids of its
workers to the file named by its last argument, then waits to be killed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

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
