"""The loader: malformed and hostile files fail fast with a located message; schema errors read like advice.

Malformed files go through the real command line (`main([...])`), because what a user sees there is the
contract: exit 1, one clear line, no traceback, well under a second.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mgpu_provision.cli import build_parser, main
from mgpu_provision.errors import SpecError
from mgpu_provision.rig import load_rig
from mgpu_provision.rig.source import MAX_BYTES, MAX_DEPTH
from tests.support.rig_problems import problems_of

GOOD = b"""\
hosts:
  - {name: gpu-a, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
"""


def _bomb() -> bytes:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return "\n".join(lines).encode() + b"\n"


# name: (file bytes, "line:col" expected in the output or None, message fragment)
MALFORMED: dict[str, tuple[bytes, str | None, str]] = {
    "empty": (b"", None, "empty file"),
    "whitespace-only": (b"\n   \n", None, "empty file"),
    "comments-only": (b"# nothing here\n", None, "empty file: only comments"),
    "top-level-list": (b"- gpu-a\n- gpu-b\n", "1:1", "the top level is a list; expected a mapping"),
    "top-level-scalar": (b"gpu-a\n", "1:1", "the top level is a single value; expected a mapping"),
    "tab-indentation": (
        b"hosts:\n\t- {name: a, rig: b}\n",
        "2:1",
        "tab character: YAML indentation must use spaces",
    ),
    "unclosed-bracket": (
        b"hosts: [{name: a, rig: b}\nrigs: {}\n",
        "2:1",
        "'[' opened at line 1:8 is not closed",
    ),
    "unclosed-brace": (b"hosts: {name: a\n", "2:1", "'{' opened at line 1:8 is not closed"),
    "unterminated-quote": (b'hosts: "abc\n', "2:1", "invalid YAML: found unexpected end of stream"),
    "bad-indentation": (b"rigs:\n  a: 1\n b: 2\n", "3:2", "invalid YAML"),
    "duplicate-top-level-key": (GOOD + b"hosts: []\n", "6:1", "duplicate key 'hosts' (first at line 1)"),
    "duplicate-nested-key": (
        GOOD.replace(b"    gpus:", b"    bridge: {kind: none, kind: nvswitch}\n    gpus:"),
        "5:26",
        "duplicate key 'kind' (first at line 5)",
    ),
    "nul-byte": (GOOD + b"env: {A: \x00}\n", "6:10", "NUL byte in the text; is this a binary file?"),
    "not-utf8": (b"hosts: [\xff\xfe]\n", "1:9", "not UTF-8 text (byte 0xff)"),
    "binary": (
        b"\x7fELF\x02\x01\x01" + bytes(range(256)),
        "1:8",
        "NUL byte in the text; is this a binary file?",
    ),
    "control-character": (b"hosts: \x1b[31m\n", "1:8", "control character U+001B in the text"),
    "too-large": (b"# " + b"x" * MAX_BYTES + b"\n", None, "file is larger than 1024 KiB"),
    "deep-block-nesting": (
        "".join("  " * i + "a:\n" for i in range(MAX_DEPTH + 5)).encode(),
        None,
        f"nested deeper than {MAX_DEPTH} levels",
    ),
    "deep-flow-nesting": (b"a: " + b"[" * 5000 + b"]" * 5000, None, "nest"),
    "alias-bomb": (_bomb(), None, "aliases expand to more than"),
    "too-many-values": (b"a: [" + b"1, " * 200_000 + b"1]\n", None, "YAML values; a rig file is far smaller"),
    "python-tag": (
        b"hosts: !!python/object/apply:os.system ['id']\n",
        "1:8",
        "tag !!python/object/apply:os.system is not allowed: rig files are plain data",
    ),
    "python-tag-on-key": (
        b"!!python/name:os.system : 1\n",
        "1:1",
        "tag !!python/name:os.system is not allowed",
    ),
    # Found by the fuzz run: a tag on the top-level mapping left no mapping to read, and an assert fired.
    "tagged-top-level": (b"!0\n0:\n", "1:1", "tag !0 is not allowed: rig files are plain data"),
    "two-documents": (GOOD + b"---\n" + GOOD, "6:1", "more than one YAML document (---)"),
    "merge-key": (b"x: &x {a: 1}\ny:\n  <<: *x\n", "3:3", "merge keys (<<) are not supported"),
    "complex-key": (b"? [a, b]\n: 1\n", "1:3", "a mapping key must be a plain name"),
}


@pytest.fixture(scope="module")
def warm_cli() -> None:
    """Import every command module once, so that the time limit below measures reading the file."""
    build_parser()


@pytest.mark.usefixtures("warm_cli")
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_file_fails_fast_and_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    content, where, message = MALFORMED[name]
    path = tmp_path / "rig.yaml"
    path.write_bytes(content)
    started = time.perf_counter()
    code = main(["validate", str(path)])
    elapsed = time.perf_counter() - started
    out, err = capsys.readouterr()
    assert code == 1
    assert elapsed < 1.0, f"{name} took {elapsed:.2f}s"
    assert "Traceback" not in out + err
    assert message in out, out
    if where is not None:
        assert f"{path}:{where}:" in out, out
    assert out.splitlines()[-1].startswith(f"{path}: invalid, "), out


def test_missing_file_and_folder_are_problems_not_tracebacks(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found"):
        load_rig(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="is a folder, not a rig file"):
        load_rig(tmp_path)


def test_windows_line_endings_and_bom_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "rig.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.replace(b"\n", b"\r\n"))
    assert load_rig(path).spec.hosts[0].name == "gpu-a"


def test_anchors_and_aliases_are_allowed(tmp_path: Path) -> None:
    path = tmp_path / "rig.yaml"
    path.write_bytes(GOOD.replace(b"    gpus: {", b"    gpus: &g {") + b"  other:\n    gpus: *g\n")
    loaded = load_rig(path)
    assert loaded.spec.rigs["other"].gpus == loaded.spec.rigs["pair"].gpus


def rig_with(line: str) -> str:
    return GOOD.decode() + f"    {line}\n"


# name: (rig file text, field, line, column, message)
SCHEMA_CASES: dict[str, tuple[str, str, int, int, str]] = {
    "unknown-key-points-at-key": (
        rig_with("gpu: {model: x, count: 1}"),
        "rigs.pair.gpu",
        6,
        5,
        "unknown key 'gpu' (did you mean 'gpus'?); expected one of: gpus, bridge, driver, sli, "
        "visible_devices, ddp, slurm, containers, health, env, path_prepend",
    ),
    "health-check-unknown": (
        rig_with("health: {skip: [xid, temperature]}"),
        "rigs.pair.health.skip[1]",
        6,
        26,
        "expected one of 'xid', 'sxid', 'recovery_action', 'ecc', 'memory_repair', 'nvlink_errors', "
        "'throttle', 'power', 'compute_mode', 'mig', 'fabric' or 'kernel', got 'temperature'",
    ),
    "health-power-limit-range": (
        rig_with("health: {power_limit_w: 0}"),
        "rigs.pair.health.power_limit_w",
        6,
        29,
        "must be at least 1, got 0; or expected one of 'default', got 0",
    ),
    "integer-expected": (
        GOOD.decode().replace("count: 2", "count: two"),
        "rigs.pair.gpus.count",
        5,
        53,
        "expected an integer, got 'two'",
    ),
    "missing-key-points-at-parent": (
        "hosts: [{name: a, rig: pair}]\nrigs:\n  pair:\n    bridge: {kind: none}\n",
        "rigs.pair.gpus",
        3,
        3,
        "missing required key 'gpus'",
    ),
    "missing-host-key": (
        GOOD.decode().replace("{name: gpu-a, rig: pair}", "{name: gpu-a}"),
        "hosts[0].rig",
        2,
        5,
        "missing required key 'rig'",
    ),
    "index-or-uuid": (
        rig_with("visible_devices: [0, first]"),
        "rigs.pair.visible_devices[1]",
        6,
        26,
        "expected an integer or a GPU UUID such as GPU-1aff65f8-8897-eaee-29e4-6871ef7491a0, got 'first'",
    ),
    "number-where-text-expected": (
        rig_with("driver: {version: 550.54}"),
        "rigs.pair.driver.version",
        6,
        23,
        "expected a string, got 550.54; put it in quotes to mean the text (YAML reads it as a number or "
        "true/false)",
    ),
    "bad-pattern": (
        rig_with('driver: {version: "550"}'),
        "rigs.pair.driver.version",
        6,
        23,
        "expected a driver version such as \"550.54.15\", got '550'",
    ),
    "bad-key-name": (
        rig_with("env: {1BAD: x}"),
        "rigs.pair.env.1BAD",
        6,
        11,
        "bad key: expected a variable name of letters, digits and '_' (not starting with a digit), "
        "got '1BAD'",
    ),
    "bad-path-prepend-name": (
        rig_with("path_prepend: {LD-LIBRARY-PATH: [/a]}"),
        "rigs.pair.path_prepend.LD-LIBRARY-PATH",
        6,
        20,
        "bad key: expected a variable name of letters, digits and '_' (not starting with a digit), "
        "got 'LD-LIBRARY-PATH'",
    ),
    "path-prepend-entries-are-a-list": (
        rig_with("path_prepend: {PATH: /usr/local/cuda/bin}"),
        "rigs.pair.path_prepend.PATH",
        6,
        26,
        "expected a list, got '/usr/local/cuda/bin'",
    ),
    "literal": (
        rig_with('driver: {version: "550.54.15", method: pacman}'),
        "rigs.pair.driver.method",
        6,
        44,
        "expected one of 'apt', 'dnf', 'yum', 'zypper' or 'runfile', got 'pacman'",
    ),
    "lower-bound": (
        GOOD.decode().replace("count: 2", "count: 0"),
        "rigs.pair.gpus.count",
        5,
        53,
        "must be at least 1, got 0",
    ),
    "port-range": (
        GOOD.decode().replace("rig: pair}", "rig: pair, port: 70000}"),
        "hosts[0].port",
        2,
        36,
        "must be at most 65535, got 70000",
    ),
    "pair-too-long": (
        rig_with("bridge: {kind: nvlink-bridge, links: 4, pairs: [[0, 1, 2]]}"),
        "rigs.pair.bridge.pairs[0]",
        6,
        53,
        "takes at most 2 item(s), got 3",
    ),
    "pair-too-short": (
        rig_with("bridge: {kind: nvlink-bridge, links: 4, pairs: [[0]]}"),
        "rigs.pair.bridge.pairs[0]",
        6,
        53,
        "too few items: item 1 is missing",
    ),
    "bad-regex": (
        GOOD.decode() + "reclaim: {policy: orphans+patterns, patterns: ['(']}\n",
        "reclaim.patterns",
        6,
        47,
        "pattern '(' is not a valid regular expression: missing ), unterminated subpattern at position 0",
    ),
    "empty-hosts": (
        GOOD.decode().replace("  - {name: gpu-a, rig: pair}\n", "").replace("hosts:", "hosts: []"),
        "hosts",
        1,
        8,
        "the fleet has no hosts: list them under `hosts:`, or read them from an Ansible `inventory:`",
    ),
    "empty-section": (
        rig_with("bridge:"),
        "rigs.pair.bridge",
        6,
        12,
        "expected a mapping (key: value), got nothing",
    ),
    "yaml-boolean-where-text-expected": (
        GOOD.decode().replace("rig: pair}", "rig: pair, user: no}"),
        "hosts[0].user",
        2,
        36,
        "expected a string, got no; put it in quotes to mean the text (YAML reads it as a number or "
        "true/false)",
    ),
    "path-that-would-be-an-option": (
        GOOD.decode().replace("rig: pair}", "rig: pair, python: -s}"),
        "hosts[0].python",
        2,
        38,
        "expected a path of letters, digits and _ . / + - (no spaces, quotes, $, leading -), got '-s'",
    ),
    "quoted-count": (
        GOOD.decode().replace("count: 2", 'count: "2"'),
        "rigs.pair.gpus.count",
        5,
        53,
        "expected an integer, got '2'",
    ),
    "boolean-visible-device": (
        rig_with("visible_devices: [true, 0]"),
        "rigs.pair.visible_devices[0]",
        6,
        23,
        "expected an integer or a string, got true",
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEMA_CASES))
def test_schema_error_is_located_and_explained(tmp_path: Path, name: str) -> None:
    text, field, line, column, message = SCHEMA_CASES[name]
    problems = problems_of(tmp_path, text)
    assert [(p.field, p.line, p.column, p.message) for p in problems] == [(field, line, column, message)]


def test_all_problems_are_reported_in_file_order(tmp_path: Path) -> None:
    text = GOOD.decode().replace("count: 2", "count: two").replace("rig: pair}", "rig: pair, prot: 22}")
    problems = problems_of(tmp_path, text + "smoke: {batch_size: -1}\n")
    assert [(p.line, p.field) for p in problems] == [
        (2, "hosts[0].prot"),
        (5, "rigs.pair.gpus.count"),
        (6, "smoke.batch_size"),
    ]
    assert problems[0].render() == (
        f"{tmp_path / 'rig.yaml'}:2:30: hosts[0].prot: unknown key 'prot' (did you mean 'port'?); "
        "expected one of: user, port, identity_file, jump, become, python, name, address, rig, groups, "
        "connection, simulate, os"
    )


def test_alias_use_is_located_at_its_anchor(tmp_path: Path) -> None:
    text = GOOD.decode() + "smoke: &s {batch_size: zero}\nreclaim: *s\n"
    problems = problems_of(tmp_path, text)
    assert {(p.field, p.line) for p in problems} >= {("smoke.batch_size", 6)}
