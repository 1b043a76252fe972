"""What a person reads when a connection fails: the right cause, the right host, and no library traceback.

Run as separate processes, as a user runs the tool: Paramiko's log records reach stderr only where nothing
configured logging, which is the case in the CLI and never inside pytest (it installs its own handlers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.hosts import SilentServer, loopback_address

RIG = """\
version: 1
defaults: {{connect_timeout_s: 5}}
hosts:
  - {{name: gpu-a, address: {address}, port: {port}, rig: pair}}
rigs:
  pair:
    gpus: {{model: "NVIDIA GeForce RTX 3090", count: 2}}
    ddp: {{master: gpu-a, port: 29500, backend: gloo, nproc_per_node: 2}}
"""


def run_plan(rig: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mgpu_provision", "plan", str(rig), "--known-hosts", str(home / "kh")],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(home)},
        timeout=60,
    )


def test_a_host_that_hangs_up_during_the_banner_is_named_without_a_traceback(tmp_path: Path) -> None:
    port = 2200 + os.getpid() % 500
    with SilentServer(loopback_address(port), port, hang_up=True) as server:
        rig = tmp_path / "rig.yaml"
        rig.write_text(RIG.format(address=server.address, port=port))
        done = run_plan(rig, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception (client)" not in done.stderr, done.stderr
    assert done.stderr.strip() == "", done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("gpu-a:")]
    assert f"gpu-a ({server.address}:{port}) closed the connection during the SSH banner after " in line
    assert "within 5s" not in line  # it did not time out: it was refused at once
