"""Every path option of every command, given a missing file, a folder and an unreadable file, is refused
with exit 1 and a message that names the path, never a traceback (`--ssh-config nope.cfg`, `--known-hosts .`,
`demo --python /nonexistent/python`, `demo --dir /proc/nope`).

The options are found by walking the real parser, so a new path option is covered the day it is added. The
cases run in one child process: as root, without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (setpriv), so a
mode-000 file is really unreadable there, as it is for any other user.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from mgpu_provision.cli import build_parser
from mgpu_provision.commands import paths
from tests.support.hosts import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
GOOD_RIG = """\
version: 1
hosts:
  - {name: gpu-a, address: 127.0.0.1, port: 1, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
"""
# Runs each case in this process, as the CLI would: its exit code, what it printed, and a
# traceback when one escaped.
CHILD = """
import contextlib, io, json, sys, traceback
from mgpu_provision.cli import main
results = []
for argv in json.load(sys.stdin):
    err, out = io.StringIO(), io.StringIO()
    crash = None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            code, crash = None, traceback.format_exc()
    said = out.getvalue() + err.getvalue()  # validate reports problems on stdout
    results.append({"argv": argv, "code": code, "said": said, "crash": crash})
json.dump(results, sys.stdout)
"""


def commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(the words naming it, its parser) for every command, `rehearse up` and `rehearse down` included."""

    def walk(words: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not nested:
            yield words, parser
        for sub in nested:
            for name, subparser in sub.choices.items():
                yield from walk(f"{words} {name}".strip(), subparser)

    yield from walk("", build_parser())


def path_options() -> Iterator[tuple[str, argparse.Action]]:
    """(command, action) for every option or argument that names a path on this machine."""
    for command, subparser in commands():
        for action in subparser._actions:
            if action.type in paths.PATH_TYPES or action.dest in ("rig", "playbook"):
                yield command, action


def test_every_path_option_uses_a_checked_path_type() -> None:
    """A path option typed plain `Path` would reach the command unchecked (the old tracebacks)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    plain = [
        f"{command} {action.option_strings or action.dest}"
        for command, subparser in sub.choices.items()
        for action in subparser._actions
        if action.type is Path and action.dest != "rig"  # the rig file: the loader reports it, with lines
    ]
    assert plain == []


def values(kind: object, folder: Path) -> dict[str, Path]:
    """The three mistakes for one kind of path option, by name (a legal value is left out)."""
    if kind is paths.work_folder:  # a folder option: the mistakes are a file, an uncreatable and a locked one
        return {"missing": Path("/proc/nope"), "folder": folder / "plain", "unreadable": folder / "lockeddir"}
    missing = folder / "nope" / "x.yaml" if kind is paths.output_file else folder / "nope.cfg"
    cases = {"missing": missing, "folder": folder, "unreadable": folder / "locked"}
    if kind is paths.kept_file:  # a missing known_hosts is made on first use
        del cases["missing"]
    return cases


def argv_for(command: str, action: argparse.Action, value: Path, folder: Path) -> list[str]:
    rig = str(folder / "rig.yaml")
    option = [action.option_strings[-1], str(value)] if action.option_strings else [str(value)]
    if command == "validate":
        return [command, *option]
    if command == "init":
        output = [] if action.dest == "output" else ["-o", str(folder / "new.yaml")]
        return [command, "--connection", "local", *output, *option]
    if command in ("demo", "rehearse up", "rehearse down"):
        return [*command.split(), *option]
    return [command, *option] if action.dest == "rig" else [command, rig, *option]


def run_in_child(argvs: list[list[str]], folder: Path, prefix: list[str]) -> list[dict[str, object]]:
    """Each command line's result from one child process (CHILD), run in `folder` with HOME there."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(folder)}
    child = subprocess.run(
        [*prefix, sys.executable, "-c", CHILD],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    results: list[dict[str, object]] = json.loads(child.stdout)
    return results


def flag_mistakes(folder: Path) -> Iterator[list[str]]:
    """For every command: an unknown flag, each option without its value, and each typed option (not a
    path) with a value of the wrong kind (`--forks abc`, `--serial abc`, `rehearse up --hosts 0`)."""
    rig = str(folder / "rig.yaml")
    for command, parser in commands():
        words = command.split()
        needs_rig = any(a.dest == "rig" for a in parser._actions)
        head = [*words, rig] if needs_rig else words
        yield [*head, "--no-such-flag"]
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.dest == "help":
                continue
            option = action.option_strings[-1]
            yield [*head, option]  # the value is missing
            if action.type not in (None, str, *paths.PATH_TYPES) and not action.choices:
                yield [*head, option, "0" if action.dest in ("hosts", "port") else "a b!"]
            if action.choices:
                yield [*head, option, "no-such-choice"]


def test_flag_mistakes_are_one_message_and_exit_1_never_a_traceback(tmp_path: Path) -> None:
    """The sweep over flags beside the one over paths (issue 40, "a sweep over every path and flag mistake
    ends in zero tracebacks"): every command's usage error is exit 1 with a message."""
    (tmp_path / "rig.yaml").write_text(GOOD_RIG)
    cases = list(flag_mistakes(tmp_path))
    assert any(c[:2] == ["rehearse", "up"] for c in cases) and any("--serial" in c for c in cases)
    bad = [
        f"{' '.join(argv)} -> {result['code']}: {result['crash'] or result['said']}"
        for argv, result in zip(cases, run_in_child(cases, tmp_path, []), strict=True)
        if result["crash"] or result["code"] != 1 or "Traceback" in str(result["said"]) or not result["said"]
    ]
    assert bad == [], "\n".join(bad)


def test_path_mistakes_are_refused_with_a_message_never_a_traceback(tmp_path: Path) -> None:
    folder = tmp_path / "cases"
    folder.mkdir()
    (folder / "rig.yaml").write_text(GOOD_RIG)
    (folder / "plain").write_text("a file\n")
    (folder / "locked").write_text("secret\n")
    (folder / "locked").chmod(0)
    (folder / "lockeddir").mkdir(mode=0o500)
    cases = []
    for command, action in path_options():
        for kind, value in values(action.type, folder).items():
            cases.append((kind, value, argv_for(command, action, value, folder)))
    covered = {" ".join(argv[:2]) if argv[0] == "rehearse" else argv[0] for _, _, argv in cases}
    assert {
        "validate",
        "facts",
        "plan",
        "apply",
        "smoke",
        "reclaim",
        "init",
        "demo",
        "rehearse up",
    } <= covered

    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            skip_or_fail("setpriv (util-linux) is needed to read as a user without root's file access")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    bad = []
    for (kind, value, argv), result in zip(
        cases, run_in_child([a for _, _, a in cases], folder, prefix), strict=True
    ):
        said = result["said"]
        named = str(value) in said or value.name in said
        if result["crash"] or result["code"] != 1 or "Traceback" in said or not named:
            bad.append(f"{kind}: {' '.join(argv)} -> {result['code']}: {result['crash'] or said}")
    assert bad == [], "\n".join(bad)
