"""Output helpers every command shares: a console that guesses no highlights, the per-host recap table, and
the one filter that text from outside (a node's answer, a file, an error quoting either) passes on its way
to a person's terminal.

Any user of a GPU node can name a process `ESC ]0;... BEL` or `[/]`, and a node's files and error output
may hold anything: sent raw, ESC sequences retitle, recolour or rewrite the operator's screen, and rich
would read brackets as markup (a stray `[/x]` is a traceback). So the human views build every line that
carries such text with `shown` (or `visible` where the line is not rich's), never as a markup string.
`--json` keeps the exact data: json.dumps escapes control characters itself.

rich is imported inside the functions that draw, so that `--json` runs never load it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment
    from rich.table import Table
    from rich.text import Text

STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "red", "skipped": "dim"}


# C0 and C1 control characters but tab and newline: ESC, CSI, BEL, backspace, CR and the like.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with each control character written out as `\\xNN`, so it is shown and never obeyed."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def shown(*parts: str | tuple[str, str], style: str = "") -> Text:
    """One piece of printed text from plain or `(text, style)` parts: control characters shown (`visible`),
    brackets kept as they are (a Text is never read as markup). `style` is the style of the whole."""
    from rich.text import Text

    return Text.assemble(
        *(visible(part) if isinstance(part, str) else (visible(part[0]), part[1]) for part in parts),
        style=style,
    )


# Where output is not a terminal (a log, a pipe, CI), rich would lay tables out for 80 columns and fold
# cells mid-word (`would-e` / `nd`). Tables are as wide as their content, so a wide page costs nothing.
NOT_A_TERMINAL_WIDTH = 1000
# The blanks rich pads a table's last column and a left-justified title with, up to the end of the line
# (and any style codes after them): off a terminal they would only make `grep 'ok$'` and diffs of logs fail.
TRAILING_BLANKS = re.compile(r" +(?=(?:\x1b\[[0-9;]*m)*(?:\n|$))")


def make_console(file: TextIO | None = None, width: int | None = None, soft_wrap: bool = False) -> Console:
    """A console for command output: no guessing of highlights in host names or versions; off a terminal,
    lines as long as they are (NOT_A_TERMINAL_WIDTH) instead of wrapped at 80 columns, and no blanks at
    their ends (TRAILING_BLANKS)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # The reader left (`plan rig.yaml | head`): nothing more reaches it, the command finishes as it
            # would and exits as the exit-code table says (rich would exit 1 here, even in mid-apply).
            # Its descriptor goes to /dev/null so the interpreter's last flush does not fail either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.file.fileno())
            self.quiet = True

    class _Unpadded(_Console):
        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            return TRAILING_BLANKS.sub("", super()._render_buffer(buffer))

    out = file or sys.stdout
    if out.isatty():
        return _Console(file=out, highlight=False, width=width, soft_wrap=soft_wrap)
    width = NOT_A_TERMINAL_WIDTH if width is None else width
    return _Unpadded(file=out, highlight=False, width=width, soft_wrap=soft_wrap)


# The version of the document every `--json` prints (docs/json.md); keys are only ever added.
JSON_FORMAT_VERSION = 1


def print_json(exit_code: int, hosts: Mapping[str, object], **rest: object) -> int:
    """Print a command's `--json` document: the shared envelope (format_version, exit_code, hosts), then
    the command's own keys (docs/json.md). Returns `exit_code`, for the command to return."""
    document = {"format_version": JSON_FORMAT_VERSION, "exit_code": exit_code, "hosts": hosts, **rest}
    print(json.dumps(document, indent=2))
    return exit_code


@contextlib.contextmanager
def waiting_for(what: str, names: Sequence[str]) -> Iterator[Callable[[str], None] | None]:
    """On a terminal, a status line on stderr naming the hosts still pending (`reading facts: 12 of 19
    done, waiting for gpu-03, gpu-07`); yields the callback for `FleetOptions.on_host_done`, or None off a
    terminal (logs get the result only)."""
    if not sys.stderr.isatty() or len(names) < 2:
        yield None
        return
    pending = list(names)
    lock = threading.Lock()
    console = make_console(sys.stderr)

    with console.status(shown(pending_line(what, len(names), pending))) as status:

        def host_done(name: str) -> None:
            with lock:
                if name in pending:
                    pending.remove(name)
                status.update(shown(pending_line(what, len(names), pending)))

        yield host_done


def pending_line(what: str, total: int, pending: Sequence[str], most: int = 8) -> str:
    """`reading facts: 17 of 19 done, waiting for gpu-03, gpu-07`; past `most` names, `and N more`."""
    names = ", ".join(pending[:most]) + (f" and {len(pending) - most} more" if len(pending) > most else "")
    return f"{what}: {total - len(pending)} of {total} done, waiting for {names}"


def plural(count: int, one: str, many: str | None = None) -> str:
    """`1 node`, `2 nodes`."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def plain_table(title: str | Text | None = None) -> Table:
    """A table without a frame, as the recaps print: a header line and one line per row. The title is one
    line even where the table is narrower (rich would fold it to the table's width, a word a line)."""
    from rich.table import Table
    from rich.text import Text

    line = None
    if title is not None:
        line = title.copy() if isinstance(title, Text) else Text(title)
        line.no_wrap, line.overflow = True, "ignore"
    return Table(title=line, title_justify="left", show_edge=False, pad_edge=False, header_style="bold")


def host_table(rows: Mapping[str, Mapping[str, object]], columns: Sequence[str]) -> Table:
    """A recap table, one row per host: `columns` read from each host's mapping ('' when absent); a column
    named `status` is coloured (ok green, changed yellow, failed/unreachable red, skipped dim); a column of
    figures (counts, times) is aligned right, words left. Every cell is `shown`: an error column quotes what
    a node said."""
    table = plain_table()
    table.add_column("host", style="cyan")
    values = {c: ["" if row.get(c) is None else str(row.get(c)) for row in rows.values()] for c in columns}
    for column in columns:
        figures = [value for value in values[column] if value]
        numeric = bool(figures) and all(value[:1].isdigit() for value in figures)
        table.add_column(column, justify="right" if numeric else "left")
    for index, name in enumerate(rows):
        cells: list[Text] = [shown(name)]
        for column in columns:
            value = values[column][index]
            style = STATUS_STYLE.get(value, "") if column == "status" else ""
            cells.append(shown(value, style=style))
        table.add_row(*cells)
    return table
