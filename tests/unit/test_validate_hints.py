"""validate says what a person meant: the NVML name a shorthand stands for, a close host name, a rig key
written one level too far left, a placeholder model; and a value's own problem is reported beside the
schema errors of its neighbours ("every problem at once")."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.errors import SpecError
from mgpu_provision.rig import load_rig

RIG = """\
version: 1
hosts:
  - {name: lab-1, rig: pair}
rigs:
  pair:
    gpus: {model: "RTX 3090", count: 2}
    ddp: {master: lab1, port: 29500}
    env: {LD_LIBRARY_PATH: "$LD_LIBRARY_PATH:/x", 2BAD: y}
  quad:
    gpus: {model: "REPLACE ME", count: "four"}
  bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}
env:
  PATH: "$PATH:/opt/x"
  BAD-NAME: x
"""


def problems(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "rig.yaml").write_text(RIG)
    with pytest.raises(SpecError) as info:
        load_rig(tmp_path / "rig.yaml")
    found: dict[str, str] = {}
    for problem in info.value.problems:
        found.setdefault(str(problem.field), problem.message)
    return found


def test_every_hint_at_once(tmp_path: Path) -> None:
    found = problems(tmp_path)
    assert found["rigs.pair.gpus.model"].endswith("did you mean 'NVIDIA GeForce RTX 3090'?")
    assert found["rigs.pair.ddp.master"].endswith("is not a host of the fleet; did you mean 'lab-1'?")
    assert found["rigs.quad.gpus.model"].startswith("'REPLACE ME' is a placeholder")
    assert found["rigs.bridge"].endswith("not a rig type: indented one level too far left?")
    assert not [field for field in found if field.startswith("rigs.bridge.")]  # one line, not four
    # The $PATH rule despite the bad names beside it, in the fleet's env and in a rig's.
    assert found["env.PATH"].startswith("value of PATH refers to $PATH")
    assert found["rigs.pair.env.LD_LIBRARY_PATH"].startswith("value of LD_LIBRARY_PATH refers to")
    assert "env.BAD-NAME" in found and "rigs.pair.env.2BAD" in found


def test_an_exact_or_unknown_name_passes(tmp_path: Path) -> None:
    for model in ("NVIDIA GeForce RTX 3090", "NVIDIA Some Future GPU"):
        gpus = f'    gpus: {{model: "{model}", count: 1}}\n'
        (tmp_path / "rig.yaml").write_text("version: 1\nhosts:\n  - {name: a, rig: r}\nrigs:\n  r:\n" + gpus)
        assert load_rig(tmp_path / "rig.yaml").spec.rigs["r"].gpus.model == model


def test_a_misspelt_value_gets_did_you_mean_and_no_follow_on_problems(tmp_path: Path) -> None:
    """Issue 40 item 13: `nvlink_bridge` names nvlink-bridge, and the rules do not then judge `pairs` and
    `links` against the default `none` the user never wrote."""
    bridge = "    bridge: {kind: nvlink_bridge, pairs: [[0, 1]], links: 4}\n"
    gpus = "    gpus: {model: NVIDIA GeForce RTX 3090, count: 2}\n"
    rig = "version: 1\nhosts:\n  - {name: a, rig: r}\nrigs:\n  r:\n" + gpus
    (tmp_path / "rig.yaml").write_text(rig + bridge)
    with pytest.raises(SpecError) as info:
        load_rig(tmp_path / "rig.yaml")
    [problem] = info.value.problems
    assert problem.field == "rigs.r.bridge.kind", problem
    assert problem.message.endswith("got 'nvlink_bridge'; did you mean 'nvlink-bridge'?"), problem
