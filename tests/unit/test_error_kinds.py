"""The error kinds of the agent protocol are declared once (`protocol.ERROR_KINDS`) and checked both ways:
every kind the node's code raises is declared, the node's door sends no other, and the control side names
a kind it does not know instead of passing it on as if it were one."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.errors import AgentError
from mgpu_provision.fleet.session import parse_response
from mgpu_provision.node import __main__ as door
from mgpu_provision.node.core.errors import AgentFailure

NODE = Path(door.__file__).resolve().parent
# Calls whose argument at this position (or keyword) is an error kind: AgentFailure(kind, message) and the
# package commands' run_all(commands, kind).
KIND_ARGUMENTS = {"AgentFailure": (0, "kind"), "run_all": (1, "what")}


def raised_kinds() -> dict[str, list[str]]:
    """Every literal error kind the node's code passes, with where: {kind: ["file:line", ...]}."""
    found: dict[str, list[str]] = {}
    for path in sorted(NODE.rglob("*.py")):
        for call in ast.walk(ast.parse(path.read_text())):
            if not isinstance(call, ast.Call):
                continue
            name = getattr(call.func, "id", getattr(call.func, "attr", None))
            if name not in KIND_ARGUMENTS:
                continue
            position, keyword = KIND_ARGUMENTS[name]
            values = [k.value for k in call.keywords if k.arg == keyword]
            values += call.args[position : position + 1]
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    where = f"{path.relative_to(NODE)}:{call.lineno}"
                    found.setdefault(value.value, []).append(where)
    return found


def test_every_kind_the_node_raises_is_declared() -> None:
    found = raised_kinds()
    assert {"bad-request", "driver", "twin", "locked", "slurm"} <= set(found)  # the reader sees them
    undeclared = {kind: where for kind, where in found.items() if kind not in protocol.ERROR_KINDS}
    assert undeclared == {}


def test_the_door_sends_no_undeclared_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: object, backend: object) -> None:
        raise AgentFailure("Fabric Manager", "zypper install failed")

    monkeypatch.setitem(door.VERBS, "facts", broken)
    reply, _ = door.handle("facts", "{}")
    assert reply["error"] == {
        "kind": "internal",
        "message": "undeclared error kind 'Fabric Manager': zypper install failed",
    }


def test_the_door_sends_a_declared_kind_as_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def locked(args: object, backend: object) -> None:
        raise AgentFailure("locked", "another apply is running")

    monkeypatch.setitem(door.VERBS, "facts", locked)
    reply, _ = door.handle("facts", "{}")
    assert reply["error"] == {"kind": "locked", "message": "another apply is running"}


@pytest.mark.parametrize("error", [{"kind": "disk-full", "message": "no space"}, {"message": "no space"}])
def test_the_control_side_names_a_kind_it_does_not_know(error: dict[str, str]) -> None:
    stdout = json.dumps({"ok": False, "agent_version": "9", "error": error})
    with pytest.raises(AgentError) as caught:
        parse_response("gpu-a", "apply", 0, stdout, "")
    said = str(caught.value)
    assert said.startswith("agent apply on gpu-a answered an error of a kind this version does not know (")
    assert said.endswith("): no space") and "bad-request, twin" in said


def test_every_declared_kind_reads_as_that_kind_on_the_control_side() -> None:
    for kind in protocol.ERROR_KINDS:
        stdout = json.dumps({"ok": False, "error": {"kind": kind, "message": "m"}})
        with pytest.raises(AgentError, match=rf"^agent apply failed on gpu-a \({kind}\): m$"):
            parse_response("gpu-a", "apply", 0, stdout, "")
