"""Fuzzing the three parsers that take input from outside: the rig loader, `nvidia-smi topo -m`, the agent.

Whatever arrives — generated YAML, mutated bytes of the shipped examples, garbage — each must end in its own
clear error (SpecError, TopologyParseError, the agent's error envelope) or a valid result, quickly. Any other
exception is a bug that a user would meet as a traceback.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mgpu_provision.catalog.topology import TopologyParseError, parse_topology
from mgpu_provision.errors import SpecError
from mgpu_provision.fleet.bundle import build_agent
from mgpu_provision.node import __main__ as agent_main
from mgpu_provision.rig import load_rig
from tests.support.fuzzing import (
    EXAMPLES,
    TOPOLOGIES,
    budget,
    json_values,
    mutated_bytes,
    seed_files,
    timed,
)
from tests.support.hosts import load_twin
from tests.support.trial import Trial


def load_or_spec_error(path: Path, trial: Trial) -> None:
    try:
        load_rig(path)
    except SpecError as exc:
        assert str(exc).strip(), "a SpecError without a message"
        trial.count("rejected")
    else:
        trial.count("valid")


def mutate_document(data: Any, path: list[Any], value: Any, action: str) -> Any:
    """`data` with the node at `path` replaced, deleted, or given an extra key."""
    data = copy.deepcopy(data)
    parent, key = None, None
    node = data
    for step in path:
        if isinstance(node, dict) and node:
            key = list(node)[step % len(node)]
        elif isinstance(node, list) and node:
            key = step % len(node)
        else:
            break
        parent, node = node, node[key]
    if parent is None:
        return value
    if action == "delete" and isinstance(parent, dict):
        del parent[key]
    elif action == "add" and isinstance(node, dict):
        node[str(value)[:20]] = value
    else:
        parent[key] = value
    return data


EXAMPLE_DOCS = [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))]


def test_rig_loader_on_mutated_example_documents(tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = (
        "fuzz",
        "rig loader + validator: example rig files with one node replaced/removed",
    )
    trial.expect = "a loaded rig or a SpecError, each within 2 s"
    rig = tmp_path / "rig.yaml"

    @budget(300)
    @given(
        st.sampled_from(EXAMPLE_DOCS),
        st.lists(st.integers(0, 50), max_size=5),
        json_values(),
        st.sampled_from(["replace", "delete", "add"]),
    )
    def check(doc: Any, path: list[int], value: Any, action: str) -> None:
        rig.write_text(yaml.safe_dump(mutate_document(doc, path, value, action)))
        timed(trial, load_or_spec_error)(rig, trial)

    check()
    assert trial.figures["valid"] > 0 and trial.figures["rejected"] > 0  # both paths were exercised


def test_rig_loader_on_mutated_example_bytes(tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = (
        "fuzz",
        "rig loader + validator: bytes of the example rig files flipped/cut/spliced",
    )
    trial.expect = "a loaded rig or a SpecError, each within 2 s"
    rig = tmp_path / "rig.yaml"

    @budget(300)
    @given(mutated_bytes(seed_files(EXAMPLES, "*.yaml")))
    def check(data: bytes) -> None:
        rig.write_bytes(data)
        timed(trial, load_or_spec_error)(rig, trial)

    check()


def test_rig_loader_on_arbitrary_text(tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "fuzz", "rig loader + validator: arbitrary text and YAML-ish token soup"
    trial.expect = "a SpecError, each within 2 s"
    rig = tmp_path / "rig.yaml"
    tokens = st.sampled_from(
        [
            "hosts:",
            "rigs:",
            "- ",
            "{",
            "}",
            "[",
            "]",
            "&a",
            "*a",
            "<<: ",
            "!!python/object:os.system",
            "\n",
            "  ",
            ": ",
            "'",
            '"',
            "version: 1",
            "? ",
            "|2\n",
            "%YAML 1.1\n",
            "---\n",
            "\t",
            "\x00",
        ]
    )

    @budget(300)
    @given(st.text() | st.lists(tokens | st.text(max_size=5), max_size=40).map("".join))
    def check(text: str) -> None:
        rig.write_text(text, encoding="utf-8", errors="surrogatepass")
        timed(trial, load_or_spec_error)(rig, trial)

    check()


def test_rig_loader_bounds_alias_bombs_and_huge_files(tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "fuzz", "rig loader: billion-laughs alias bomb, 50 MB file, 10 000-deep nesting"
    trial.expect = "a SpecError naming the limit, each within 2 s"
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)
    )
    cases = {
        "bomb": bomb + "hosts: *j\n",
        "huge": "# " + "x" * 50_000_000 + "\n",
        "deep": "hosts: " + "[" * 10_000 + "]" * 10_000 + "\n",
    }
    for name, text in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        timed(trial, load_or_spec_error)(path, trial)
    assert trial.figures["rejected"] == len(cases)


TOPOLOGY_SEEDS = seed_files(TOPOLOGIES, "*.txt")


def parse_or_topology_error(text: str, trial: Trial) -> None:
    try:
        parse_topology(text)
    except TopologyParseError as exc:
        assert str(exc).strip()
        trial.count("rejected")
    else:
        trial.count("parsed")


def test_topology_parser_on_mutated_real_matrices(trial: Trial) -> None:
    trial.area, trial.tried = "fuzz", "`nvidia-smi topo -m` parser: real published matrices, bytes mutated"
    trial.expect = "a matrix or a TopologyParseError, each within 2 s"

    @budget(500)
    @given(mutated_bytes(TOPOLOGY_SEEDS))
    def check(data: bytes) -> None:
        timed(trial, parse_or_topology_error)(data.decode("utf-8", errors="replace"), trial)

    check()


def test_topology_parser_on_generated_matrices(trial: Trial) -> None:
    trial.area, trial.tried = "fuzz", "`nvidia-smi topo -m` parser: generated grids of cells, labels, legends"
    trial.expect = "a matrix or a TopologyParseError, each within 2 s"
    cells = st.sampled_from(
        [
            "X",
            " X ",
            "NV4",
            "NV18",
            "PIX",
            "PXB",
            "PHB",
            "NODE",
            "SYS",
            "SOC",
            "N/A",
            "0-5",
            "0",
            "",
            "NV",
            "NV-1",
            "GPU0",
            "NIC0",
            "mlx5_0",
            "Legend:",
            "CPU Affinity",
        ]
    )
    seps = st.sampled_from(["\t", " ", "   ", "\t\t"])
    rows = st.lists(st.lists(cells, max_size=12), max_size=12)

    @budget(500)
    @given(rows, seps)
    def check(grid: list[list[str]], sep: str) -> None:
        timed(trial, parse_or_topology_error)("\n".join(sep.join(row) for row in grid), trial)

    check()


# Strings without "/" can only name things inside the test's working folder: the fuzzed `apply` verb may
# create a lock or state file wherever its arguments say.
SAFE_TEXT = st.text(alphabet=st.characters(blacklist_characters="/\x00"), max_size=12)


def envelope_ok(reply: dict[str, Any]) -> None:
    assert set(reply) == {"ok", "agent_version", "result"} or set(reply) == {"ok", "agent_version", "error"}
    json.dumps(reply)  # it must be sendable
    if not reply["ok"]:
        error = reply["error"]
        assert isinstance(error["kind"], str) and isinstance(error["message"], str) and error["message"]


@pytest.fixture
def agent_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A simulated node in a scratch folder, so that no fuzzed request can touch real NVIDIA state."""
    twin = tmp_path / "twin.yaml"
    twin.write_text(load_twin("rtx3090-nvlink"))
    monkeypatch.setenv("MGPU_PROVISION_SIMULATE", str(twin))
    monkeypatch.chdir(tmp_path)
    return twin


def test_agent_request_handling_on_arbitrary_json(agent_sandbox: Path, trial: Trial) -> None:
    trial.area, trial.tried = "fuzz", "agent request handling (in-process): every verb with arbitrary JSON"
    trial.expect = "one JSON envelope each within 2 s, never kind `internal` (a traceback: unchecked input)"
    verbs = st.sampled_from([*agent_main.VERBS, "", "nope", "facts "]) | st.none()
    # Real argument names and step keys, so that values of the wrong type reach the code that reads them.
    # `python` never names a real interpreter: the facts verb would start it to probe torch.
    values = json_values(SAFE_TEXT).filter(lambda v: v != "python3")
    steps = st.lists(st.dictionaries(st.sampled_from(STEP_KEYS), values, max_size=6), max_size=3)
    requests = (
        st.fixed_dictionaries(
            {"args": st.dictionaries(st.sampled_from(ARG_KEYS), values | steps, max_size=6)}
        )
        | st.fixed_dictionaries({"args": json_values(SAFE_TEXT), "simulate": st.none() | SAFE_TEXT})
        | json_values(SAFE_TEXT)
    )

    def one(verb: str | None, raw: str) -> None:
        reply, _after = agent_main.handle(verb, raw)  # `after` (a real reboot) is deliberately never run
        envelope_ok(reply)
        kind = "ok" if reply["ok"] else reply["error"]["kind"]
        # `internal` is an envelope too, but one the agent only answers after an unexpected exception.
        assert kind != "internal", (verb, raw, reply)
        trial.count("ok" if kind == "ok" else "refused")

    @budget(300)
    @given(verbs, requests.map(json.dumps) | st.text(max_size=40))
    def check(verb: str | None, raw: str) -> None:
        timed(trial, one)(verb, raw)

    check()


ARG_KEYS = [
    "files",
    "include_content",
    "python",
    "xorg_paths",
    "lock",
    "lock_wait_s",
    "steps",
    "policy",
    "patterns",
    "grace_s",
    "dry_run",
]
STEP_KEYS = [
    "kind",
    "path",
    "content",
    "mode",
    "method",
    "version",
    "branch",
    "flavor",
    "hold",
    "gpus",
    "enabled",
    "source",
    "packages",
    "unit",
    "enable",
    "start",
]


# Found by the fuzz test above: the agent read request values without checking their types, so they ended as
# kind `internal` with a traceback on stderr. the protocol check (protocol.py) now refuses them at the door.
@pytest.mark.parametrize(
    ("verb", "request_"),
    [
        ("facts", {"args": {}, "simulate": {"a": 1}}),
        ("facts", {"args": {"files": 0.1}}),
        ("facts", {"args": {"files": [None]}}),
        ("facts", {"args": {"xorg_paths": True}}),
        ("facts", {"args": {"python": [{}]}}),
        ("apply", {"args": {"lock": "lock", "lock_wait_s": "never"}}),
        ("apply", {"args": {"lock": "lock", "steps": 7.5}}),
    ],
)
def test_agent_refuses_mistyped_arguments_as_bad_requests(
    agent_sandbox: Path, trial: Trial, verb: str, request_: dict[str, Any]
) -> None:
    trial.area, trial.tried = "fuzz", f"agent: mistyped request {json.dumps(request_)[:60]}"
    trial.expect = "error kind bad-request naming the argument (was: kind internal, a traceback)"
    reply, _after = agent_main.handle(verb, json.dumps(request_))
    assert reply["ok"] is False
    assert reply["error"]["kind"] == "bad-request", reply["error"]
    assert "must be" in reply["error"]["message"]


@pytest.mark.parametrize(
    ("verb", "stdin"),
    [
        ("facts", "{not json"),
        ("facts", "\x00\xff garbage"),
        ("apply", '{"args": {"steps": [{"kind": "file"}]}}'),
        ("apply", '{"args": 7}'),
        ("nope", "{}"),
        ("", ""),
    ],
)
def test_agent_zipapp_answers_garbage_with_its_error_envelope(
    agent_sandbox: Path, trial: Trial, verb: str, stdin: str
) -> None:
    trial.area, trial.tried = "fuzz", f"agent zipapp as a subprocess: verb {verb!r}, stdin {stdin[:30]!r}"
    trial.expect = "exit 0, one JSON error envelope on stdout, nothing on stderr"
    bundle = build_agent()
    pyz = agent_sandbox.parent / bundle.name
    pyz.write_bytes(bundle.data)
    done = subprocess.run(
        [sys.executable, str(pyz), *([verb] if verb else [])],
        input=stdin.encode("utf-8", errors="surrogateescape"),
        capture_output=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": ""},
    )
    trial.count("examples")
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1
    reply = json.loads(lines[0])
    envelope_ok(reply)
    assert reply["ok"] is False
    assert reply["error"]["kind"] == "bad-request" or "step" in reply["error"]["message"]


@pytest.mark.slow
def test_rig_loader_long_run(tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "fuzz", "rig loader + validator: long run over mutated example bytes"
    trial.expect = "a loaded rig or a SpecError, each within 2 s"
    rig = tmp_path / "rig.yaml"

    @budget(20_000, 20_000)
    @given(mutated_bytes(seed_files(EXAMPLES, "*.yaml")))
    def check(data: bytes) -> None:
        rig.write_bytes(data)
        timed(trial, load_or_spec_error)(rig, trial)

    check()
