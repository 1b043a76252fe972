"""The CLI shell: every command registered, errors as messages, a closed pipe ends quietly."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_provision.cli import COMMANDS, build_parser, main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mixed-fleet.yaml"


def test_every_command_is_registered_with_examples_in_its_help() -> None:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    for name, command in sub.choices.items():
        assert "example" in (command.epilog or ""), f"{name} --help has no examples"


def test_a_provision_error_is_one_line_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 1
    out, err = capsys.readouterr()
    assert "missing.yaml: file not found" in out + err and "Traceback" not in out + err


def test_a_closed_pipe_ends_quietly() -> None:
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    done = subprocess.run(
        [sys.executable, "-m", "mgpu_provision", "schema"],
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert reader.stdin is not None
    reader.stdin.close()
    reader.wait()
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
