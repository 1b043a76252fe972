"""The boot unit that sets compute mode and power limit again after each reboot: rendered from a real rig
file, then read by systemd's own checker (`systemd-analyze verify`) with a stand-in nvidia-smi."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.files import DesiredFile
from mgpu_provision.plan.resources import boot_unit
from mgpu_provision.rig import LoadedRig, load_rig
from tests.support import factories
from tests.support.hosts import skip_or_fail

RIG = """\
version: 1
hosts:
  - {name: gpu-a, address: 10.0.0.11, rig: pair}
  - {name: win, address: 10.0.0.12, rig: pair, os: windows}
  - {name: here, connection: local, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
    health: {compute_mode: exclusive_process, power_limit_w: 300}
"""
UNIT_FILE = "/etc/systemd/system/mgpu-provision-gpu-settings.service"


def load(tmp_path: Path, text: str = RIG) -> LoadedRig:
    (tmp_path / "rig.yaml").write_text(text)
    return load_rig(tmp_path / "rig.yaml")


def unit_of(loaded: LoadedRig, host: str) -> DesiredFile | None:
    """The unit apply writes on `host` (its content needs no facts), None when it writes none."""
    units = boot_unit.desired(HostContext(loaded, loaded.host(host), factories.facts()))
    return units[0] if units else None


def test_the_unit_sets_the_rigs_values_on_every_gpu_at_boot_after_persistenced(tmp_path: Path) -> None:
    unit = unit_of((loaded := load(tmp_path)), "gpu-a")
    assert unit is not None and (unit.path, unit.mode, unit.phase) == (UNIT_FILE, "0644", "persistence")
    lines = unit.content.splitlines()
    assert "After=nvidia-persistenced.service" in lines
    kept = [line for line in lines if line.startswith(("Type=", "RemainAfterExit=", "WantedBy="))]
    assert kept == ["Type=oneshot", "RemainAfterExit=yes", "WantedBy=multi-user.target"]
    assert [line for line in lines if line.startswith("ExecStart=")] == [
        "ExecStart=/usr/bin/nvidia-smi -c EXCLUSIVE_PROCESS",
        "ExecStart=/usr/bin/nvidia-smi -pl 300",
    ]
    assert unit.content == unit_of(loaded, "gpu-a").content  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "health, expected",
    [
        ("{compute_mode: prohibited}", ["-c PROHIBITED"]),
        ("{power_limit_w: 250}", ["-pl 250"]),
        ("{compute_mode: exclusive_process, power_limit_w: 300, skip: [power]}", ["-c EXCLUSIVE_PROCESS"]),
    ],
)
def test_only_the_settings_the_rig_manages_are_in_the_unit(
    tmp_path: Path, health: str, expected: list[str]
) -> None:
    loaded = load(tmp_path, RIG.replace("{compute_mode: exclusive_process, power_limit_w: 300}", health))
    unit = unit_of(loaded, "gpu-a")
    assert unit is not None
    executed = [line for line in unit.content.splitlines() if line.startswith("ExecStart=")]
    assert [line.split(" ", 1)[1] for line in executed] == expected


@pytest.mark.parametrize(
    "health",
    [
        "{}",
        "{compute_mode: default}",
        "{compute_mode: prohibited, power_limit_w: 300, skip: [power, compute_mode]}",
    ],
)
def test_no_unit_where_the_driver_defaults_are_wanted(tmp_path: Path, health: str) -> None:
    loaded = load(tmp_path, RIG.replace("{compute_mode: exclusive_process, power_limit_w: 300}", health))
    assert unit_of(loaded, "gpu-a") is None
    assert boot_unit.paths(loaded, loaded.host("gpu-a")) == [UNIT_FILE]  # still read: one may be left over


def test_windows_hosts_and_a_null_systemd_dir_get_no_unit_and_local_paths_lie_beside_the_rig(
    tmp_path: Path,
) -> None:
    loaded = load(tmp_path)
    assert unit_of(loaded, "win") is None
    unmanaged = load(tmp_path, RIG + "files: {systemd_dir: null}\n")
    assert unit_of(unmanaged, "gpu-a") is None
    local_only = "\n".join(line for line in RIG.splitlines() if "10.0.0." not in line)
    local = load(tmp_path, local_only + "\nfiles: {systemd_dir: units}\n")
    unit = unit_of(local, "here")
    assert unit is not None and unit.path == str(tmp_path / "units" / "mgpu-provision-gpu-settings.service")


def test_systemd_reads_the_unit_without_a_complaint(tmp_path: Path) -> None:
    checker = shutil.which("systemd-analyze")
    if checker is None:
        skip_or_fail("systemd-analyze is not installed (apt-get install systemd)")
    loaded = load(tmp_path)
    unit = unit_of(loaded, "gpu-a")
    assert unit is not None
    # verify also checks that ExecStart's program exists: a stand-in for the driver's nvidia-smi.
    stand_in = tmp_path / "nvidia-smi"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    path = tmp_path / "mgpu-provision-gpu-settings.service"
    path.write_text(unit.content.replace("/usr/bin/nvidia-smi", str(stand_in)))
    run = subprocess.run([str(checker), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout + run.stderr) == (0, "")
    # the checker does complain about what systemd would ignore, so the empty answer above means something
    path.write_text(unit.content.replace("RemainAfterExit", "RemainAfterExt"))
    bad = subprocess.run([str(checker), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert "Unknown key" in bad.stderr
