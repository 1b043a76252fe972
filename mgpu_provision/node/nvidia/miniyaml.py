"""A small YAML reader for twin files, because the node agent may not depend on PyYAML.

It reads the subset twins are written in: block mappings and sequences, flow `{a: 1}` / `[1, 2]`, single- and
double-quoted strings, literal block scalars (`|`, `|2`, `|-`, `|+`), comments, and the plain scalars null, ~,
true, false, integers and floats. Anything outside the subset (anchors, tags, folded `>` scalars, several
documents) is refused with the line number rather than read differently from PyYAML.

Shipped to nodes inside the agent: standard library only, Python 3.8.
"""

from __future__ import annotations

import re

from ...typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Dict, Iterator, List, Optional, Tuple

# Numbers as PyYAML (YAML 1.1) resolves them, without the forms refused below.
_INT = re.compile(r"^[-+]?(0|[1-9][0-9]*)$")
_FLOAT = re.compile(r"^([-+]?[0-9]+\.[0-9]*|\.[0-9]+)([eE][-+][0-9]+)?$")
# Plain scalars YAML 1.1 turns into something a reader of the twin would not expect (octal 010, 12:30 as
# 750, yes/no/on/off as booleans, dates, .inf); refused so that they are quoted instead of misread.
_AMBIGUOUS = re.compile(
    r"^([-+]?0[0-7_]+|[-+]?0[xob][0-9a-fA-F_]+|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"
    r"|[-+]?[0-9]+(_[0-9_]*)+(\.[0-9_]*)?|[-+]?[0-9]+\.[0-9]*_[0-9_]*"
    r"|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"
    r"|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*|=|<<)$"
)
_BLOCK_HEADER = re.compile(r"^\|([1-9])?([-+])?([1-9])?$")
_DOUBLE_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "/": "/", "0": "\0", "r": "\r", " ": " "}


class MiniYamlError(ValueError):
    """The text is not in the YAML subset this reader handles; the message names the line (1-based)."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}")


def loads(text: str) -> Any:
    """Parse one YAML document of the supported subset into dicts, lists and scalars."""
    parser = _Parser(text.replace("\r\n", "\n").split("\n"))
    return parser.document()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _unquoted(text: str) -> Iterator[Tuple[int, str]]:
    """(position, character) of the characters outside quoted scalars.

    A quote opens a scalar only where one can start (an apostrophe inside a word does not); inside, `''`
    and backslash escapes do not close it.
    """
    quote: Optional[str] = None
    pos = 0
    while pos < len(text):
        char = text[pos]
        if quote is None:
            if char in "'\"" and (pos == 0 or text[pos - 1] in " \t[{,:"):
                quote = char
            else:
                yield pos, char
        elif (quote == "'" and text[pos : pos + 2] == "''") or (quote == '"' and char == "\\"):
            pos += 1  # an escaped character: skip it with its escape
        elif char == quote:
            quote = None
        pos += 1


def _strip_comment(text: str) -> str:
    """Drop a trailing `# comment` that sits outside quotes (a `#` must follow whitespace to start one)."""
    for pos, char in _unquoted(text):
        if char == "#" and (pos == 0 or text[pos - 1] in " \t"):
            return text[:pos].rstrip()
    return text.rstrip()


def _split_key(text: str, lineno: int) -> Optional[Tuple[str, str]]:
    """Split `key: value` at the first mapping colon outside quotes and brackets; None when there is none."""
    for pos, char, depth in _unquoted_depths(text):
        if char == ":" and depth == 0 and (pos + 1 == len(text) or text[pos + 1] in " \t"):
            key = text[:pos].strip()
            if not key:
                raise MiniYamlError(lineno, "empty mapping key")
            return _scalar_key(key, lineno), text[pos + 1 :].strip()
    return None


def _scalar_key(key: str, lineno: int) -> str:
    value = _plain_or_quoted(key, lineno)
    return value if isinstance(value, str) else key


def _plain_or_quoted(text: str, lineno: int) -> Any:
    if text[:1] in "'\"":
        value, rest = _quoted(text, 0, lineno)
        if rest != len(text):
            raise MiniYamlError(lineno, f"text after a quoted string: {text[rest:]!r}")
        return value
    return _plain(text, lineno)


def _plain(text: str, lineno: int) -> Any:
    if text[:1] in ("&", "*", "!", "@", "`", "%"):
        raise MiniYamlError(lineno, f"anchors, aliases, tags and directives are not supported: {text!r}")
    if _AMBIGUOUS.match(text):
        raise MiniYamlError(lineno, f"{text!r} is read differently by YAML parsers; quote it")
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def _quoted(text: str, pos: int, lineno: int) -> Tuple[str, int]:
    """Read a quoted string starting at text[pos]; return it and the index after the closing quote."""
    quote = text[pos]
    out: List[str] = []
    pos += 1
    while pos < len(text):
        char = text[pos]
        if quote == "'" and char == "'":
            if text[pos + 1 : pos + 2] == "'":
                out.append("'")
                pos += 2
                continue
            return "".join(out), pos + 1
        if quote == '"' and char == '"':
            return "".join(out), pos + 1
        if quote == '"' and char == "\\":
            pos, decoded = _escape(text, pos, lineno)
            out.append(decoded)
            continue
        out.append(char)
        pos += 1
    raise MiniYamlError(lineno, "unterminated quoted string")


def _escape(text: str, pos: int, lineno: int) -> Tuple[int, str]:
    code = text[pos + 1 : pos + 2]
    if code in _DOUBLE_ESCAPES:
        return pos + 2, _DOUBLE_ESCAPES[code]
    widths = {"x": 2, "u": 4, "U": 8}
    if code in widths:
        digits = text[pos + 2 : pos + 2 + widths[code]]
        if len(digits) == widths[code]:
            try:
                return pos + 2 + widths[code], chr(int(digits, 16))
            except ValueError:
                pass
    raise MiniYamlError(lineno, f"unknown escape \\{code} in a double-quoted string")


class _Flow:
    """Reads one flow collection (`{...}` or `[...]`), possibly nested, from a single string."""

    def __init__(self, text: str, lineno: int) -> None:
        self.text = text
        self.pos = 0
        self.lineno = lineno

    def parse(self) -> Any:
        value = self._value()
        self._space()
        if self.pos != len(self.text):
            raise MiniYamlError(self.lineno, f"text after a flow collection: {self.text[self.pos :]!r}")
        return value

    def _space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def _value(self) -> Any:
        self._space()
        char = self.text[self.pos : self.pos + 1]
        if char == "[":
            return self._sequence()
        if char == "{":
            return self._mapping()
        if char in ("'", '"'):
            value, self.pos = _quoted(self.text, self.pos, self.lineno)
            return value
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ",]}":
            if self.text[self.pos] == ":" and self.text[self.pos + 1 : self.pos + 2] in (" ", ""):
                break
            self.pos += 1
        return _plain(self.text[start : self.pos].strip(), self.lineno)

    def _items(self, close: str, read: Any) -> None:
        self.pos += 1
        self._space()
        if self.text[self.pos : self.pos + 1] == close:
            self.pos += 1
            return
        while True:
            read()
            self._space()
            char = self.text[self.pos : self.pos + 1]
            self.pos += 1
            if char == close:
                return
            if char != ",":
                raise MiniYamlError(self.lineno, f"expected ',' or '{close}' in a flow collection")
            self._space()
            if self.text[self.pos : self.pos + 1] == close:  # trailing comma
                self.pos += 1
                return

    def _sequence(self) -> List[Any]:
        items: List[Any] = []
        self._items("]", lambda: items.append(self._value()))
        return items

    def _mapping(self) -> Dict[Any, Any]:
        mapping: Dict[Any, Any] = {}

        def entry() -> None:
            key = self._value()
            self._space()
            if self.text[self.pos : self.pos + 1] == ":":
                self.pos += 1
                mapping[key] = self._value()
            else:
                mapping[key] = None

        self._items("}", entry)
        return mapping


class _Parser:
    """Indentation-driven block parser; `lines` is edited in place to read `- key: v` items as mappings."""

    def __init__(self, lines: List[str]) -> None:
        self.lines = lines
        self.pos = 0

    def document(self) -> Any:
        self._skip_blank()
        if self.pos < len(self.lines) and self.lines[self.pos].strip() == "---":
            self.pos += 1
            self._skip_blank()
        if self.pos >= len(self.lines):
            return None
        value = self._node(self._current_indent())
        self._skip_blank()
        if self.pos < len(self.lines):
            raise MiniYamlError(self.pos + 1, f"unexpected text: {self.lines[self.pos].strip()!r}")
        return value

    def _skip_blank(self) -> None:
        while self.pos < len(self.lines) and not _strip_comment(self.lines[self.pos]).strip():
            self.pos += 1

    def _current_indent(self) -> int:
        line = self.lines[self.pos]
        if line[_indent(line)] == "\t":
            raise MiniYamlError(self.pos + 1, "tabs are not allowed in indentation")
        return _indent(line)

    def _node(self, indent: int) -> Any:
        content = _strip_comment(self.lines[self.pos]).strip()
        if content == "-" or content.startswith("- "):
            return self._sequence(indent)
        if content[:1] not in "[{" and _split_key(content, self.pos + 1) is not None:
            return self._mapping(indent)
        self.pos += 1
        return self._inline(content, indent)

    def _sequence(self, indent: int) -> List[Any]:
        items: List[Any] = []
        while self._at(indent):
            content = _strip_comment(self.lines[self.pos]).strip()
            if not (content == "-" or content.startswith("- ")):
                break
            rest = content[1:].strip()
            if not rest:
                self.pos += 1
                items.append(self._child(indent, allow_same=False))
                continue
            # Re-read the item's text as a node indented where it starts, so `- a: 1` continues as a mapping.
            line = self.lines[self.pos]
            after_dash = line[indent + 1 :]
            column = indent + 1 + len(after_dash) - len(after_dash.lstrip(" "))
            self.lines[self.pos] = " " * column + line[column:]
            items.append(self._node(column))
        return items

    def _mapping(self, indent: int) -> Dict[Any, Any]:
        mapping: Dict[Any, Any] = {}
        while self._at(indent):
            lineno = self.pos + 1
            content = _strip_comment(self.lines[self.pos]).strip()
            split = _split_key(content, lineno)
            if split is None:
                raise MiniYamlError(lineno, f"expected 'key: value', got {content!r}")
            key, value = split
            if key in mapping:
                raise MiniYamlError(lineno, f"duplicate key {key!r}")
            self.pos += 1
            if value:
                mapping[key] = self._inline(value, indent, lineno)
            else:
                mapping[key] = self._child(indent, allow_same=True)
        return mapping

    def _at(self, indent: int) -> bool:
        """Is the next meaningful line at this indent? (Deeper is an error, shallower ends the block.)"""
        self._skip_blank()
        if self.pos >= len(self.lines):
            return False
        found = self._current_indent()
        if found > indent:
            raise MiniYamlError(self.pos + 1, "unexpected indentation")
        return found == indent

    def _child(self, indent: int, allow_same: bool) -> Any:
        """The block value of `key:` or `-`: deeper lines, or (for a key) a sequence at the key's indent."""
        self._skip_blank()
        if self.pos >= len(self.lines):
            return None
        found = self._current_indent()
        if found > indent:
            return self._node(found)
        content = _strip_comment(self.lines[self.pos]).strip()
        if allow_same and found == indent and (content == "-" or content.startswith("- ")):
            return self._sequence(indent)
        return None

    def _inline(self, value: str, indent: int, lineno: Optional[int] = None) -> Any:
        lineno = lineno if lineno is not None else self.pos
        if value.startswith("|"):
            return self._literal(value, indent, lineno)
        if value.startswith(">"):
            raise MiniYamlError(lineno, "folded block scalars (>) are not supported; use |")
        if value[:1] in "[{":
            return _Flow(self._continued_flow(value), lineno).parse()
        return _plain_or_quoted(value, lineno)

    def _continued_flow(self, value: str) -> str:
        """Join the following lines while the flow collection's brackets are still open."""
        text = value
        while _open_brackets(text) > 0 and self.pos < len(self.lines):
            text += " " + _strip_comment(self.lines[self.pos]).strip()
            self.pos += 1
        return text

    def _literal(self, header: str, indent: int, lineno: int) -> str:
        match = _BLOCK_HEADER.match(header)
        if not match or (match.group(1) and match.group(3)):
            raise MiniYamlError(lineno, f"unsupported block scalar header {header!r}")
        digit = match.group(1) or match.group(3)
        chomp = match.group(2) or ""
        block_indent = indent + int(digit) if digit else None
        body: List[str] = []
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            if not line.strip():
                body.append(line)
                self.pos += 1
                continue
            if block_indent is None:
                block_indent = _indent(line)
                if block_indent <= indent:
                    break
            if _indent(line) < block_indent:
                break
            body.append(line)
            self.pos += 1
        cut = block_indent or 0
        text_lines = [line[cut:] for line in body]
        while text_lines and not text_lines[-1].strip() and chomp != "+":
            text_lines.pop()
        text = "\n".join(text_lines)
        if chomp == "-" or not text:
            return text
        return text + "\n"


def _unquoted_depths(text: str) -> Iterator[Tuple[int, str, int]]:
    """Each character outside quotes with the bracket depth after it: flow collections may span lines."""
    depth = 0
    for pos, char in _unquoted(text):
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        yield pos, char, depth


def _open_brackets(text: str) -> int:
    """Brackets opened and not yet closed by the end of `text`."""
    depths = [depth for _, _, depth in _unquoted_depths(text)]
    return depths[-1] if depths else 0
