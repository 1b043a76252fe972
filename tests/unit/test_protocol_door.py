"""What both ends of the agent protocol read from protocol.py alone: the one spelling of a branch, and the
defaults of every verb's arguments that the agent's door fills in (so a verb reads `args["x"]`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import mgpu_provision
from mgpu_provision import protocol
from mgpu_provision.node import __main__ as door

PACKAGE = Path(mgpu_provision.__file__).resolve().parent
# A dotted version's leading number, spelled by hand: what protocol.branch_of is for (a host name's first
# label is spelled the same way, and is not a version).
HAND_BRANCH = re.compile(r"""\.(split|partition)\(["']\.["'](, 1)?\)\[0\]""")


def test_branch_of_is_the_one_spelling_of_a_branch() -> None:
    spelled = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "protocol.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if HAND_BRANCH.search(line) and "hostname" not in line
    ]
    assert spelled == []
    assert protocol.branch_of("550.54.15") == "550" and protocol.branch_of("9.4") == "9"


def test_the_door_fills_in_every_declared_default_before_the_verb_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[dict[str, Any]] = []

    def reclaim(args: dict[str, Any], backend: object) -> tuple[dict[str, Any], None]:
        seen.append(args)
        return {}, None

    monkeypatch.setitem(door.VERBS, "reclaim", reclaim)
    reply, _ = door.handle("reclaim", json.dumps({"args": {"dry_run": False, "newer": 1}}))
    assert reply["ok"] is True
    assert seen == [
        {
            "policy": "orphans",
            "patterns": [],
            "grace_s": 10.0,
            "dry_run": False,  # given: kept
            "user": None,
            "pids": [],
            "newer": 1,  # unknown to this agent: left alone (an older agent answers a newer control side)
        }
    ]


def test_each_request_gets_its_own_copy_of_a_list_default() -> None:
    first, second = protocol.check_args("facts", {}), protocol.check_args("facts", {})
    first["files"].append("/etc/x")
    assert second["files"] == [] and protocol.VERB_ARGS["facts"]["files"].default == []


def test_verbs_read_their_arguments_as_the_door_filled_them() -> None:
    """No verb defaults an argument itself (`args.get(name, default)`): the door's default is the one."""
    reads = [
        f"{path.name}:{number}"
        for path in sorted((PACKAGE / "node" / "verbs").glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "args.get(" in line
    ]
    assert reads == []
