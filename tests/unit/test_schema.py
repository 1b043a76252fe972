"""The JSON Schema: generated from the models, committed in schemas/, and used by the example rig files."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
    assert set(schema["required"]) == {"hosts", "rigs"}
    assert all(d.get("additionalProperties") is False for d in schema["$defs"].values() if "properties" in d)


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_point_editors_at_the_schema(example: Path) -> None:
    first = example.read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, f"{example.name} must start with the yaml-language-server schema comment"
    assert (example.parent / match.group(1)).resolve() == COMMITTED
