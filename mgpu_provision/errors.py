"""The control side's error hierarchy: one base class, so the CLI turns any of them into a message and exit 1.

Anything raised from here is meant for a person: its str() is the whole message, no traceback is shown.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`; did you mean 'lab-1'?` for a close name or value (difflib, as the CLI's commands), or ''."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'?" if close else ""


class ProvisionError(Exception):
    """Base of every error the CLI reports as a plain message (exit code 1)."""


class SpecError(ProvisionError):
    """The rig file is unreadable or invalid; carries every problem found, not only the first."""

    def __init__(self, problems: list[SpecProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(p.render() for p in problems))


class SpecProblem:
    """One problem in a rig file, located as precisely as the YAML marks allow."""

    def __init__(
        self,
        file: str,
        message: str,
        line: int | None = None,
        column: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.column = column
        self.field = field
        self.message = message

    def location(self) -> str:
        loc = self.file
        if self.line is not None:
            loc += f":{self.line}"
            if self.column is not None:
                loc += f":{self.column}"
        return loc

    def render(self) -> str:
        where = f" {self.field}:" if self.field else ""
        return f"{self.location()}:{where} {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "field": self.field,
            "message": self.message,
        }

    def __repr__(self) -> str:
        return f"SpecProblem({self.render()!r})"


class ConnectionFailed(ProvisionError):
    """A host could not be reached or refused us (network, host key, authentication)."""


class AgentError(ProvisionError):
    """The node agent ran but reported a failure, or answered something that is not its protocol."""
