"""The installed `mgpu-provision` and `python -m mgpu_provision`: the CLI, loaded under a Ctrl-C handler.

Loading the CLI and a command's modules (pydantic, the models) takes most of a second, and a Ctrl-C there
raised KeyboardInterrupt out of an import: a traceback. Until the command line is parsed a Ctrl-C ends the
process at once, with one line and exit 130 (nothing has started yet); `cli.main` then gives Ctrl-C back to
Python's KeyboardInterrupt, which the commands handle (smoke ends what it started, apply says what finished).
"""

import gc
import os
import signal

# By the time a plan on one host has loaded Fabric it holds ~56,000 objects that live as long as the process
# (its modules' functions, classes and constants), and the collector's passes over them free nothing: at
# CPython's default first threshold (700 allocations) they cost that plan ~10 ms of its ~0.2 s of CPU. The
# collector still runs, once a hundred thousand allocations, and never for an import-only start-up.
gc.set_threshold(100_000, *gc.get_threshold()[1:])


def interrupted_while_loading(signum: int, frame: object) -> None:
    os.write(2, b"interrupted\n")
    os._exit(130)


signal.signal(signal.SIGINT, interrupted_while_loading)


def main() -> None:
    from .cli import run

    run()
