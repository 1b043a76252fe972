"""The agent's one failure type: a kind the control side can act on and a message a person can read.

The dispatcher turns it into the protocol's `{"ok": false, "error": {"kind", "message"}}` envelope, so a verb
never needs to know about the envelope and nothing reaches the caller as a traceback.
"""

from __future__ import annotations


class AgentFailure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(message)
