"""Persistence that lasts, on a simulated Ubuntu box: its nvidia-persistenced is enabled and active but runs
with `--no-persistence-mode`. The plan wants the drop-in, one apply writes it, the next plan is clean (the
real unit under real systemd: tests/e2e/test_persistenced_systemd_e2e.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.converge import apply_steps, changes_of
from tests.support.factories import facts_from_twin

TWINS = Path(__file__).resolve().parents[2] / "examples" / "twins"
UBUNTU_UNIT = "/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose"
RIG = """\
version: 1
hosts:
  - {name: hgx, address: 10.0.0.11, rig: hgx}
rigs:
  hgx:
    gpus: {model: "NVIDIA H100 80GB HBM3", count: 8, persistence_mode: true}
    bridge: {kind: nvswitch, links: 18}
    driver: {version: "550.54.15", reboot: allowed}
files: {profile_d: null, environment_file: null, launcher: null}
"""


def test_a_daemon_without_persistence_mode_gets_the_drop_in_and_converges(tmp_path: Path) -> None:
    twin = tmp_path / "twin.yaml"
    shutil.copy(TWINS / "h100-hgx.yaml", twin)
    services = (
        f'services:\n  nvidia-persistenced: {{enabled: true, running: true, exec_start: "{UBUNTU_UNIT}"}}\n'
    )
    twin.write_text(twin.read_text() + services)
    (tmp_path / "rig.yaml").write_text(RIG)

    rig = tmp_path / "rig.yaml"
    (change,) = changes_of(rig, "hgx", twin, ("persistence",))
    assert "lacks --persistence-mode" in change.summary, change.summary
    (result,) = apply_steps(twin, tmp_path / "apply.lock", [change])
    assert result["changed"], result
    daemon = facts_from_twin(twin).persistenced
    assert daemon is not None and daemon.exec_start is not None and "--persistence-mode" in daemon.exec_start
    assert "--no-persistence-mode" not in daemon.exec_start
    assert changes_of(rig, "hgx", twin, ("persistence",)) == []
