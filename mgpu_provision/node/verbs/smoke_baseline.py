"""A box's own smoke baseline: the busbw its last passing smoke measured, kept in the node's state folder.

A fixed floor set below public figures says little about a box that was 30% faster last month; the box's
own figure does. The control side judges a run against it (`jobs/smoke_baseline.py`) and, once a group
passed, writes the new figures here through the `smoke-baseline` verb; the smoke verb reads them back, and
the node check (`check.py`) puts the last figure and its age into its metrics. The file lives in the state
folder (on disk, not /run), so it survives a reboot; it is replaced atomically and fsynced, so a crash
leaves the old record or the new one. A file that cannot be read as a record is reported, never trusted.

Stdlib only, Python 3.8: this module runs on the nodes inside the agent zipapp.
"""

from __future__ import annotations

import json
import os

from ...typing_lite import TYPE_CHECKING
from ..core.atomic import atomic_write
from ..core.errors import AgentFailure

if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

BASELINE_FILE = "smoke-baseline.json"
FORMAT = 1
_ENTRY_NUMBERS = ("busbw_gbps", "recorded_at")


def path_in(state_dir: str) -> str:
    return os.path.join(state_dir, BASELINE_FILE)


def _problem(record: Any) -> Optional[str]:
    """Why `record` is not a baseline this version can trust, or None."""
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return "not a format-%d smoke baseline" % FORMAT
    groups = record.get("groups")
    if not isinstance(groups, dict):
        return "`groups` is not a mapping"
    for key, entry in groups.items():
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(n), (int, float)) and not isinstance(entry.get(n), bool)
            for n in _ENTRY_NUMBERS
        ):
            return "group %s has no numeric busbw_gbps and recorded_at" % key
    return None


def read(state_dir: Optional[str]) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(the record, None), (None, None) when there is none, or (None, why) when the file is corrupt."""
    if not state_dir:
        return None, None
    path = path_in(state_dir)
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, "%s cannot be read (%s): not trusted" % (path, exc.strerror)
    except ValueError as exc:
        return None, "%s is corrupt (%s): not trusted; the next passing smoke replaces it" % (path, exc)
    problem = _problem(record)
    if problem is not None:
        return None, "%s is corrupt (%s): not trusted; the next passing smoke replaces it" % (path, problem)
    return record, None


def answer(state_dir: Optional[str]) -> Dict[str, Any]:
    """The smoke verb's `baseline` field: the record and, when the file is corrupt, why it is not used."""
    record, problem = read(state_dir)
    return {"record": record, "problem": problem}


def record(args: Dict[str, Any]) -> Dict[str, Any]:
    """The `smoke-baseline` verb: put one group's entry (and this node's) into the record, atomically.
    A corrupt file is replaced by a fresh record; the answer says so."""
    state_dir = str(args["state_dir"])
    update = args["record"]
    old, problem = read(state_dir)
    groups = dict((old or {}).get("groups") or {})
    groups[str(update["key"])] = dict(update["entry"])
    new: Dict[str, Any] = {"format": FORMAT, "groups": groups, "node": dict(update.get("node") or {})}
    if _problem(new) is not None:
        raise AgentFailure("bad-request", "smoke-baseline: %s" % _problem(new))
    data = (json.dumps(new, indent=2, sort_keys=True) + "\n").encode()
    try:
        atomic_write(path_in(state_dir), data, 0o644)
    except OSError as exc:
        raise AgentFailure(
            "bad-request", "cannot write %s: %s (set files.state_dir)" % (path_in(state_dir), exc.strerror)
        ) from None
    return {"path": path_in(state_dir), "replaced_corrupt": problem is not None}
