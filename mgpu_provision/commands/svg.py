"""A small SVG writer for the pictures (`facts --svg`, `plan --svg`, `plan --report`): no plotting stack.

The pictures must be byte-for-byte the same for the same input (golden files, reviewable diffs), readable
where a label sits on a line (every label gets a backing box), and hoverable (every element has a
`<title>`). Text is escaped with the standard library's XML escaping; numbers are printed rounded to one
decimal so no float noise reaches the file. The palette of states lives here because the box and the fleet
pictures must mean the same thing by the same colour, and each state has a letter so that no reader depends
on colour alone. Files are written atomically: a picture is there whole or not at all.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from ..errors import ProvisionError
from ..typing_lite import NamedTuple

FONT = "DejaVu Sans, Verdana, sans-serif"
CHAR_WIDTH = 0.6  # of the font size: a wide estimate, so backing boxes never cut a label short


class State(NamedTuple):
    fill: str  # cell and box fill
    ink: str  # edge and letter colour
    letter: str  # the state without colour
    meaning: str


# Red (#d32f2f) is used for `fail` and nothing else: the tests look for red pixels to find failures.
STATES: dict[str, State] = {
    "ok": State("#c8e6c9", "#1b5e20", "\u2713", "ok: matches the rig file"),
    "drift": State("#fff59d", "#6d5d00", "~", "drift: apply would change it"),
    "warn": State("#ffcc80", "#8a4b00", "!", "warn: look at it, nothing is broken yet"),
    "fail": State("#ef9a9a", "#d32f2f", "\u2717", "fail: broken, apply cannot fix it"),
    "unreachable": State("#bdbdbd", "#424242", "?", "unreachable: no facts read"),
    "skipped": State("#f5f5f5", "#757575", "\u2013", "skipped: not checked on this rig"),
    "simulated": State("#bbdefb", "#0d47a1", "S", "simulated: ok on a twin, not on hardware"),
}


def _n(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def text_width(text: str, size: float) -> float:
    return len(text) * size * CHAR_WIDTH


class Svg:
    """An SVG document built element by element, in the order drawn (later elements lie on top)."""

    def __init__(self, width: float, height: float, title: str) -> None:
        self.width, self.height = width, height
        self.parts: list[str] = [f"<title>{escape(title)}</title>"]

    def _add(self, tag: str, attrs: dict[str, object], title: str | None, body: str = "") -> None:
        words = " ".join(
            f"{k.replace('_', '-')}={quoteattr(_n(v) if isinstance(v, (int, float)) else str(v))}"
            for k, v in attrs.items()
            if v is not None
        )
        inner = (f"<title>{escape(title)}</title>" if title else "") + body
        self.parts.append(f"<{tag} {words}>{inner}</{tag}>" if inner else f"<{tag} {words}/>")

    def rect(
        self, x: float, y: float, w: float, h: float, fill: str, stroke: str = "#424242",
        title: str | None = None, dash: bool = False, rx: float = 4, stroke_width: float = 1.5,
    ) -> None:
        self._add(
            "rect",
            dict(x=x, y=y, width=w, height=h, rx=rx, fill=fill, stroke=stroke, stroke_width=stroke_width,
                 stroke_dasharray="6 4" if dash else None),
            title,
        )

    def line(
        self, x1: float, y1: float, x2: float, y2: float, stroke: str, width: float = 3,
        title: str | None = None, dash: bool = False,
    ) -> None:
        self._add(
            "line",
            dict(x1=x1, y1=y1, x2=x2, y2=y2, stroke=stroke, stroke_width=width,
                 stroke_dasharray="8 5" if dash else None),
            title,
        )

    def text(
        self, x: float, y: float, text: str, size: float = 12, anchor: str = "middle",
        fill: str = "#212121", bold: bool = False, title: str | None = None,
    ) -> None:
        """`y` is the text's middle, so callers centre labels without font metrics."""
        self._add(
            "text",
            dict(x=x, y=y + size * 0.35, font_family=FONT, font_size=size, text_anchor=anchor, fill=fill,
                 font_weight="bold" if bold else None),
            title,
            escape(text),
        )

    def label(
        self, x: float, y: float, text: str, size: float = 11, fill: str = "#212121",
        stroke: str = "#9e9e9e", title: str | None = None,
    ) -> None:
        """Text centred on (x, y) over a white box, for labels that sit on a line."""
        w, h = text_width(text, size) + 8, size + 6
        self.rect(x - w / 2, y - h / 2, w, h, "#ffffff", stroke, title, rx=3, stroke_width=1)
        self.text(x, y, text, size, fill=fill, title=title)

    def open_link(self, href: str) -> None:
        self.parts.append(f"<a href={quoteattr(href)}>")

    def close_link(self) -> None:
        self.parts.append("</a>")

    def render(self, standalone: bool = True) -> str:
        head = '<?xml version="1.0" encoding="UTF-8"?>\n' if standalone else ""
        size = f'width="{_n(self.width)}" height="{_n(self.height)}"'
        box = f'viewBox="0 0 {_n(self.width)} {_n(self.height)}"'
        body = "\n".join(self.parts)
        return f'{head}<svg xmlns="http://www.w3.org/2000/svg" {size} {box}>\n{body}\n</svg>\n'


def legend(svg: Svg, x: float, y: float, states: tuple[str, ...]) -> float:
    """One swatch, letter and word per state in a row; returns the x after it."""
    for name in states:
        state = STATES[name]
        svg.rect(x, y - 8, 16, 16, state.fill, state.ink, state.meaning, rx=2)
        svg.text(x + 8, y, state.letter, 11, fill=state.ink, bold=True, title=state.meaning)
        svg.text(x + 21, y, name, 11, anchor="start", title=state.meaning)
        x += 30 + text_width(name, 11)
    return x


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file beside it, then a rename)."""
    folder = path.absolute().parent
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        advice = "choose a folder you may write in"
        raise ProvisionError(f"{path}: cannot write it ({exc.strerror}); {advice}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        os.unlink(temporary)
        raise ProvisionError(f"{path}: cannot write it ({exc.strerror})") from exc
