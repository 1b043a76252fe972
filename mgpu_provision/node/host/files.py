"""The node's own files: the managed files (for diffs, and smoke's check that they are still what apply
wrote), the X config's SLI option and the ServerLayout sections that decide whether X reads the managed
snippet's Screen at all.

None of these depend on the NVIDIA layer, so they are the same on real and simulated nodes.
"""

from __future__ import annotations

import os
import re
import stat

from ...typing_lite import TYPE_CHECKING
from ..core.digest import sha256_hex
from ..core.system import read_text

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence

MAX_CONTENT_BYTES = 64 * 1024
_SLI_OPTION = re.compile(r'^\s*Option\s+"SLI"\s+"([^"]*)"', re.IGNORECASE)
_SECTION = re.compile(r'^\s*Section\s+"([^"]+)"', re.IGNORECASE)
_END_SECTION = re.compile(r"^\s*EndSection\b", re.IGNORECASE)
_LAYOUT_SCREEN = re.compile(r'^\s*Screen\s+(?:\d+\s+)?"([^"]+)"', re.IGNORECASE)


def describe_file(path: str, include_content: bool) -> Dict[str, Any]:
    """A managed file's state; its text only on request, when small and valid UTF-8 (for a diff)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
            mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
    except FileNotFoundError:
        return {"path": path, "exists": False}
    except OSError:  # a folder, or unreadable even to root (e.g. on a read-only network mount)
        return {"path": path, "exists": True}
    content: Optional[str] = None
    if include_content and len(data) < MAX_CONTENT_BYTES:
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError:
            content = None
    return {
        "path": path,
        "exists": True,
        "sha256": sha256_hex(data),
        "mode": f"{mode:04o}",
        "content": content,
    }


QUOTE_CHARS = 80


def _quote(line: str) -> str:
    return "`" + (line if len(line) <= QUOTE_CHARS else line[: QUOTE_CHARS - 3] + "...") + "`"


def first_difference(have: str, want: str) -> str:
    """Where the node's text first differs from what the rig file renders, in words."""
    have_lines, want_lines = have.splitlines(), want.splitlines()
    common = min(len(have_lines), len(want_lines))
    for index in range(common):
        if have_lines[index] != want_lines[index]:
            got, wanted = _quote(have_lines[index]), _quote(want_lines[index])
            return f"line {index + 1} is {got}, the rig file renders {wanted}"
    number = common + 1
    if len(have_lines) > len(want_lines):
        return f"line {number} {_quote(have_lines[number - 1])} is not in the rig file's version"
    if len(have_lines) < len(want_lines):
        return f"line {number} {_quote(want_lines[number - 1])} is missing"
    return "the line endings differ"


def installed_problem(role: str, path: str, content: str, mode: str) -> Optional[str]:
    """Why the file at `path` is not what apply would write now (`content`, `mode`), or None.

    `role` names the file in the message ("launcher", "env file"); each message ends in what to do.
    """
    have = describe_file(path, include_content=True)
    if not have["exists"]:
        return f"{role} {path} is missing: run apply"
    if "mode" not in have:
        return f"{role} {path} cannot be read: run apply"
    if int(mode, 8) & 0o111 and not int(have["mode"], 8) & 0o111:
        return f"{role} {path} is not executable (mode {have['mode']}): run apply"
    if have["content"] != content:
        text = have["content"]
        where = first_difference(text, content) if text is not None else "it is not UTF-8 text"
        return f"{role} {path} is stale: run apply ({where})"
    if have["mode"] != mode:
        return f"{role} {path} has mode {have['mode']}, apply writes {mode}: run apply"
    return None


def _config_files(paths: Sequence[str]) -> List[str]:
    files: List[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".conf"))
        elif os.path.isfile(path):
            files.append(path)
    return files


def read_sli(paths: Sequence[str]) -> Dict[str, Optional[str]]:
    """The first `Option "SLI"` in the given X config files (folders: their `*.conf`, in name order)."""
    for path in _config_files(paths):
        for line in (read_text(path) or "").splitlines():
            match = _SLI_OPTION.match(line.split("#", 1)[0])
            if match:
                return {"mode": match.group(1), "file": path}
    return {"mode": None, "file": None}


def server_layouts(paths: Sequence[str]) -> List[Dict[str, Any]]:
    """Every ServerLayout section in the given X config files (folders: their `*.conf`), with the Screen
    identifiers it lists: X then uses those screens only and ignores any other file's Screen section."""
    layouts: List[Dict[str, Any]] = []
    for path in _config_files(paths):
        screens: Optional[List[str]] = None  # the screens of the ServerLayout being read; None outside one
        for line in (read_text(path) or "").splitlines():
            line = line.split("#", 1)[0]
            section = _SECTION.match(line)
            if section:
                screens = [] if section.group(1).lower() == "serverlayout" else None
            elif _END_SECTION.match(line):
                if screens is not None:
                    layouts.append({"file": path, "screens": screens})
                screens = None
            elif screens is not None:
                screen = _LAYOUT_SCREEN.match(line)
                if screen:
                    screens.append(screen.group(1))
    return layouts
