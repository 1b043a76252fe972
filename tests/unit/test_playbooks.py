"""Playbooks: the shipped ones load and match the top-level copies; bad files and tags give clear errors;
step selection and the Change-to-step mapping that apply filters with."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.jobs.playbooks import (
    PlaybookError,
    carried_out,
    in_step_order,
    load_playbook,
    packaged_playbooks,
    parse_playbook,
    reported,
    select_steps,
)
from mgpu_provision.plan.change import PHASES, Change, Phase

REPO = Path(__file__).resolve().parents[2]
PACKAGED = REPO / "mgpu_provision" / "playbooks"


def test_shipped_playbooks() -> None:
    """`provision` runs every phase in plan order: PHASES (plan/change.py) and provision.yaml say the same
    order twice, tied here (a phase added to one only fails this test)."""
    assert packaged_playbooks() == ["audit", "env", "provision"]
    assert tuple(s.name for s in load_playbook("provision").steps) == PHASES
    assert PHASES == ("checks", "env", "sli", "persistence", "driver", "containers", "reboot")
    assert [s.name for s in load_playbook("audit").steps] == ["checks"]
    assert [s.name for s in load_playbook("env").steps] == ["env"]


def test_a_playbook_file_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nsteps:\n  - {step: env}\n  - {step: sli, tags: [x11]}\n")
    playbook = load_playbook(str(path))
    assert playbook.name == "mine" and playbook.tags == {"env", "sli", "x11"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: p\nsteps: [{step: drivers}]\n",
            "p.yaml: steps[0].step: unknown step 'drivers' (known steps: checks",
        ),
        ("name: p\nsteps: [{step: env, when: x}]\n", "p.yaml: steps[0].when: unknown key"),
        ("name: p\nhosts: all\nsteps: [{step: env}]\n", "p.yaml: hosts: unknown key"),
        ("steps: [{step: env}]\n", "p.yaml: name: required key is missing"),
        ("name: p\nsteps: []\n", "p.yaml: steps: List should have at least 1 item"),
        ("name: p\nsteps: [{step: env}, {step: env}]\n", "p.yaml: steps: step(s) listed twice: env"),
        ("- env\n", "p.yaml: a playbook is a mapping with `name` and `steps`"),
        ("name: [\n", "p.yaml: not valid YAML"),
    ],
)
def test_invalid_playbooks(text: str, message: str) -> None:
    with pytest.raises(PlaybookError) as info:
        parse_playbook(text, "p.yaml")
    assert str(info.value).startswith(message)


def test_every_problem_is_reported() -> None:
    with pytest.raises(PlaybookError) as info:
        parse_playbook("name: p\nsteps: [{step: nope}, {step: env, x: 1}]\n", "p.yaml")
    assert len(str(info.value).splitlines()) == 2


def test_unknown_playbook_name_lists_the_shipped_ones() -> None:
    with pytest.raises(PlaybookError, match=r"no playbook named 'deploy' \(shipped: audit, env, provision; "):
        load_playbook("deploy")
    with pytest.raises(PlaybookError, match=r"named 'provison'; did you mean 'provision'\? \(shipped"):
        load_playbook("provison")  # issue 40 item 13


def test_missing_playbook_file() -> None:
    with pytest.raises(PlaybookError, match=r"cannot read playbook /nonexistent/p\.yaml: No such file"):
        load_playbook("/nonexistent/p.yaml")


def test_select_steps_by_tags() -> None:
    playbook = load_playbook("provision")
    every = ("checks", "env", "sli", "persistence", "driver", "containers", "reboot")
    assert select_steps(playbook, None, None) == every
    assert select_steps(playbook, ["files"], None) == ("env", "sli")
    assert select_steps(playbook, None, ["reboot", "gpu"]) == ("checks", "env", "sli", "containers")
    assert select_steps(playbook, ["driver"], ["reboot"]) == ("driver",)


def test_unknown_tags_are_refused() -> None:
    with pytest.raises(
        PlaybookError, match=r"unknown tag\(s\) nvlink for playbook audit \(its tags: checks\)"
    ):
        select_steps(load_playbook("audit"), ["nvlink"], None)


def change(resource: str, phase: Phase, step: dict[str, str] | None = None) -> Change:
    return Change(
        resource, "update" if step else "verify-failed", resource, None, None, agent_step=step, phase=phase
    )


CHECK = change("gpus", "checks")
FILE = change("file:/x", "env", {"kind": "file"})
DRIVER = change("driver", "driver", {"kind": "driver"})
REBOOT = change("reboot", "reboot", {"kind": "reboot"})


def test_reboots_belong_to_the_reboot_step_and_show_with_the_driver() -> None:
    assert reported(REBOOT, ("driver",)) and not carried_out(REBOOT, ("driver",))
    assert carried_out(REBOOT, ("reboot",))
    assert not reported(REBOOT, ("env",))


def test_checks_are_reported_never_carried_out() -> None:
    assert reported(CHECK, ("checks",)) and not carried_out(CHECK, ("checks",))
    assert not reported(CHECK, ("env",))


def test_changes_follow_the_playbook_order() -> None:
    steps = ("checks", "env", "driver", "reboot")
    assert in_step_order([REBOOT, DRIVER, FILE, CHECK], steps) == [CHECK, FILE, DRIVER, REBOOT]
    assert in_step_order([REBOOT, DRIVER, FILE, CHECK], ("env",)) == [FILE]
