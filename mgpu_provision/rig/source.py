"""A rig file's text read safely into plain data that remembers where every value was written.

PyYAML's own loaders forget positions, accept duplicate keys and expand aliases without limit, so the text is
read in three steps: a streaming pass over the parser's events caps size, nesting and node count before
anything is built; libyaml composes the node tree; a walk turns nodes into plain data, recording positions,
refusing duplicate keys and non-plain tags, and capping alias expansion.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from .rules import Loc

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


class Rejected(Exception):
    """The file cannot be read as a rig file at all; nothing after this point can say more."""

    def __init__(self, message: str, position: Position | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.position = position


def _position_at(text: str, offset: int) -> Position:
    line_start = text.rfind("\n", 0, offset) + 1
    return Position(text.count("\n", 0, offset) + 1, offset - line_start + 1)


def read_text(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise Rejected("file not found") from None
    except IsADirectoryError:
        raise Rejected("is a folder, not a rig file") from None
    except OSError as exc:
        raise Rejected(f"cannot read the file: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise Rejected(f"file is larger than {MAX_BYTES // 1024} KiB; a rig file is a few KiB of YAML")
    nul = data.find(b"\0")
    if nul >= 0:
        head = data[:nul].decode("utf-8", errors="replace")
        raise Rejected("NUL byte in the text; is this a binary file?", _position_at(head, len(head)))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = data[: exc.start].decode("utf-8")
        raise Rejected(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x}); is this a binary file?",
            _position_at(head, len(head)),
        ) from None
    bad = _CONTROL.search(text)
    if bad:
        raise Rejected(
            f"control character U+{ord(bad.group()):04X} in the text; is this a binary file?",
            _position_at(text, bad.start()),
        )
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise Rejected("empty file: expected a mapping with at least `hosts` and `rigs`")
    return text


def _mark_position(mark: Any) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _yaml_error(exc: yaml.MarkedYAMLError, text: str) -> Rejected:
    mark = exc.problem_mark or exc.context_mark
    pos = _mark_position(mark) if mark is not None else None
    lines = text.splitlines()
    if (
        pos is not None
        and pos.line <= len(lines)
        and lines[pos.line - 1][pos.column - 1 : pos.column] == "\t"
    ):
        return Rejected("tab character: YAML indentation must use spaces", pos)
    problem = exc.problem or "invalid YAML"
    context = exc.context or ""
    if context.startswith("while parsing a flow") and exc.context_mark is not None:
        opened = _mark_position(exc.context_mark)
        bracket = "[" if "sequence" in context else "{"
        problem = f"'{bracket}' opened at line {opened.line}:{opened.column} is not closed ({problem})"
    elif context and exc.context_mark is not None:
        at = _mark_position(exc.context_mark)
        problem = f"{problem} ({context} started at line {at.line}:{at.column})"
    return Rejected(f"invalid YAML: {problem}", pos)


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
                raise Rejected("more than one YAML document (---): a rig file is one document", where)
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
                raise Rejected(f"nested deeper than {MAX_DEPTH} levels", where)
            if nodes > MAX_NODES:
                raise Rejected(f"more than {MAX_NODES} YAML values; a rig file is far smaller", where)
            if expanded > MAX_EXPANDED:
                raise Rejected(f"aliases expand to more than {MAX_EXPANDED} values (an alias bomb?)", where)


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


def parse(text: str) -> tuple[dict[str, object], SourceMap, list[tuple[Loc, Position, str]]]:
    try:
        _check_events(text)
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, text) from None
    if root is None:
        raise Rejected("empty file: only comments; expected a mapping with at least `hosts` and `rigs`")
    if not isinstance(root, yaml.MappingNode):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else "a single value"
        raise Rejected(
            f"the top level is {kind}; expected a mapping (version, hosts, rigs, ...)",
            _mark_position(root.start_mark),
        )
    builder = _Builder()
    data = builder.build(root, ())
    if not isinstance(data, dict):  # a tagged top level: the builder refused it and says why
        _, position, message = builder.problems[0]
        raise Rejected(message, position)
    return data, builder.source, builder.problems
