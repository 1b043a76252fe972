"""`plan` over several hosts: a host whose plan cannot be made fails alone, the others keep theirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mgpu_provision.cli import main

TWIN = Path(__file__).resolve().parents[2] / "examples" / "twins" / "rtx3090-nvlink.yaml"


def test_one_hosts_unmappable_uuid_does_not_stop_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def box(name: str) -> dict[str, object]:
        return {"name": name, "rig": name, "connection": "local", "simulate": str(TWIN)}

    def rig(visible: list[object]) -> dict[str, object]:
        return {"gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2}, "visible_devices": visible}

    document = {
        "hosts": [box("good"), box("odd")],
        "rigs": {"good": rig([0, 1]), "odd": rig(["GPU-00000000-1111"])},
        # A local host keeps its health sample in files.state_dir: the test's, not this machine's.
        "files": {
            "profile_d": None,
            "environment_file": None,
            "launcher": None,
            "state_dir": str(tmp_path / "state"),
        },
    }
    path = tmp_path / "rig.yaml"
    path.write_text(yaml.safe_dump(document))
    assert main(["plan", str(path), "--json"]) == 2
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    assert hosts["good"]["status"] == "ok" and hosts["good"]["changes"] == []
    assert hosts["odd"]["status"] == "failed"
    assert "GPU-00000000-1111" in hosts["odd"]["error"]
