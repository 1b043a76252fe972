"""What both ends of the agent protocol read from protocol.py alone: the one spelling of a branch, and the
defaults of every verb's arguments that the agent's door fills in (so a verb reads `args["x"]`)."""

from __future__ import annotations

import re
from pathlib import Path

import mgpu_provision
from mgpu_provision import protocol

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
