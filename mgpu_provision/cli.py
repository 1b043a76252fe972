"""The `mgpu-provision` command line: parse, dispatch to a command module, turn errors into messages.

Each command lives in `mgpu_provision/commands/<name>.py` with a `register(subparsers)` function that adds
its parser and sets `func`; this module only wires them together, so commands stay small and separate.
Importing a command module still costs a good part of a second (pydantic and its models; Fabric, jinja2 and
rich load only when a run needs them, docs/ARCHITECTURE.md "Start-up"): `main` therefore imports only the
module of the command it was asked for, and every module only for the top-level `--help`.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from . import __version__
from .commands.output import print_json, visible
from .errors import ProvisionError, SpecError

# Order here is the order in `--help`.
COMMANDS = (
    "validate", "schema", "facts", "plan", "apply", "smoke", "reclaim", "recover", "init", "demo",
    "rehearse", "slurm-conf",
)  # fmt: skip
# `--no-color` anywhere on the line is NO_COLOR=1 (https://no-color.org), which rich and the commands this
# one starts (demo, rehearse) read; it is taken out before argparse, so every command has it.
NO_COLOR_OPTION = "--no-color"
TOP_OPTIONS = ("--help", "-h", "--version", "-V", NO_COLOR_OPTION)


class Parser(argparse.ArgumentParser):
    """argparse with the README's exit codes: bad usage is an error (1), not argparse's 2.

    2 is what `plan` and the other fleet commands return for drift or an unreachable host; a script that
    checks for drift must not take a typo for it. Subcommand parsers are made from this class too, so each
    prints its own usage. A prefix of an option is refused (`plan --dif` is not `--diff`): an option that
    means something else once a longer one is added must not be guessed.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, that command's parser alone (no other command is imported or
    given a parser: ~0.1 ms each, and the line already names its command)."""
    parser = Parser(
        prog="mgpu-provision",
        description="Declarative provisioning for multi-GPU training boxes.",
        epilog="Run `mgpu-provision help COMMAND` for a command's options and examples.",
    )
    parser.add_argument("--version", "-V", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        NO_COLOR_OPTION,
        action="store_true",
        help="print no colours, as NO_COLOR=1 does (before or after COMMAND)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(f"mgpu_provision.commands.{name.replace('-', '_')}")
        except ModuleNotFoundError as exc:
            if exc.name == f"mgpu_provision.commands.{name.replace('-', '_')}":
                continue  # command not built yet
            raise
        module.register(sub)
    if only is not None:
        return parser
    helper = sub.add_parser(
        "help",
        help="show the help of a command: mgpu-provision help COMMAND",
        description="Show the help of a command, or of the whole tool without one.",
    )
    helper.add_argument("topic", metavar="COMMAND", nargs="?", choices=COMMANDS, help="the command")
    return parser


def unknown_command(word: str) -> str:
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    if close:
        return f"unknown command {word!r}; did you mean {close[0]}?"
    return f"unknown command {word!r} (choose from {', '.join(COMMANDS)})"


def parse(words: list[str]) -> argparse.Namespace:
    """The parsed command line; a usage error exits 1 with the usage of the command it concerns.
    `help COMMAND` is `COMMAND --help`."""
    if NO_COLOR_OPTION in words:
        words = [word for word in words if word != NO_COLOR_OPTION]
        os.environ["NO_COLOR"] = "1"
    if words[:1] == ["help"] and len(words) == 2 and words[1] in COMMANDS:
        words = [words[1], "--help"]
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    if words and not words[0].startswith("-") and words[0] not in (*COMMANDS, "help"):
        parser.error(unknown_command(words[0]))
    if words and words[0].startswith("-") and words[0] not in TOP_OPTIONS:
        close = difflib.get_close_matches(words[0], TOP_OPTIONS, n=1)
        parser.error(f"unknown option {words[0]}" + (f"; did you mean {close[0]}?" if close else ""))
    if words == ["help"]:
        parser.print_help()
        parser.exit(0)
    args, extra = parser.parse_known_args(words)
    if extra:  # argparse would blame the top-level parser and print its usage
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # while a command's modules load (pydantic and the models take a second)
        print("interrupted", file=sys.stderr)
        return 130
    # Loaded: Ctrl-C is the commands' now (entry.py ends the process at once until here).
    if getattr(signal.getsignal(signal.SIGINT), "__module__", None) == "mgpu_provision.entry":
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        args.cli = main  # for a command that runs others, as the demo does
        code: int = args.func(args)
    except ProvisionError as exc:
        print(f"error: {visible(str(exc))}", file=sys.stderr)  # messages may quote a node's output
        if getattr(args, "json", False):  # `... --json | jq .exit_code` reads 1, not nothing
            problems = [p.as_dict() for p in exc.problems] if isinstance(exc, SpecError) else []
            print_json(1, {}, error=str(exc), problems=problems)
        return 1
    except KeyboardInterrupt as exc:  # a command that stopped something says what (smoke's SmokeInterrupted)
        print(f"interrupted: {visible(str(exc))}" if str(exc) else "interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `mgpu-provision plan rig.yaml | head`: the reader left; say nothing more, as other Unix tools do.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # a file of this machine the options did not name (they are checked on parsing)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {visible(where + (exc.strerror or str(exc)))}", file=sys.stderr)
        return 1
    return code


def run() -> NoReturn:
    """The installed command: `main`, then an exit that waits for no thread. After a Ctrl-C the fleet's
    worker threads may still be in an SSH call; the interpreter's normal exit would join them, and a second
    Ctrl-C there prints `Exception ignored in: <module 'threading'>`."""
    try:
        code = main()
    except KeyboardInterrupt:  # between main's own handlers (argument parsing, a view being printed)
        print("interrupted", file=sys.stderr)
        code = 130
    if code == 130:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
