"""The JSON Schema: generated from the models, committed in schemas/, and used by the example rig files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.cli import main
from mgpu_provision.commands.schema import SCHEMA_ID, rig_schema, schema_text

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "schemas" / "rig.schema.json"


def test_committed_schema_is_current() -> None:
    assert COMMITTED.read_text() == schema_text(), (
        "schemas/rig.schema.json is stale; regenerate it with: "
        "mgpu-provision schema > schemas/rig.schema.json"
    )


def test_schema_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == rig_schema()


def test_schema_has_identity_and_forbids_unknown_keys() -> None:
    schema = rig_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == SCHEMA_ID
    assert schema["title"] == "mgpu-provision rig file"
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"rigs"}  # hosts may all come from an inventory
    assert all(d.get("additionalProperties") is False for d in schema["$defs"].values() if "properties" in d)


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_point_editors_at_the_schema(example: Path) -> None:
    first = example.read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, f"{example.name} must start with the yaml-language-server schema comment"
    assert (example.parent / match.group(1)).resolve() == COMMITTED


def _accepts(schema: dict[str, Any], value: object) -> bool:
    """The SLI mode schema's branches (enum, string pattern, const), read as Draft 2020-12 reads them."""
    for branch in schema["anyOf"]:
        if "enum" in branch and value in branch["enum"]:
            return True
        if branch.get("type") == "string" and isinstance(value, str) and re.search(branch["pattern"], value):
            return True
        if "const" in branch and value is branch["const"]:
            return True
    return False


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("Off", True),
        ("Mosaic", True),
        ("BaseMosaic", True),
        ("mosaic", True),
        (False, True),
        ("AFR", False),
        ("On", False),
        (True, False),
        ("Mosaic2", False),
    ],
)
def test_sli_mode_lists_the_accepted_modes(value: object, accepted: bool) -> None:
    mode = rig_schema()["$defs"]["Sli"]["properties"]["mode"]
    assert mode["anyOf"][0] == {"enum": ["Off", "Mosaic", "BaseMosaic"]}  # what editors offer as completions
    assert "type" not in mode  # a plain string type would let `AFR` through
    assert _accepts(mode, value) is accepted
