"""argparse types for every option that names a file, folder or program: a mistake there is a usage error.

`--ssh-config nope.cfg`, `--known-hosts .` or `demo --python /nonexistent/python` are typing mistakes, not
failures of a run: they are refused while the command line is read, naming the option and what is wrong
with the path (missing, a folder, unreadable), before any host is contacted. Each command uses these
types for its path options (tests/unit/test_path_options.py walks them all).
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path


def _kind(path: Path) -> int | None:
    """The file type bits of `path` (following links), None when nothing is there."""
    try:
        return path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:  # e.g. a path through a file, or a folder we may not enter
        raise argparse.ArgumentTypeError(f"{path}: {exc.strerror}") from exc


def _readable(path: Path) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{path}: cannot read it ({exc.strerror})") from exc


def _present(path: Path, noun: str) -> None:
    """Refuse a `path` that is missing or a folder where a `noun` (file, program) is wanted."""
    mode = _kind(path)
    if mode is None:
        raise argparse.ArgumentTypeError(f"{path}: no such {noun}")
    if stat.S_ISDIR(mode):
        raise argparse.ArgumentTypeError(f"{path}: is a folder, not a {noun}")


def input_file(text: str) -> Path:
    """A file the command reads: it must exist, be a file and be readable."""
    path = Path(text).expanduser()
    _present(path, "file")
    _readable(path)
    return path


def kept_file(text: str) -> Path:
    """A file the command reads when it exists and may create (known_hosts): a folder or an unreadable
    file is refused."""
    path = Path(text).expanduser()
    mode = _kind(path)
    if mode is None:
        return path
    if stat.S_ISDIR(mode):
        raise argparse.ArgumentTypeError(f"{path}: is a folder, not a file")
    _readable(path)
    return path


def output_file(text: str) -> Path:
    """A file the command writes: not a folder, its folder must exist, and one already there must be
    writable (opened for appending nothing: its content and times stay as they are)."""
    path = Path(text).expanduser()
    mode = _kind(path)
    if mode is not None and stat.S_ISDIR(mode):
        raise argparse.ArgumentTypeError(f"{path}: is a folder; name the file to write")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: the folder {path.absolute().parent} does not exist")
    if mode is not None:
        try:
            with path.open("ab"):
                pass
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{path}: cannot write it ({exc.strerror})") from exc
    return path


def work_folder(text: str) -> Path:
    """A folder the command fills, made when missing: not a file, and it must be possible to make it."""
    path = Path(text).expanduser()
    mode = _kind(path)
    if mode is not None and not stat.S_ISDIR(mode):
        raise argparse.ArgumentTypeError(f"{path}: is a file, not a folder")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not stat.S_ISDIR(existing.stat().st_mode):
        raise argparse.ArgumentTypeError(f"{path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{path}: cannot write in {existing}")
    return path


def program(text: str) -> str:
    """A program to run: a path must be an executable file; a bare name is looked up on PATH when run."""
    if os.sep not in text:
        return text
    path = Path(text).expanduser()
    _present(path, "program")
    if not os.access(path, os.X_OK):
        raise argparse.ArgumentTypeError(f"{path}: not executable")
    return str(path)


# Every path type, for the test that walks every command's path options.
PATH_TYPES = (input_file, kept_file, output_file, work_folder, program)


# The rig file a command reads when none is named: where `mgpu-provision init` writes it.
DEFAULT_RIG = Path("rig.yaml")


def add_rig_argument(parser: argparse.ArgumentParser) -> None:
    """RIG, for every command that reads a rig file (here, not in options.py: validate loads no models)."""
    parser.add_argument(
        "rig",
        metavar="RIG",
        type=Path,
        nargs="?",
        default=DEFAULT_RIG,
        help=f"the rig file (YAML; default ./{DEFAULT_RIG}, where `init` writes it)",
    )
