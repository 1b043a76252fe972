"""The `mgpu-provision` command line: parse, dispatch to a command module, turn errors into messages.

Each command lives in `mgpu_provision/commands/<name>.py` with a `register(subparsers)` function that adds
its parser and sets `func`; this module only wires them together, so commands stay small and separate.
Command modules import what they need (pydantic, Fabric, jinja2, rich...) at the top, which costs a large
part of a second: `main` therefore imports only the module of the command it was asked for, and every
module only for the top-level `--help`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from . import __version__
from .errors import ProvisionError

# Order here is the order in `--help`.
COMMANDS = ("validate", "schema", "facts", "plan", "apply", "smoke", "reclaim", "init", "demo")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, the other commands are names without options (not imported)."""
    parser = argparse.ArgumentParser(
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
            module = importlib.import_module(f"mgpu_provision.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"mgpu_provision.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(words)
    try:
        code: int = args.func(args)
    except ProvisionError as exc:
        print(f"error: {exc}", file=sys.stderr)
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
