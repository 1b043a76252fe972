"""`mgpu-provision schema`: print the JSON Schema of the rig file, generated from the models.

Editors (yaml-language-server) and CI use the schema to complete and check rig files; generating it from the
pydantic models keeps it from drifting from what `validate` accepts. `schemas/rig.schema.json` is this
command's output, committed, and a test fails when it is stale.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..rig.models import RigFile
from .output import print_json

SCHEMA_ID = "https://mgpu-provision.dev/schemas/rig.schema.json"


def checked_names(node: Any) -> Any:
    """`node` with `propertyNames` beside every one-pattern `patternProperties`: alone, a pattern only
    checks the keys that match it, so `rigs: {"rtx 3090": ...}` left that whole section unchecked."""
    if isinstance(node, list):
        return [checked_names(item) for item in node]
    if not isinstance(node, dict):
        return node
    fixed = {key: checked_names(value) for key, value in node.items()}
    patterns = list(fixed.get("patternProperties", {}))
    if len(patterns) == 1:
        fixed["propertyNames"] = {**fixed.get("propertyNames", {}), "pattern": patterns[0]}
    return fixed


def rig_schema() -> dict[str, Any]:
    """The rig file's JSON Schema (draft 2020-12, which pydantic generates), keys of maps checked too."""
    schema = checked_names(RigFile.model_json_schema())
    schema.pop("title", None)  # pydantic's is the class name; ours goes first with the ids
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "mgpu-provision rig file",
        **schema,
    }


def schema_text() -> str:
    return json.dumps(rig_schema(), indent=2, sort_keys=False) + "\n"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="print the rig file's JSON Schema",
        description=(
            "Print the JSON Schema of rig files.\n\n"
            "Editors (yaml-language-server) use it to complete and check rig files; CI can check them\n"
            "with it."
        ),
        epilog="examples:\n  mgpu-provision schema > rig.schema.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="the schema inside the --json envelope")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json:  # the shared envelope, the schema under `schema` (plain output is the schema file itself)
        return print_json(0, {}, schema=rig_schema())
    print(schema_text(), end="")
    return 0
