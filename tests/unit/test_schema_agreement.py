"""The JSON Schema and `validate` agree: a third-party validator (jsonschema, with ECMA-262 regexes as
check-jsonschema uses them) accepts both schemas, and judges a corpus of good and bad rig files as the tool
does. The disagreements left are the cross-field rules no schema can state; each is listed in
docs/rig-schema.md and checked here to be exactly that.

jsonschema and regress are test dependencies (pyproject's `test` extra); without them these tests skip.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision.errors import SpecError
from mgpu_provision.rig import load_rig

jsonschema = pytest.importorskip("jsonschema")
regress = pytest.importorskip("regress")

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = [ROOT / "schemas" / "rig.schema.json", ROOT / "schemas" / "twin.schema.json"]

GOOD = """\
version: 1
hosts:
  - {name: gpu-a, address: 10.0.0.11, port: 22, rig: pair}
  - {name: gpu-b, address: 10.0.0.12, rig: pair}
groups:
  lab: [gpu-a, gpu-b]
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2, persistence_mode: true}
    bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}
    visible_devices: [0, 1]
    env: {NCCL_DEBUG: WARN}
    ddp: {master: gpu-a, port: 29500, backend: gloo, nproc_per_node: 2}
env:
  OMP_NUM_THREADS: "4"
"""

# (name, text in place, text instead): each turns GOOD into a file both must refuse.
BAD = {
    "port as a string": ("port: 29500", 'port: "29500"'),
    "rig name with a space": ("  pair:\n    gpus", '  "rtx 3090":\n    gpus'),
    "group name with a bang": ("  lab: [", '  "lab!": ['),
    "env name with a digit first": ("NCCL_DEBUG: WARN", "1NCCL: WARN"),
    "fleet env name with a dash": ("OMP_NUM_THREADS:", "OMP-THREADS:"),
    "count as a string": ("count: 2,", 'count: "2",'),
    "persistence as a string": ("persistence_mode: true", 'persistence_mode: "true"'),
    "port out of range": ("port: 22,", "port: 70000,"),
    "visible device as a string": ("visible_devices: [0, 1]", 'visible_devices: ["0", 1]'),
    "pair index as a string": ("pairs: [[0, 1]]", 'pairs: [["0", 1]]'),
    "unknown key": ("version: 1\n", "version: 1\nfleet: x\n"),
    "unknown bridge kind": ("kind: nvlink-bridge", "kind: sli-bridge"),
    "runfile url with a quote": (
        "    visible_devices",
        '    driver: {version: "550.54.15", method: runfile, runfile_url: "https://x/a\\"b.run"}\n'
        "    visible_devices",
    ),
}

# Refused by the tool's cross-field rules (rig/rules.py), which no JSON Schema can state: the schema
# accepts these. docs/rig-schema.md lists each.
RULES_ONLY = {
    "host names a rig that is not defined": ("rig: pair}\n  - {name: gpu-b", "rig: quad}\n  - {name: gpu-b"),
    "host name used twice": ("name: gpu-b", "name: gpu-a"),
    "visible device beyond the GPU count": ("visible_devices: [0, 1]", "visible_devices: [0, 2]"),
    "ddp master not in the fleet": ("master: gpu-a", "master: gpu-z"),
    "group member not in the fleet": ("lab: [gpu-a, gpu-b]", "lab: [gpu-a, gpu-z]"),
}


def tool_accepts(tmp_path: Path, text: str) -> bool:
    (tmp_path / "rig.yaml").write_text(text)
    try:
        load_rig(tmp_path / "rig.yaml")
    except SpecError:
        return False
    return True


def schema_accepts(text: str) -> bool:
    schema = json.loads(SCHEMAS[0].read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    return bool(validator.is_valid(yaml.safe_load(text)))


def patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key == "patternProperties":
                yield from value
                yield from patterns(list(value.values()))
            else:
                yield from patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from patterns(item)


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.name)
def test_each_schema_is_valid_under_its_metaschema_with_ecma_regexes(path: Path) -> None:
    schema = json.loads(path.read_text())
    jsonschema.validators.validator_for(schema).check_schema(schema)
    for pattern in patterns(schema):
        regress.Regex(pattern, "u")  # what check-jsonschema's default mode compiles; raises when invalid


def test_patterned_maps_check_their_keys() -> None:
    """`patternProperties` alone leaves a key outside the pattern unchecked (and its whole value with it)."""

    def maps(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if "patternProperties" in node:
                yield node
            for value in node.values():
                yield from maps(value)
        elif isinstance(node, list):
            for item in node:
                yield from maps(item)

    found = list(maps(json.loads(SCHEMAS[0].read_text())))
    assert found
    for node in found:
        (pattern,) = node["patternProperties"]
        assert node["propertyNames"]["pattern"] == pattern


def test_the_good_file_passes_both(tmp_path: Path) -> None:
    assert tool_accepts(tmp_path, GOOD) and schema_accepts(GOOD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_file_is_refused_by_both(tmp_path: Path, name: str) -> None:
    old, new = BAD[name]
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    assert (tool_accepts(tmp_path, text), schema_accepts(text)) == (False, False)


@pytest.mark.parametrize("name", sorted(RULES_ONLY))
def test_a_cross_field_rule_is_the_tools_alone_and_documented(tmp_path: Path, name: str) -> None:
    old, new = RULES_ONLY[name]
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    assert (tool_accepts(tmp_path, text), schema_accepts(text)) == (False, True)
    assert name in (ROOT / "docs" / "rig-schema.md").read_text()


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_pass_both(path: Path, tmp_path: Path) -> None:
    text = path.read_text()
    assert load_rig(path) is not None
    assert schema_accepts(text), re.sub(r"\s+", " ", text)[:200]
