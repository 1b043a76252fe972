"""Output helpers every command shares: a console that guesses no highlights, and the per-host recap table.

rich is imported inside the functions that draw, so that `--json` runs never load it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "red", "skipped": "dim"}


def make_console(file: TextIO | None = None, width: int | None = None) -> Console:
    """A console for command output: no guessing of highlights in host names or versions."""
    from rich.console import Console

    return Console(file=file or sys.stdout, highlight=False, width=width)


def plural(count: int, one: str, many: str | None = None) -> str:
    """`1 node`, `2 nodes`."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def plain_table(title: str | None = None) -> Table:
    """A table without a frame, as the recaps print: a header line and one line per row."""
    from rich.table import Table

    return Table(title=title, title_justify="left", show_edge=False, pad_edge=False, header_style="bold")


def host_table(rows: Mapping[str, Mapping[str, object]], columns: Sequence[str]) -> Table:
    """A recap table, one row per host: `columns` read from each host's mapping ('' when absent); a column
    named `status` is coloured (ok green, changed yellow, failed/unreachable red, skipped dim)."""
    from rich.text import Text

    table = plain_table()
    table.add_column("host", style="cyan")
    for column in columns:
        table.add_column(column, justify="left" if column in ("status", "error") else "right")
    for name, row in rows.items():
        cells: list[Text] = []
        for column in columns:
            value = "" if row.get(column) is None else str(row.get(column))
            style = STATUS_STYLE.get(value, "") if column == "status" else ""
            cells.append(Text(value, style=style))
        table.add_row(name, *cells)
    return table
