"""Every `--json` prints one envelope (docs/json.md): `format_version`, `exit_code` (the command's own)
and `hosts`, then the command's keys; an error prints an error document, so `... --json | jq .exit_code`
reads 1 instead of nothing.

Run on the demo's box (one simulated host reached without SSH), through the real CLI; smoke's python is a
stand-in that answers the torch probe (the envelope is the subject here, not torch: starting real torch
cost this test most of its 40 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_provision.cli import main
from mgpu_provision.commands.demo import write_demo
from tests.support.factories import FAKE_TORCH

# Each command and the keys of its own that follow the envelope.
OWN_KEYS = {
    "validate": {"valid", "problems"},
    "facts": set(),
    "plan": {"totals", "converged"},
    "apply": {"playbook", "steps", "recap", "converged", "stopped", "drain_skipped"},
    "smoke": {"run_id", "ok", "notices", "groups"},
}


def document(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, object]]:
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_every_command_prints_the_envelope(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python = tmp_path / "torch-python"
    python.write_text(FAKE_TORCH)
    python.chmod(0o755)
    rig = str(write_demo(tmp_path / "demo", str(python)))
    runs = [
        ("validate", [rig]),
        ("facts", [rig]),
        ("plan", [rig]),
        ("apply", [rig, "--yes"]),
        ("smoke", [rig]),
    ]
    for command, args in runs:
        code, doc = document(capsys, [command, *args, "--json"])
        assert doc["format_version"] == 1, command
        assert doc["exit_code"] == code, command
        assert list(doc["hosts"]) == ["demo-3090"], command  # type: ignore[call-overload]
        assert OWN_KEYS[command] <= set(doc), (command, sorted(doc))


@pytest.mark.parametrize("command", ["facts", "plan", "apply", "smoke", "reclaim", "recover"])
def test_an_error_prints_an_error_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    rig = tmp_path / "rig.yaml"
    rig.write_text("version: 1\nhosts: []\nrigs: {}\n")
    code, doc = document(capsys, [command, str(rig), "--json"])
    assert code == 1 and doc["exit_code"] == 1 and doc["format_version"] == 1
    assert doc["hosts"] == {} and "rig.yaml" in str(doc["error"])
    assert doc["problems"], doc
