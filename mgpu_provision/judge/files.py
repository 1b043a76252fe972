"""Managed files: each one still what apply wrote, judged by its digest (the node reports sha256 of each)."""

from __future__ import annotations

from ..typing_lite import TYPE_CHECKING
from .records import Expectation, Finding

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional


def same_digest(have: Optional[str], want: str) -> bool:
    """The node's sha256 of a file is the one apply wrote (no digest: the file could not be read)."""
    return have == want


def files(facts: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """A finding for every managed file that is gone or whose content is not what apply wrote."""
    reported = {f["path"]: f for f in facts.get("files") or ()}
    findings: List[Finding] = []
    for path, sha256 in sorted(expect.files.items()):
        have = reported.get(path)
        if have is None or not have.get("exists"):
            message = f"{path} is missing"
            findings.append(
                Finding(f"file:{path}", message, None, sha256, kind="missing", advice="run apply")
            )
        elif not same_digest(have.get("sha256"), sha256):
            current = have.get("sha256")
            message = f"{path} is not what apply wrote (sha256 {(current or '?')[:12]})"
            findings.append(
                Finding(f"file:{path}", message, current, sha256, kind="changed", advice="run apply")
            )
    return findings
