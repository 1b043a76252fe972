"""Load a rig file: bounded, safe YAML that remembers where every value was written, then models and rules.

A rig file's errors are the first thing a user meets, so each one names file:line:column, the field and what
was expected, and all of them come at once. PyYAML's own loaders forget positions, accept duplicate keys and
expand aliases without limit, so this module reads the text itself in three steps: a streaming pass over
the parser's events caps size, nesting and node count before anything is built; libyaml composes the node
tree; a walk turns nodes into plain data, recording positions, refusing duplicate keys and non-plain tags,
and capping alias expansion. Pydantic's terse errors are then rewritten against those positions.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails
from yaml.constructor import SafeConstructor

from ..errors import ProvisionError, SpecError, SpecProblem
from . import models
from .models import Host, Rig, RigFile
from .rules import Finding, Loc, RuleInput, check_rules, resolve_path

MAX_BYTES = 1 << 20
MAX_DEPTH = 32  # a rig file nests about 5 levels
MAX_NODES = 20_000  # as written: a fleet of 2,000 hosts fits
MAX_EXPANDED = 40_000  # counting what aliases stand for: stops "billion laughs" at once

_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {_TAG + name for name in ("null", "bool", "int", "float", "str", "seq", "map")}
_TIMESTAMP = _TAG + "timestamp"  # kept as the text written: no field is a date
_MERGE = _TAG + "merge"
# Every character YAML refuses to read (C0 and C1 controls but tab, newlines and NEL; non-characters), so that
# the refusal is a located message rather than PyYAML's ReaderError.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ufffe\uffff]")
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster; marks are the same

# What a person should write where the models use a regular expression.
_PATTERN_HELP = {
    models.HOST_NAME: "a name of letters, digits, '.', '_' and '-' (starting with a letter or digit)",
    models.ENV_NAME: "a variable name of letters, digits and '_' (not starting with a digit)",
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


@dataclass(frozen=True)
class Position:
    line: int  # 1-based, as editors count
    column: int


@dataclass
class SourceMap:
    """Where each value and each mapping key of the document was written, by its path of keys and indices."""

    values: dict[Loc, Position] = field(default_factory=dict)
    keys: dict[Loc, Position] = field(default_factory=dict)
    texts: dict[Loc, str] = field(default_factory=dict)  # scalars as written, to quote them back

    def nearest(self, loc: Loc) -> Loc:
        """The longest prefix of `loc` that is in the document (the root always is)."""
        while loc not in self.values:
            loc = loc[:-1]
        return loc

    def position(self, loc: Loc, *, at_key: bool = False) -> Position:
        if at_key and loc in self.keys:
            return self.keys[loc]
        return self.values[self.nearest(loc)]


class _Rejected(Exception):
    """The file cannot be read as a rig file at all; nothing after this point can say more."""

    def __init__(self, message: str, position: Position | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.position = position


@dataclass(frozen=True)
class LoadedRig:
    """A valid rig file and the questions every command asks of it."""

    path: Path
    base_dir: Path
    spec: RigFile

    def host(self, name: str) -> Host:
        for host in self.spec.hosts:
            if host.name == name:
                return host
        raise ProvisionError(f"{self.path}: no host named '{name}'")

    def rig_of(self, host: Host) -> Rig:
        return self.spec.rigs[host.rig]

    def resolve(self, p: str) -> Path:
        return resolve_path(self.base_dir, p)

    def ddp_group(self, host: Host) -> list[Host]:
        """The hosts that train together with `host`: those whose rig names the same DDP master.

        The master comes first (rank 0), the others in file order. A host of a rig without `ddp` is alone.
        """
        ddp = self.rig_of(host).ddp
        if ddp is None:
            return [host]
        members = [
            other
            for other in self.spec.hosts
            if (other_ddp := self.rig_of(other).ddp) is not None and other_ddp.master == ddp.master
        ]
        return sorted(members, key=lambda other: other.name != ddp.master)

    def node_rank(self, host: Host) -> int:
        return [member.name for member in self.ddp_group(host)].index(host.name)

    def visible_indices(self, host: Host, gpu_uuids: Sequence[str] | None = None) -> list[int] | None:
        """NVML indices CUDA may see on `host`; None means all.

        UUID entries (or unique prefixes) are mapped to indices through `gpu_uuids`, the host's GPU UUIDs in
        index order as its facts report them; a UUID that cannot be mapped is an error.
        """
        devices = self.rig_of(host).visible_devices
        if devices is None:
            return None
        indices = []
        for device in devices:
            if isinstance(device, int):
                indices.append(device)
                continue
            gpu_uuid = device.split("/")[0].removeprefix("MIG-")  # MIG-<GPU uuid>/gi/ci lives on that GPU
            matches = [i for i, uuid in enumerate(gpu_uuids or ()) if uuid.startswith(gpu_uuid)]
            if len(matches) != 1:
                raise ProvisionError(
                    f"{host.name}: visible device {device} matches no single GPU of the host"
                )
            indices.append(matches[0])
        return indices


def load_rig(path: str | Path) -> LoadedRig:
    """Read, check and return a rig file; raise SpecError carrying every problem found."""
    path = Path(path)
    shown = str(path)
    try:
        data, source, yaml_problems = _parse(_read_text(path))
    except _Rejected as exc:
        pos = exc.position
        raise SpecError(
            [SpecProblem(shown, exc.message, pos.line if pos else None, pos.column if pos else None)]
        ) from None
    problems = [
        SpecProblem(shown, message, pos.line, pos.column, _field_name(loc) or None)
        for loc, pos, message in yaml_problems
    ]
    base_dir = path.resolve().parent
    findings: list[tuple[Finding, bool]] = []  # (finding, is it a "missing key" pointing at the parent)
    spec: RigFile | None = None
    try:
        spec = RigFile.model_validate(data)
    except ValidationError as exc:
        findings.extend(_schema_findings(exc.errors(), source))
    findings.extend((f, False) for f in _rule_findings(data, spec, base_dir))
    # A refused tag or merge key already explains why the value under it is missing or wrong.
    explained = [loc for loc, _, _ in yaml_problems]
    findings = [(f, m) for f, m in findings if not any(f.loc[: len(loc)] == loc for loc in explained)]
    for finding, missing in findings:
        if missing:
            parent = source.nearest(finding.loc[:-1])
            pos = source.keys.get(parent) or source.values[parent]
        else:
            pos = source.position(finding.loc, at_key=finding.at_key)
        problems.append(SpecProblem(shown, finding.message, pos.line, pos.column, _field_name(finding.loc)))
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.column or 0))
        raise SpecError(problems)
    assert spec is not None  # no problems means the schema validated
    return LoadedRig(path=path, base_dir=base_dir, spec=spec)


# --- reading the bytes -------------------------------------------------------------------------------


def _position_at(text: str, offset: int) -> Position:
    line_start = text.rfind("\n", 0, offset) + 1
    return Position(text.count("\n", 0, offset) + 1, offset - line_start + 1)


def _read_text(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise _Rejected("file not found") from None
    except IsADirectoryError:
        raise _Rejected("is a folder, not a rig file") from None
    except OSError as exc:
        raise _Rejected(f"cannot read the file: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise _Rejected(f"file is larger than {MAX_BYTES // 1024} KiB; a rig file is a few KiB of YAML")
    nul = data.find(b"\0")
    if nul >= 0:
        head = data[:nul].decode("utf-8", errors="replace")
        raise _Rejected("NUL byte in the text; is this a binary file?", _position_at(head, len(head)))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = data[: exc.start].decode("utf-8")
        raise _Rejected(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x}); is this a binary file?",
            _position_at(head, len(head)),
        ) from None
    bad = _CONTROL.search(text)
    if bad:
        raise _Rejected(
            f"control character U+{ord(bad.group()):04X} in the text; is this a binary file?",
            _position_at(text, bad.start()),
        )
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise _Rejected("empty file: expected a mapping with at least `hosts` and `rigs`")
    return text


# --- YAML to plain data with positions --------------------------------------------------------------


def _mark_position(mark: Any) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _yaml_error(exc: yaml.MarkedYAMLError, text: str) -> _Rejected:
    mark = exc.problem_mark or exc.context_mark
    pos = _mark_position(mark) if mark is not None else None
    lines = text.splitlines()
    if (
        pos is not None
        and pos.line <= len(lines)
        and lines[pos.line - 1][pos.column - 1 : pos.column] == "\t"
    ):
        return _Rejected("tab character: YAML indentation must use spaces", pos)
    problem = exc.problem or "invalid YAML"
    context = exc.context or ""
    if context.startswith("while parsing a flow") and exc.context_mark is not None:
        opened = _mark_position(exc.context_mark)
        bracket = "[" if "sequence" in context else "{"
        problem = f"'{bracket}' opened at line {opened.line}:{opened.column} is not closed ({problem})"
    elif context and exc.context_mark is not None:
        at = _mark_position(exc.context_mark)
        problem = f"{problem} ({context} started at line {at.line}:{at.column})"
    return _Rejected(f"invalid YAML: {problem}", pos)


def _check_events(text: str) -> None:
    """Refuse deep, huge, alias-bombed or multi-document streams before any node is built.

    The parser streams events, so this pass holds nothing but the open collections. It sizes every anchored
    value as it closes, so that what aliases would expand to is counted without expanding anything.
    """
    open_sizes: list[list[Any]] = []  # per open collection: [values in it so far, its anchor]
    anchored: dict[str, int] = {}
    nodes = expanded = documents = 0
    for event in yaml.parse(text, Loader=_Loader):
        where = _mark_position(event.start_mark)
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise _Rejected("more than one YAML document (---): a rig file is one document", where)
        elif isinstance(event, yaml.CollectionEndEvent):
            size, anchor = open_sizes.pop()
            if anchor is not None:
                anchored[anchor] = size
            if open_sizes:
                open_sizes[-1][0] += size
        elif isinstance(event, yaml.NodeEvent):
            nodes += 1
            size = anchored.get(event.anchor or "", 1) if isinstance(event, yaml.AliasEvent) else 1
            expanded += size
            if isinstance(event, yaml.CollectionStartEvent):
                open_sizes.append([1, event.anchor])
            elif open_sizes:
                open_sizes[-1][0] += size
            if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
                anchored[event.anchor] = 1
            if len(open_sizes) > MAX_DEPTH:
                raise _Rejected(f"nested deeper than {MAX_DEPTH} levels", where)
            if nodes > MAX_NODES:
                raise _Rejected(f"more than {MAX_NODES} YAML values; a rig file is far smaller", where)
            if expanded > MAX_EXPANDED:
                raise _Rejected(f"aliases expand to more than {MAX_EXPANDED} values (an alias bomb?)", where)


class _Builder:
    """Turns a composed node tree into plain data, recording positions and collecting problems."""

    def __init__(self) -> None:
        self.source = SourceMap()
        self.problems: list[tuple[Loc, Position, str]] = []
        self._constructor = SafeConstructor()

    def build(self, node: yaml.Node, loc: Loc) -> object:
        self.source.values[loc] = _mark_position(node.start_mark)
        if not self._plain(node, loc):
            return None
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, loc)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*loc, index)) for index, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        self.source.texts[loc] = node.value
        return self._scalar(node)

    def _plain(self, node: yaml.Node, loc: Loc) -> bool:
        """Only plain data: an explicit tag such as !!python/object is refused, never constructed."""
        if node.tag in _PLAIN_TAGS or node.tag == _TIMESTAMP:
            return True
        tag = node.tag.replace(_TAG, "!!")
        position = _mark_position(node.start_mark)
        self.problems.append((loc, position, f"tag {tag} is not allowed: rig files are plain data"))
        return False

    def _scalar(self, node: yaml.ScalarNode) -> object:
        if node.tag == _TIMESTAMP:
            return node.value
        return self._constructor.construct_object(node)

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[object, object]:
        result: dict[object, object] = {}
        for key_node, value_node in node.value:
            pos = _mark_position(key_node.start_mark)
            if key_node.tag == _MERGE:
                self.problems.append((loc, pos, "merge keys (<<) are not supported; write the keys out"))
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append((loc, pos, "a mapping key must be a plain name, not a list or mapping"))
                continue
            if not self._plain(key_node, loc):
                continue
            key = self._scalar(key_node)
            if not isinstance(key, str | int):
                key = key_node.value  # true/null/1.5 as keys: keep the text, the models reject it by name
            child = (*loc, key)
            if key in result:
                first = self.source.keys[child].line
                self.problems.append(
                    (child, pos, f"duplicate key '{key_node.value}' (first at line {first})")
                )
                continue
            self.source.keys[child] = pos
            result[key] = self.build(value_node, child)
        return result


def _parse(text: str) -> tuple[dict[str, object], SourceMap, list[tuple[Loc, Position, str]]]:
    try:
        _check_events(text)
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, text) from None
    if root is None:
        raise _Rejected("empty file: only comments; expected a mapping with at least `hosts` and `rigs`")
    if not isinstance(root, yaml.MappingNode):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else "a single value"
        raise _Rejected(
            f"the top level is {kind}; expected a mapping (version, hosts, rigs, ...)",
            _mark_position(root.start_mark),
        )
    builder = _Builder()
    data = builder.build(root, ())
    assert isinstance(data, dict)
    return data, builder.source, builder.problems


# --- pydantic errors in words a person understands --------------------------------------------------


def _field_name(loc: Loc) -> str:
    name = ""
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


def _unwrap(annotation: Any) -> Any:
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
        annotation = _unwrap(annotation)
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
    annotation = _unwrap(annotation)
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


def _unknown_key(loc: Loc) -> str:
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    if model is None:
        return f"unknown key '{key}'"
    choices = list(model.model_fields)
    close = difflib.get_close_matches(key, choices, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown key '{key}'{hint}; expected one of: {', '.join(choices)}"


def _schema_findings(errors: Sequence[ErrorDetails], source: SourceMap) -> Iterator[tuple[Finding, bool]]:
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


# --- rules on whatever part of the file is valid ----------------------------------------------------


M = TypeVar("M", bound=BaseModel)


def _salvage(model: type[M], raw: object, loc: Loc, left_out: list[Loc]) -> M | None:
    """Validate `raw`; when that fails, salvage what can be: failed nested models are salvaged in turn,
    other failed keys are dropped if optional. Gives up (None) when a required key cannot be saved.

    Whatever had to be left out is added to `left_out`, so that the rules stay quiet about it.
    """
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        failed = {error["loc"][0] for error in exc.errors() if error["loc"]}
    if not isinstance(raw, dict):
        left_out.append(loc)
        return None
    kept = dict(raw)
    for key in failed:
        info = model.model_fields.get(str(key))
        inner = _unwrap(info.annotation) if info is not None else None
        if key in raw and isinstance(inner, type) and issubclass(inner, BaseModel):
            saved = _salvage(inner, raw[key], (*loc, key), left_out)
            if saved is not None:
                kept[key] = saved
                continue
        if info is not None and info.is_required():
            left_out.append(loc)
            return None
        kept.pop(key, None)
        left_out.append((*loc, key))
    try:
        return model.model_validate(kept)
    except ValidationError:  # a cross-field validator that needs what was dropped
        left_out.append(loc)
        return None


def _salvage_section(name: str, raw: object, left_out: list[Loc]) -> Any:
    annotation = _unwrap(RigFile.model_fields[name].annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _salvage(annotation, raw, (name,), left_out)
    info = RigFile.model_fields[name]
    annotated: Any = Annotated[info.annotation, info]  # the field's type with its constraints
    try:
        return TypeAdapter(annotated).validate_python(raw)
    except ValidationError:
        left_out.append((name,))
        return None


def _rule_findings(data: dict[str, object], spec: RigFile | None, base_dir: Path) -> list[Finding]:
    """Rule findings, also for a file with schema errors: rules see the parts that did validate.

    Findings inside a left-out part are dropped: its schema errors already describe it.
    """
    raw_hosts = data.get("hosts") if isinstance(data.get("hosts"), list) else []
    raw_rigs = data.get("rigs") if isinstance(data.get("rigs"), dict) else {}
    assert isinstance(raw_hosts, list) and isinstance(raw_rigs, dict)
    declared_hosts = frozenset(
        item["name"] for item in raw_hosts if isinstance(item, dict) and isinstance(item.get("name"), str)
    )
    declared_rigs = frozenset(name for name in raw_rigs if isinstance(name, str))
    left_out: list[Loc] = []
    if spec is None:
        hosts = [(i, _salvage(Host, raw, ("hosts", i), left_out)) for i, raw in enumerate(raw_hosts)]
        rigs = {name: _salvage(Rig, raw, ("rigs", name), left_out) for name, raw in raw_rigs.items()}
        sections: dict[str, Any] = {
            name: _salvage_section(name, data[name], left_out)
            for name in RigFile.model_fields.keys() - {"hosts", "rigs"}
            if name in data
        }
        spec = RigFile.model_construct(
            hosts=[host for _, host in hosts if host is not None],
            rigs={name: rig for name, rig in rigs.items() if rig is not None},
            **{name: value for name, value in sections.items() if value is not None},
        )
        host_index = tuple(i for i, host in hosts if host is not None)
    else:
        host_index = tuple(range(len(spec.hosts)))
    inp = RuleInput(spec, host_index, declared_hosts, declared_rigs, base_dir)
    # A finding inside a left-out part, or about a part that lost a child, may only echo the schema error.
    return [f for f in check_rules(inp) if not any(_related(f.loc, part) for part in left_out)]


def _related(a: Loc, b: Loc) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]
