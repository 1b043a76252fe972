"""The agent's YAML subset reader must read twins exactly as PyYAML does, and refuse what it does not know."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mgpu_provision.node.nvidia.miniyaml import MiniYamlError, loads

TWINS = sorted((Path(__file__).resolve().parents[2] / "examples" / "twins").glob("*.yaml"))

SNIPPETS = {
    "nested": "a:\n  b:\n    c: 1\n  d: [1, 2, {e: f}]\n",
    "sequence at key indent": "items:\n- 1\n- two\n- {three: 3}\n",
    "sequence of mappings": "gpus:\n  - name: A\n    memory_mib: 10\n  - name: B\n    pcie: {gen: 4}\n",
    "nested sequences": "- - 1\n  - 2\n- - 3\n",
    "empty item": "-\n  a: 1\n- b\n",
    "scalars": "a: null\nb: ~\nc: true\nd: False\ne: -12\nf: 1.5\ng: 1e3\nh: .5\ni: 550.54.15\nj: 0-5\nk:\n",
    "more numbers": "l: 1.0e+3\nm: -.5\nn: 0\no: +7\np: 08\n",
    "quotes": "a: 'it''s'\nb: \"tab\\there \\\"q\\\" \\u00e9\"\nc: '#not a comment'\nd: x # comment\n",
    "comments and blanks": "# head\n\na: 1   # one\n\n# mid\nb: 2\n",
    "literal keep indent": "t: |2\n      GPU0\n  GPU0   X\n\nn: 1\n",
    "literal strip": "t: |-\n  one\n  two\n\n",
    "literal keep": "t: |+\n  one\n\nu: 1\n",
    "literal in list": "- t: |\n    a\n     b\n  n: 2\n",
    "flow across lines": "a: [1,\n  2, 3]\nb: {x: 1,\n  y: [2]}\n",
    "empty flow": "a: []\nb: {}\n",
    "document marker": "---\na: 1\n",
    "quoted key": "'a b': 1\n\"c\": 2\n",
    "colon in value": "url: http://x/y\nt: '12:30'\n",
    "trailing comma": "a: [1, 2,]\n",
    "tabs inside a literal": "t: |2\n  \tGPU0\tGPU1\n  GPU0\t X \tNV4\n",
    "scalar document": "just text\n",
    "empty document": "# nothing\n",
}


@pytest.mark.parametrize("path", TWINS, ids=lambda p: p.name)
def test_example_twins_read_as_pyyaml_reads_them(path: Path) -> None:
    text = path.read_text()
    assert loads(text) == yaml.safe_load(text)


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_subset_matches_pyyaml(name: str) -> None:
    assert loads(SNIPPETS[name]) == yaml.safe_load(SNIPPETS[name])


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("a: &x 1\nb: *x\n", 1, "anchors, aliases, tags and directives are not supported"),
        ("a: !!str 1\n", 1, "not supported"),
        ("a: >\n  folded\n", 1, "folded block scalars (>) are not supported"),
        ("a: 1\na: 2\n", 2, "duplicate key 'a'"),
        ("a: 1\n   b: 2\n", 2, "unexpected indentation"),
        ("a: 'open\n", 1, "unterminated quoted string"),
        ('a: "bad \\q"\n', 1, "unknown escape \\q"),
        ("a: [1, 2\n", 1, "expected ',' or ']'"),
        ("a: [1] x\n", 1, "text after a flow collection"),
        ("a: 'x' y\n", 1, "text after a quoted string"),
        ("a:\n\tb: 1\n", 2, "tabs are not allowed in indentation"),
        ("a: 1\n- b\n", 2, "expected 'key: value'"),
        ("a: |x\n  t\n", 1, "unsupported block scalar header"),
        ("a: 1\n---\nb: 2\n", 2, "expected 'key: value'"),
        ("a: 1\n: 2\n", 2, "empty mapping key"),
        ("t: 12:30\n", 1, "'12:30' is read differently by YAML parsers; quote it"),
        ("a: [010]\n", 1, "'010' is read differently"),
        ("a: yes\n", 1, "'yes' is read differently"),
        ("a: 2024-01-02\n", 1, "'2024-01-02' is read differently"),
        ("a: 1_000\n", 1, "'1_000' is read differently"),
        ("a: .inf\n", 1, "'.inf' is read differently"),
        ("a: 0x1F\n", 1, "'0x1F' is read differently"),
    ],
)
def test_outside_the_subset_is_refused_with_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(MiniYamlError) as caught:
        loads(text)
    assert caught.value.line == line
    assert message in str(caught.value)


_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**9), max_value=10**9),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=4), st.dictionaries(_KEYS, children, min_size=1, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, min_size=1, max_size=5), st.booleans())
def test_what_pyyaml_dumps_reads_back_the_same(data: dict[str, Any], flow: bool) -> None:
    text = yaml.safe_dump(data, default_flow_style=flow, width=10**6, allow_unicode=False)
    assert loads(text) == data
