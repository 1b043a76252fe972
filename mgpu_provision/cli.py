"""The `mgpu-provision` command line: parse, dispatch to a command module, turn errors into messages.

Each command lives in `mgpu_provision/commands/<name>.py` with a `register(subparsers)` function that adds
its parser and sets `func`; this module only wires them together, so commands stay small and separate.
Importing a command module still costs a good part of a second (pydantic and its models; Fabric, jinja2 and
rich load only when a run needs them, docs/ARCHITECTURE.md "Start-up"): `main` therefore imports only the
module of the command it was asked for, and every module only for the top-level `--help`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import __version__
from .commands.output import visible
from .errors import ProvisionError

# Order here is the order in `--help`.
COMMANDS = (
    "validate", "schema", "facts", "plan", "apply", "smoke", "reclaim", "init", "demo", "slurm-conf",
)  # fmt: skip


class Parser(argparse.ArgumentParser):
    """argparse with the README's exit codes: bad usage is an error (1), not argparse's 2.

    2 is what `plan` and the other fleet commands return for drift or an unreachable host; a script that
    checks for drift must not take a typo for it. Subcommand parsers are made from this class too, so each
    prints its own usage.
    """

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, the other commands are names without options (not imported)."""
    parser = Parser(
        prog="mgpu-provision",
        description="Declarative provisioning for multi-GPU training boxes.",
        epilog="Run `mgpu-provision COMMAND --help` for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        try:
            module = importlib.import_module(f"mgpu_provision.commands.{name.replace('-', '_')}")
        except ModuleNotFoundError as exc:
            if exc.name == f"mgpu_provision.commands.{name.replace('-', '_')}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def unknown_command(word: str) -> str:
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    if close:
        return f"unknown command {word!r}; did you mean {close[0]}?"
    return f"unknown command {word!r} (choose from {', '.join(COMMANDS)})"


def parse(words: list[str]) -> argparse.Namespace:
    """The parsed command line; a usage error exits 1 with the usage of the command it concerns."""
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    if words and not words[0].startswith("-") and words[0] not in COMMANDS:
        parser.error(unknown_command(words[0]))
    args, extra = parser.parse_known_args(words)
    if extra:  # argparse would blame the top-level parser and print its usage
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        code: int = args.func(args)
    except ProvisionError as exc:
        print(f"error: {visible(str(exc))}", file=sys.stderr)  # messages may quote a node's output
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `mgpu-provision plan rig.yaml | head`: the reader left; say nothing more, as other Unix tools do.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
