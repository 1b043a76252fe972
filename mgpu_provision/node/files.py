"""Facts read from the node's own files: the managed files (for diffs), the X config's SLI option and the
ServerLayout sections that decide whether X reads the managed snippet's Screen at all.

None of these depend on the NVIDIA layer, so they are the same on real and simulated nodes.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from typing import Any, Dict, List, Optional, Sequence

from .system import read_text

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
        "sha256": hashlib.sha256(data).hexdigest(),
        "mode": f"{mode:04o}",
        "content": content,
    }


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
