"""The CLI shell: every command registered, errors as messages, a closed pipe ends quietly."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_provision.cli import COMMANDS, build_parser, main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mixed-fleet.yaml"


# Words that belong to the code, not to a person reading --help.
DEVELOPER_WORDS = ("Thin", "module", "initgen", "rig_from_facts", "preview", "rollout`", "newcomer", ".py")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_commands_help_is_for_users(name: str) -> None:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {*COMMANDS, "help"}
    command = sub.choices[name]
    description = (command.description or "").splitlines()
    summary = description[0]
    assert summary.endswith(".") and len(summary) <= 100, f"{name}: first line is not a one-line summary"
    assert len(description) == 1 or description[1] == "", f"{name}: the summary runs on: {description[:2]}"
    epilog = (command.epilog or "").splitlines()
    assert epilog[0] == "examples:" and epilog[1].startswith(f"  mgpu-provision {name}"), f"{name}: {epilog}"
    text = command.format_help()
    assert not [w for w in DEVELOPER_WORDS if w in text], f"{name} --help has developer notes:\n{text}"
    assert max(len(line) for line in text.splitlines()) <= 110, f"{name} --help has overlong lines"


def test_a_line_that_names_its_command_builds_that_commands_parser_alone() -> None:
    """Issue 41: a parser per command is ~0.1 ms, 1.3 ms of every run for the twelve it does not run."""
    (sub,) = (a for a in build_parser("plan")._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"plan"}


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
    err = _usage_error(["rehearse"], capsys)
    assert err.startswith("usage: mgpu-provision rehearse ")
    assert "the following arguments are required: ACTION" in err


@pytest.mark.parametrize("command", ["validate", "plan", "facts", "slurm-conf"])
def test_without_a_rig_file_a_command_reads_the_one_init_writes(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40 item 16: `./rig.yaml`, where `mgpu-provision init` writes it, when no RIG is named."""
    monkeypatch.chdir(tmp_path)
    assert main([command]) == 1
    assert "rig.yaml: file not found" in "".join(capsys.readouterr()), command
    (tmp_path / "rig.yaml").write_text(EXAMPLE.read_text())
    if command == "validate":
        assert main([command]) == 0
        assert capsys.readouterr().out.startswith("rig.yaml: valid, ")


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


def test_a_prefix_of_an_option_is_not_taken_for_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments: --dif" in _usage_error(["plan", str(EXAMPLE), "--dif"], capsys)
    assert "unrecognized arguments: --ye" in _usage_error(["apply", str(EXAMPLE), "--ye"], capsys)


def test_a_misspelled_top_level_option_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["--versoin"], capsys)
    assert "unknown option --versoin; did you mean --version?" in err


def test_dash_v_and_the_help_command(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, expected in (
        (["-V"], "mgpu-provision "),
        (["help", "plan"], "usage: mgpu-provision plan "),
        (["help"], "usage: mgpu-provision "),
    ):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 0
        assert capsys.readouterr().out.startswith(expected), argv


def test_no_color_anywhere_on_the_line_is_no_color_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40 item 16: `--no-color` beside NO_COLOR, even where colour is forced (FORCE_COLOR)."""
    import io

    from rich.text import Text

    from mgpu_provision.cli import parse
    from mgpu_provision.commands.output import make_console

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("NO_COLOR", "")  # so that the test's end takes away what parse sets
    monkeypatch.delenv("NO_COLOR")

    def coloured() -> bool:
        out = io.StringIO()
        make_console(out).print(Text("failed", style="red"))
        return "\x1b[" in out.getvalue()

    assert coloured()
    args = parse(["validate", str(EXAMPLE), "--no-color"])
    assert args.rig == EXAMPLE and not coloured()
