"""Managed files: each one still what apply wrote, judged by its digest (the node reports sha256 of each)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .records import Expectation, Finding


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
            findings.append(
                Finding(f"file:{path}", f"{path} is missing: run apply", None, sha256, kind="missing")
            )
        elif not same_digest(have.get("sha256"), sha256):
            current = have.get("sha256")
            summary = f"{path} is not what apply wrote (sha256 {(current or '?')[:12]}): run apply"
            findings.append(Finding(f"file:{path}", summary, current, sha256, kind="changed"))
    return findings
