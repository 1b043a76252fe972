"""GB200 compute tray with `driver.imex: true`: nvidia-imex is installed at the driver's version and its unit
enabled and started by one apply, and the next plan is clean; no Fabric Manager is asked for (issue 26
defect 2)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.converge import apply_steps, changes_of
from tests.support.factories import facts_from_twin

TWINS = Path(__file__).resolve().parents[2] / "examples" / "twins"
RIG = """\
version: 1
hosts:
  - {name: tray, address: 10.0.0.11, rig: tray}
rigs:
  tray:
    gpus: {model: "NVIDIA GB200", count: 4}
    bridge: {kind: nvswitch, links: 18}
    driver: {version: "580.95.05", source: cuda, imex: true}
files: {profile_d: null, environment_file: null, launcher: null}
"""


def test_imex_converges_on_a_gb200_tray_with_one_apply(tmp_path: Path) -> None:
    twin = tmp_path / "tray.yaml"
    shutil.copy(TWINS / "gb200-tray.yaml", twin)
    (tmp_path / "rig.yaml").write_text(RIG)

    rig, resources = tmp_path / "rig.yaml", ("imex", "fabricmanager")
    (install,) = changes_of(rig, "tray", twin, resources)
    assert (install.resource, install.action, install.desired) == ("imex", "create", "580.95.05")
    assert install.agent_step["packages"] == ["nvidia-imex"] and install.agent_step["unit"] == "nvidia-imex"
    (result,) = apply_steps(twin, tmp_path / "apply.lock", [install])
    assert result["changed"], result
    imex = facts_from_twin(twin).imex
    assert imex is not None and (imex.version, imex.service, imex.enabled) == ("580.95.05", "active", True)
    assert changes_of(rig, "tray", twin, resources) == []
