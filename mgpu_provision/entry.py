"""The installed `mgpu-provision` and `python -m mgpu_provision`: a module that imports nothing at its top.

The CLI is imported inside `main`, so that a Ctrl-C while its modules load (pydantic, the models) is an
interruption like any other: exit 130, one line, no traceback.
"""

import sys


def main() -> None:
    try:
        from .cli import run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    run()
