"""What an env value or a `path_prepend` entry may hold, in words a rig author can act on.

Values are written as data (double-quoted, see `plan/resources/envfiles.py`), so quotes, `$`, backticks,
backslashes and newlines are all fine. What is left is what no env file can carry: NUL ends a C string (no
process environment holds one), a lone surrogate has no UTF-8 form, and systemd refuses a line of an
EnvironmentFile whose value is not valid UTF-8 by its own rule, which also excludes Unicode noncharacters.
The rules (`rig/rules.py`) and the renderer both ask here, so a value the loader accepted always renders.
"""

from __future__ import annotations


def _noncharacter(code: int) -> bool:
    # Unicode's 66 noncharacters: U+FDD0..U+FDEF and the last two code points of every plane.
    return 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE


def value_problem(value: str) -> str | None:
    """Why `value` cannot be written into an env file, or None."""
    for char in value:
        code = ord(char)
        if code == 0:
            return "contains a NUL character (\\0), which no environment variable can hold"
        if 0xD800 <= code <= 0xDFFF:
            return f"contains U+{code:04X}, a lone surrogate that has no UTF-8 form"
        if _noncharacter(code):
            return (
                f"contains U+{code:04X}, a Unicode noncharacter: systemd ignores an EnvironmentFile line "
                "that holds one"
            )
    return None


def path_entry_problem(entry: str) -> str | None:
    """Why `entry` cannot be one element of a colon-separated search path, or None."""
    if not entry.startswith("/"):
        return f"entry {entry!r} must be an absolute path (start with /)"
    if ":" in entry:
        return f"entry {entry!r} contains ':', which separates the entries of the variable"
    problem = value_problem(entry)
    return None if problem is None else f"entry {entry!r} {problem}"
