"""Data-driven plan tests, in pyinfra's style: each `plan_cases/*.yaml` holds a rig, a box's facts and the
Changes `plan_host` must give, in order (resource, action, and a substring of the summary).

A case gives its facts inline (`facts:`), or builds them from a `box:` (a `nvidia-smi topo -m` file
from `tests/fixtures/topologies/`, the GPU model, and what is broken: down links, odd GPUs, PCIe
links, lost GPUs) with `facts:` keys replacing the built ones, `facts_patch_pairs:` ("a-b": {...})
changing single GPU pairs and `health:` adding health facts (see `tests/factories.case_health`). Either way
the result is validated by `facts.Facts`, as the agent's answer is. Every agent step a case plans must pass
the agent's door (`protocol.check_step`), so each case also holds a producer of steps to the contract.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mgpu_provision import protocol
from mgpu_provision.plan.host import plan_host
from mgpu_provision.rig import load_rig
from tests.support.factories import TOPOLOGIES, case_facts
from tests.support.plan_cases import CASES, load_case


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_plan_case(path: Path, tmp_path: Path) -> None:
    case = load_case(path)
    rig_file = tmp_path / "rig.yaml"
    rig_file.write_text(yaml.safe_dump(case["rig"]))
    (tmp_path / "topologies").symlink_to(TOPOLOGIES)  # the rig's topology_file is relative
    loaded = load_rig(rig_file)
    host = loaded.host(case.get("host", loaded.spec.hosts[0].name))
    changes = plan_host(loaded, host, case_facts(case))
    got = [(c.resource, c.action, c.summary) for c in changes]
    expected = case["expect"] or []
    assert [(r, a) for r, a, _ in got] == [(e["resource"], e["action"]) for e in expected], got
    for index, change in enumerate(changes):
        # Held to the agent's door: each step is what `apply` accepts (a reboot is the `reboot` verb's).
        if change.agent_step is not None and change.agent_step != protocol.reboot_step():
            assert protocol.check_step(index, change.agent_step), change
    for change, e in zip(changes, expected, strict=True):
        assert e["summary"] in change.summary
        # `step:` pins the keys of the agent step that apply would send (a subset: the rest may vary).
        for key, value in (e.get("step") or {}).items():
            step = change.agent_step
            assert step is not None and step.get(key) == value, (key, step)


def test_every_case_has_a_description_and_an_expectation() -> None:
    assert len(CASES) >= 20
    for path in CASES:
        case = load_case(path)
        assert case.get("description"), path.name
        assert "expect" in case, path.name
