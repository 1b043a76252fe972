"""Types of each verb's arguments, checked once at the agent's door.

The control side sends well-formed requests, but the agent is a program anyone on the node can call with any
JSON; a mistyped value must be a `bad-request` that names the argument, not a traceback from deep inside a
verb. Only the keys a verb reads are described; unknown keys are left alone for newer control sides.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from .node.errors import AgentFailure

Check = Tuple[str, Callable[[Any], bool]]


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and "\0" not in value and len(value) <= 4096


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value >= 0


TEXT: Check = ("a string", _is_text)
OPTIONAL_TEXT: Check = ("a string or null", lambda v: v is None or _is_text(v))
NUMBER: Check = ("a number of 0 or more", _is_number)
FLAG: Check = ("true or false", lambda v: isinstance(v, bool))
TEXTS: Check = ("a list of strings", lambda v: isinstance(v, list) and all(_is_text(x) for x in v))
OBJECTS: Check = ("a list of objects", lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v))

VERB_ARGS: Dict[str, Dict[str, Check]] = {
    "facts": {"files": TEXTS, "include_content": FLAG, "python": OPTIONAL_TEXT, "xorg_paths": TEXTS},
    "apply": {"lock": TEXT, "lock_wait_s": NUMBER, "steps": OBJECTS},
    "reboot": {"lock": TEXT, "lock_wait_s": NUMBER},
    "reclaim": {"policy": TEXT, "patterns": TEXTS, "grace_s": NUMBER, "dry_run": FLAG},
}


def check_request(verb: str, request: Dict[str, Any]) -> None:
    """Raise AgentFailure("bad-request") naming the first argument of the wrong type."""
    simulate = request.get("simulate")
    if not OPTIONAL_TEXT[1](simulate):
        raise AgentFailure("bad-request", "`simulate` must be a twin file path or null")
    for name, (expected, ok) in VERB_ARGS.get(verb, {}).items():
        args = request.get("args") or {}
        if name in args and not ok(args[name]):
            raise AgentFailure("bad-request", "{} argument `{}` must be {}".format(verb, name, expected))
