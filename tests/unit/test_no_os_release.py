"""A box or twin without an os-release file (issue 37, bad input): its distribution cannot be decided, so
plan fails the driver's check naming the file and what to set, and asks the agent for no install; it is
never read as Ubuntu. The node reads /usr/lib/os-release where /etc/os-release is missing (os-release(5))."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.node.core import system
from tests.support.converge import changes_of

TWINS = Path(__file__).resolve().parents[2] / "examples" / "twins"
RIG = """\
version: 1
hosts: [{name: box, address: 10.0.0.5, rig: one}]
rigs:
  one: {gpus: {model: "NVIDIA GeForce RTX 4090", count: 1}, driver: {version: "580.95.05"}}
files: {profile_d: null, environment_file: null, launcher: null}
"""

@pytest.mark.parametrize("release", ["os_release: null", "os_release: {version_id: '12'}"])
def test_a_twin_without_os_release_fails_the_driver_check(tmp_path: Path, release: str) -> None:
    twin = tmp_path / "box.yaml"
    text = (TWINS / "rtx4090-pcie.yaml").read_text()
    twin.write_text("\n".join(line for line in text.splitlines() if not line.startswith("os_release")) + "\n")
    twin.write_text(twin.read_text() + release + "\n")
    (tmp_path / "rig.yaml").write_text(RIG)

    changes = changes_of(tmp_path / "rig.yaml", "box", twin, ("driver", "reboot"))
    (check,) = changes
    assert check.action == "verify-failed" and check.agent_step is None
    assert "the box has no /etc/os-release (nor /usr/lib/os-release)" in check.summary
    assert "set driver.method: runfile" in check.summary


def test_the_node_falls_back_to_usr_lib_os_release(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"/usr/lib/os-release": 'ID=debian\nVERSION_ID="12"\n'}
    monkeypatch.setattr(system, "read_text", files.get)
    assert system.os_release(system.os_release_text())["os_id"] == "debian"
    files.clear()
    assert system.os_release_text() is None
