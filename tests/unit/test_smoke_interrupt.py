"""Ctrl-C stops a smoke run at once: a real SIGINT to a real `mgpu-provision smoke` on the demo's box.

It once printed nothing and exited 130 only when the whole run had ended (33-44 s). Now the run's
processes are ended on every node, the command says so, and it exits 130 within seconds, leaving no
process of the run behind.

The smoke's python is a stand-in whose torchrun never ends (it answers the torch probe as a torch install
would, then waits for a signal): a real DDP run could finish before the interrupt lands on a loaded
machine, and then there is nothing to interrupt. This needs no torch; what it proves is the command's and
the node's handling of the signal, which is the same whatever the ranks are.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mgpu_provision import cli
from mgpu_provision.commands.demo import write_demo
from mgpu_provision.node.verbs.smoke import MARKER_ENV

REPO = Path(__file__).resolve().parents[2]
# `-m torch.distributed.run ...` (the launcher's exec): a rank that waits until it is ended; anything else is
# the torch probe, answered as tests/support/factories.FAKE_TORCH does.
WAITING_TORCH = (
    '#!/bin/sh\nif [ "$1" = "-m" ]; then exec sleep 600; fi\n'
    'echo \'{"version": "2.13.0", "cuda_available": true, "device_count": 2}\'\n'
)
STOP_WITHIN_S = 8.0  # the node's SIGTERM grace and two new agent calls, well short of the 33 s of old


def marked(home: Path) -> dict[int, bytes]:
    """The command lines of the processes of a smoke run started by the CLI run with `home` (other tests on
    this machine run smokes of their own): they carry the run's marker and inherited that HOME."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ours = f"HOME={home}".encode() in environ
        if ours and any(item.startswith(f"{MARKER_ENV}=".encode()) for item in environ):
            found[int(entry)] = cmdline
    return found


def test_ctrl_c_ends_the_run_says_what_it_stopped_and_exits_130(tmp_path: Path) -> None:
    python = tmp_path / "torch-python"
    python.write_text(WAITING_TORCH)
    python.chmod(0o755)
    rig = write_demo(tmp_path / "demo", str(python))
    assert cli.main(["apply", str(rig), "--yes"]) == 0
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-m", "mgpu_provision", "smoke", str(rig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not marked(home):  # the ranks have started, and never end by themselves
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = child.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, out + err
    assert took < STOP_WITHIN_S, f"exited {took:.1f}s after SIGINT"
    assert "interrupted: smoke run mgpu-smoke-" in err and "its processes were ended on demo-3090" in err, err
    assert "Traceback" not in err
    assert marked(home) == {}
