"""`mgpu-provision validate`: exit codes, the one-line summary, problems one per line, and --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_provision.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
RIGS = Path(__file__).parent / "rigs"


def test_the_three_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "rtx3090-workstation.yaml",
        "h100-hgx-pair.yaml",
        "mixed-fleet.yaml",
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(example)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{example}: valid, ")


def test_valid_summary_counts_hosts_and_rigs(capsys: pytest.CaptureFixture[str]) -> None:
    path = RIGS / "valid-minimal.yaml"
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: valid, 1 host, 1 rig\n"


def test_invalid_prints_every_problem_one_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    path = RIGS / "every-rule.yaml"
    assert main(["validate", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"{path}: invalid, 8 problems"
    assert lines[0] == f"{path}:5:12: hosts[1].name: host name 'gpu-a' is already used by hosts[0]"
    assert all(line.startswith(f"{path}:") for line in lines[:-1])
    assert len(lines) == 9


def test_json_invalid(capsys: pytest.CaptureFixture[str]) -> None:
    path = RIGS / "every-rule.yaml"
    assert main(["validate", "--json", str(path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert len(report["problems"]) == 8
    assert report["problems"][0] == {
        "file": str(path),
        "line": 5,
        "column": 12,
        "field": "hosts[1].name",
        "message": "host name 'gpu-a' is already used by hosts[0]",
    }


def test_json_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json", str(RIGS / "valid-minimal.yaml")]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["valid"], document["problems"]) == (True, [])
    assert (document["format_version"], document["exit_code"]) == (1, 0)  # the envelope of every --json


def test_json_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.yaml"
    assert main(["validate", "--json", str(missing)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["problems"] == [
        {"file": str(missing), "line": None, "column": None, "field": None, "message": "file not found"}
    ]


def test_a_topology_file_that_never_ends_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "hosts: [{name: gpu-a, address: 10.0.0.11, rig: pair}]\n"
        "rigs:\n"
        "  pair:\n"
        '    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}\n'
        "    bridge: {kind: nvlink-bridge, links: 4, topology_file: /dev/zero}\n"
    )
    assert main(["validate", str(rig)]) == 1
    assert (
        f"{rig}:5:60: rigs.pair.bridge.topology_file: cannot read topology file /dev/zero: not a regular file"
        in capsys.readouterr().out
    )
