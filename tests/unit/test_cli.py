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


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 1, "a usage error is an error (1), never the drift code (2)"
    out, err = capsys.readouterr()
    assert out == ""
    return err


def test_an_unknown_option_exits_1_with_the_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["plan", "--bogus", str(EXAMPLE)], capsys)
    assert err.startswith("usage: mgpu-provision plan "), err
    assert "mgpu-provision plan: error: unrecognized arguments: --bogus" in err


def test_a_missing_argument_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["validate"], capsys)
    assert err.startswith("usage: mgpu-provision validate ")
    assert "the following arguments are required: RIG" in err


def test_a_misspelled_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["valdate", str(EXAMPLE)], capsys)
    assert err.startswith("usage: mgpu-provision ")
    assert "mgpu-provision: error: unknown command 'valdate'; did you mean validate?" in err


def test_an_unknown_command_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["frobnicate"], capsys)
    assert "unknown command 'frobnicate' (choose from validate, schema, facts" in err


def test_no_command_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert "the following arguments are required: COMMAND" in _usage_error([], capsys)


def test_help_and_version_still_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["plan", "--help"], ["--version"]):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 0
    capsys.readouterr()
