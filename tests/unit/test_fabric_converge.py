"""A simulated NVSwitch box with Fabric Manager one version behind: one apply, and the next plan is clean.

The plan runs on the twin's facts as the control side gets them, its steps go through the agent's own
`apply` verb on the same twin, and the plan is taken again. Before the simulator saved the new version when
the unit was already enabled, apply said "installed Fabric Manager 550.54.15" and the next plan still found
550.54.14.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.converge import apply_steps, changes_of

TWINS = Path(__file__).resolve().parents[2] / "examples" / "twins"
RIG = """\
version: 1
hosts:
  - {name: hgx, address: 10.0.0.11, rig: hgx}
rigs:
  hgx:
    gpus: {model: "NVIDIA H100 80GB HBM3", count: 8}
    bridge: {kind: nvswitch, links: 18}
    driver: {version: "550.54.15", fabricmanager: true, hold: true, reboot: allowed}
files: {profile_d: null, environment_file: null, launcher: null}
"""


def test_fabric_manager_one_version_behind_converges_with_one_apply(tmp_path: Path) -> None:
    twin = tmp_path / "twin.yaml"
    shutil.copy(TWINS / "h100-hgx.yaml", twin)
    twin.write_text(twin.read_text().replace('fabricmanager: "550.54.15"', 'fabricmanager: "550.54.14"'))
    (tmp_path / "rig.yaml").write_text(RIG)

    rig = tmp_path / "rig.yaml"
    (change,) = changes_of(rig, "hgx", twin, ("fabricmanager",))
    assert (change.action, change.current, change.desired) == ("update", "550.54.14", "550.54.15")
    (result,) = apply_steps(twin, tmp_path / "apply.lock", [change])
    assert result["changed"], result

    assert changes_of(rig, "hgx", twin, ("fabricmanager",)) == []
