"""The protocol tables of docs/ARCHITECTURE.md say what protocol.py declares: every verb and step kind, with
exactly its fields, which of them are required, and the defaults the door fills in; every error kind.

The table is the one screen a person reads to learn the protocol; a verb or field added to the code without
its row would make that screen wrong without anyone noticing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mgpu_provision import protocol

DOC = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"
FIELD = re.compile(r"`([a-z_0-9]+)`(\*|=(\S+?))?(?=[ ,(]|$)")


def table(first_header: str) -> dict[str, str]:
    """Rows of the table whose first header cell is `first_header`: name -> its second cell."""
    rows: dict[str, str] = {}
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1]
    return rows


def fields(cell: str) -> dict[str, str | None]:
    """name -> "*" (required), the default's text, or None (optional, no default documented)."""
    found: dict[str, str | None] = {}
    for match in FIELD.finditer(cell):
        found[match.group(1)] = "*" if match.group(2) == "*" else match.group(3)
    return found


def shown(default: object) -> str:
    return json.dumps(default) if not isinstance(default, str) else default


def test_every_verb_is_a_row_with_exactly_its_arguments_required_marks_and_defaults() -> None:
    rows = table("verb")
    assert set(rows) == set(protocol.VERB_ARGS)
    for verb, args in protocol.VERB_ARGS.items():
        documented = fields(rows[verb])
        assert set(documented) == set(args), verb
        for name, arg in args.items():
            # Every default the door fills in is on the screen (null ones leave the argument unmarked).
            want = "*" if arg.required else None if arg.default is None else shown(arg.default)
            assert documented[name] == want, f"{verb}.{name}"


def test_every_step_kind_is_a_row_with_exactly_its_fields_required_marks_and_defaults() -> None:
    rows = table("step kind")
    assert set(rows) == set(protocol.STEP_FIELDS)
    for kind, step_fields in protocol.STEP_FIELDS.items():
        documented = fields(rows[kind])
        assert set(documented) == set(step_fields), kind
        for name, arg in step_fields.items():
            mark = documented[name]
            if arg.required:
                assert mark == "*", f"{kind}.{name} is required"
            elif arg.default is not None and mark is not None:
                assert mark.rstrip(",") == shown(arg.default), f"{kind}.{name}"


def test_every_error_kind_is_a_row_and_every_row_a_declared_kind() -> None:
    assert list(table("error kind")) == list(protocol.ERROR_KINDS)


def test_the_field_reader_sees_marks_and_defaults() -> None:
    assert fields("`path`*, `mode`=0644, `gpus`=[] (every GPU), `user`") == {
        "path": "*",
        "mode": "0644",
        "gpus": "[]",
        "user": None,
    }
