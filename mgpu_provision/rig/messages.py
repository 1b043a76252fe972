"""Pydantic's validation errors rewritten as messages a person can act on, located in the rig file.

"Input should be a valid integer" becomes "expected an integer, got 'two'", a misspelled key gets "did you
mean", union branches at one place become one message, and each finding keeps the path of keys and indices
that the loader turns into file:line:column.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from ..errors import did_you_mean
from . import models
from .models import RigFile
from .rules import Finding, Loc
from .source import SourceMap

# What a person should write where the models use a regular expression.
_PATTERN_HELP = {
    models.HOST_NAME: "a name of letters, digits, '.', '_' and '-' (starting with a letter or digit)",
    models.ENV_NAME: "a variable name of letters, digits and '_' (not starting with a digit)",
    models.INVENTORY_GROUP: "an Ansible group name of letters, digits, '_', '.' and '-'",
    models.GPU_UUID: "a GPU UUID such as GPU-1aff65f8-8897-eaee-29e4-6871ef7491a0",
    models.DRIVER_VERSION: 'a driver version such as "550.54.15"',
    models.DRIVER_BRANCH: 'a driver branch such as "550"',
    models.ABS_OR_RELATIVE_PATH: "a path of letters, digits and _ . / + - (no spaces, quotes, $, leading -)",
}
_EXPECTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
}
_BOUNDS = {
    "greater_than_equal": ("ge", "must be at least {}"),
    "greater_than": ("gt", "must be greater than {}"),
    "less_than_equal": ("le", "must be at most {}"),
    "less_than": ("lt", "must be less than {}"),
}


def field_name(loc: Loc) -> str:
    name = ""
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


def unwrap(annotation: Any) -> Any:
    """Strip Annotated and Optional, so that list/dict/model annotations are visible."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model that validates the value at `loc`, following fields, list items and dict values."""
    annotation: Any = RigFile
    for part in loc:
        annotation = unwrap(annotation)
        origin = get_origin(annotation)
        if (
            isinstance(annotation, type)
            and issubclass(annotation, BaseModel)
            and part in annotation.model_fields
        ):
            annotation = annotation.model_fields[str(part)].annotation
        elif origin is list:
            annotation = get_args(annotation)[0]
        elif origin is dict:
            annotation = get_args(annotation)[1]
        else:
            return None
    annotation = unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _got(error: ErrorDetails, loc: Loc, source: SourceMap) -> str:
    """What the person wrote: strings quoted, other scalars as written (YAML `Off` stays `Off`)."""
    value = error["input"]
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return repr(value) if "'" not in value else f'"{value}"'
    if loc in source.texts:
        return source.texts[loc]
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _expected(error: ErrorDetails) -> str | None:
    if error["type"] == "string_pattern_mismatch":
        pattern = str(error.get("ctx", {}).get("pattern", ""))
        return _PATTERN_HELP.get(pattern, f"text matching {pattern}")
    if error["type"] == "literal_error":
        return f"one of {error.get('ctx', {}).get('expected', '')}"
    return _EXPECTED.get(error["type"])


def _message(error: ErrorDetails, loc: Loc, source: SourceMap) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    got = _got(error, loc, source)
    expected = _expected(error)
    if expected is not None:
        hint = ""
        if kind == "string_type" and isinstance(error["input"], int | float | bool):
            hint = "; put it in quotes to mean the text (YAML reads it as a number or true/false)"
        if kind == "literal_error" and isinstance(error["input"], str):  # `nvlink_bridge`: nvlink-bridge
            hint = did_you_mean(error["input"], re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
        return f"expected {expected}, got {got}{hint}"
    if kind in _BOUNDS:
        key, template = _BOUNDS[kind]
        return f"{template.format(ctx.get(key))}, got {got}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "too_long":
        return f"takes at most {ctx.get('max_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "string_too_short":
        return (
            "must not be empty"
            if ctx.get("min_length") == 1
            else f"needs {ctx.get('min_length')}+ characters"
        )
    if kind == "string_too_long":
        return f"is longer than {ctx.get('max_length')} characters"
    if kind == "value_error":
        return str(error["msg"]).removeprefix("Value error, ")
    return str(error["msg"])


def error_message(error: ErrorDetails) -> str:
    """One pydantic error in words, for a value that was not written in the rig file (an inventory's)."""
    return _message(error, tuple(error["loc"]), SourceMap())


def _unknown_key(loc: Loc) -> str:
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    if model is None:
        return f"unknown key '{key}'"
    choices = list(model.model_fields)
    close = difflib.get_close_matches(key, choices, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown key '{key}'{hint}; expected one of: {', '.join(choices)}"


def schema_findings(errors: Sequence[ErrorDetails], source: SourceMap) -> Iterator[tuple[Finding, bool]]:
    """One finding per place in the document; union branches at one place are merged into one message."""
    branches: dict[Loc, list[ErrorDetails]] = {}
    for error in errors:
        loc: Loc = tuple(error["loc"])
        if error["type"] == "missing":
            if isinstance(loc[-1], int):
                yield Finding(loc[:-1], f"too few items: item {loc[-1]} is missing"), False
            else:
                yield Finding(loc, f"missing required key '{loc[-1]}'"), True
        elif error["type"] == "extra_forbidden":
            yield Finding(loc, _unknown_key(loc), at_key=True), False
        elif loc and loc[-1] == "[key]":
            yield Finding(loc[:-1], f"bad key: {_message(error, loc, source)}", at_key=True), False
        else:
            branches.setdefault(source.nearest(loc), []).append(error)
    for loc, group in branches.items():
        if len(group) == 1:
            yield Finding(loc, _message(group[0], loc, source)), False
            continue
        expected = [phrase for phrase in map(_expected, group) if phrase is not None]
        if len(expected) == len(group):
            yield Finding(loc, f"expected {' or '.join(expected)}, got {_got(group[0], loc, source)}"), False
        else:
            yield Finding(loc, "; or ".join(_message(error, loc, source) for error in group)), False
