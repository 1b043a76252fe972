"""README's rehearsal, word for word: `rehearse up`, plan, apply --serial, plan, smoke, the node check over
`ssh -F`, `rehearse down`, on 2 and on 8 hosts (issue 40 item 1, "a test does exactly README's commands").

The commands are read from README's "Rehearsing a fleet" block and run by bash in a fresh folder with a clean
HOME (so neither the developer's ~/.ssh/config nor ~/.cache takes part); the one change is `--address`, moved
into this process's own loopback range so that concurrent test runs never meet.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import hosts

REPO = Path(__file__).resolve().parents[2]
# What each of README's commands must exit with: up, plan (drift), apply, plan (clean), smoke, check, down.
EXPECTED = [0, 2, 0, 0, 0, 0, 0]

pytestmark = [pytest.mark.e2e, pytest.mark.torch]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Rehearsing a fleet\n") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "README's rehearsal section lost its command block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def first_address() -> str:
    pid = os.getpid()
    return f"127.{1 + (pid >> 8) % 254}.{pid & 0xFF}.200"  # the test hosts' range, above their first ones


@pytest.mark.parametrize("count", [2, 8])
def test_readmes_rehearsal_on_2_and_8_hosts(tmp_path: Path, count: int) -> None:
    hosts.require_harness()
    commands = readme_commands()
    assert len(commands) == len(EXPECTED), commands
    assert commands[0] == "mgpu-provision rehearse up --hosts 2", commands[0]
    commands[0] = f"mgpu-provision rehearse up --hosts {count} --address {first_address()}"
    work, home, bin_dir = tmp_path / "clone", tmp_path / "home", tmp_path / "bin"
    for folder in (work, home, bin_dir):
        folder.mkdir()
    shim = bin_dir / "mgpu-provision"  # the command as `pip install -e .` puts it on PATH, for this checkout
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m mgpu_provision "$@"\n')
    shim.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "LANG": "C.UTF-8",
    }
    outputs = []
    try:
        for command, expected in zip(commands, EXPECTED, strict=True):
            done = subprocess.run(
                ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=600
            )
            outputs.append(done.stdout + done.stderr)
            assert done.returncode == expected, (
                f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
            )
            assert "Traceback" not in done.stderr, done.stderr
    finally:
        if (work / "mgpu-rehearsal" / "rehearsal.json").exists():  # a failed step: stop the hosts anyway
            subprocess.run(["bash", "-c", commands[-1]], cwd=work, env=env, capture_output=True, timeout=60)
    up, first_plan, applied, second_plan, smoke, check, down = outputs
    assert f"Rehearsal up: {count} simulated hosts" in up, up
    assert f"on {count} hosts: node-[01-{count:02d}]" in first_plan, first_plan
    assert "simulated: node-[01-" in first_plan and "timer is not installed" in first_plan, first_plan
    assert "mgpu-provision-check.timer" not in first_plan, first_plan  # no systemd unit on a simulated node
    assert f"batch {count}: applying on node-{count:02d}" in applied, applied  # --serial 1: a host a batch
    assert f"{count} hosts match the rig file" in second_plan, second_plan
    assert f"Smoke pass: world size {count} of {count}" in smoke, smoke
    assert "OK: node-01 is healthy and as the rig says" in check, check
    assert f"stopped {count} of {count} hosts" in down, down
    assert not (work / "mgpu-rehearsal").exists()
    alive = subprocess.run(["pgrep", "-f", str(work / "mgpu-rehearsal")], capture_output=True, text=True)
    assert alive.stdout == "", f"rehearsal sshd left running: {alive.stdout}"
