"""The box as a picture: its GPUs and their links as the rig file says and as the node reports them.

`facts --svg` and `plan --svg` draw one SVG per host, and `plan --report` puts the same pictures in its
HTML. A bridged or mesh box gets one edge per GPU pair that has or should have NVLinks, labelled `NV4`; a
pair with fewer (or more) active links than the rig says is dashed, in another colour, labelled `3/4`. An
NVSwitch board, or a GB200 tray whose links end at the rack's switch trays, is a star: one edge per GPU to
the fabric with its active links of those wanted (`16/18`), because the 28-edge pairwise mesh of eight
GPUs drawn is a blob in which the one bad link vanishes. What is wanted comes from the rig file (captured
`topo -m` counts, else `bridge.links`); the GPU's colour from the node's own health values and, under
plan, from the failed checks that name it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog.topology import nvlink_count
from ..facts import FACTS_SCHEMA_VERSION, Facts, Gpu
from ..plan.expectation import for_rig
from ..rig.rig import LoadedRig
from .svg import STATES, Svg, text_width, write_atomic

if TYPE_CHECKING:
    from ..rig.models import Host

WIDTH = 760
WIDE = 1000  # a mesh of more than four GPUs: room for the ring without boxes touching
GPU_W, GPU_H = 168, 70
MAX_FINDINGS = 12


@dataclass(frozen=True)
class Wanted:
    """The rig file's word on one host's interconnect."""

    kind: str = "none"  # none, nvlink-bridge, nvlink, nvswitch
    links: int | None = None  # per bridged pair, or per GPU to the switches
    pairs: tuple[tuple[int, int], ...] = ()
    cells: tuple[tuple[str, ...], ...] | None = None  # the captured topo -m, GPU by GPU

    def pair_links(self, a: int, b: int) -> int | None:
        """Links the rig wants between two GPUs; None where it says nothing."""
        if self.cells is not None and max(a, b) < len(self.cells):
            return nvlink_count(self.cells[a][b])
        if self.kind in ("nvlink-bridge", "nvlink") and self.pairs:
            listed = {(min(p), max(p)) for p in self.pairs}
            return (self.links or 1) if (min(a, b), max(a, b)) in listed else 0
        return None


def wanted_of(loaded: LoadedRig, host: Host) -> Wanted:
    expect = for_rig(loaded, host)
    return Wanted(expect.bridge_kind, expect.bridge_links, expect.bridge_pairs, expect.topology)


@dataclass(frozen=True)
class Finding:
    """A line the picture lists under the box: a plan change's state and words."""

    state: str  # a key of svg.STATES
    text: str
    check: str = ""  # the plan resource; a topology finding is drawn on its edge, not on the GPUs it names


def _short_bus(bus: str | None) -> str:
    return re.sub(r"^0{4}(?=[0-9A-Fa-f]{4}:)", "", bus or "?")


def _short_model(name: str) -> str:
    return name.removeprefix("NVIDIA ").removeprefix("GeForce ")


def gpu_health(facts: Facts, gpu: Gpu, findings: Sequence[Finding]) -> tuple[str, list[str]]:
    """The GPU's state and why: a failed check naming it, Xids, uncorrectable ECC or a failed row remap
    fail it; a warning naming it or inactive NVLinks warn (their edge shows the failure)."""
    named = re.compile(rf"\bGPU {gpu.index}\b")
    mine = [f for f in findings if f.check != "topology" and named.search(f.text)]
    fail = [f.text for f in mine if f.state == "fail"]
    health = facts.health.gpu(gpu.index) if facts.health is not None else None
    xids = sorted({x.code for x in (facts.health.xid if facts.health else []) if x.gpu == gpu.index})
    fail += [f"Xid {code}" for code in xids]
    if health is not None:
        if health.ecc_volatile_uncorrectable:
            fail.append(f"{health.ecc_volatile_uncorrectable} uncorrectable ECC errors")
        if health.remapped_rows_failure:
            fail.append("row remapping failed")
        if health.fabric_summary == "unhealthy":
            fail.append("fabric unhealthy")
    if fail:
        return "fail", fail
    down = [link.link for link in gpu.nvlinks if not link.active]
    warn = [f.text for f in mine if f.state == "warn"]
    warn += [f"NVLink {', '.join(map(str, down))} inactive"] if down else []
    return ("warn", warn) if warn else ("ok", [])


def _gpu_box(svg: Svg, x: float, y: float, facts: Facts, gpu: Gpu, findings: Sequence[Finding]) -> None:
    state, why = gpu_health(facts, gpu, findings)
    look = STATES[state]
    reasons = "; ".join(why) if why else "healthy"
    title = f"GPU {gpu.index}: {gpu.name}, {gpu.pci_bus_id}, {gpu.memory_mib} MiB, {state}: {reasons}"
    svg.rect(x, y, GPU_W, GPU_H, look.fill, look.ink, title, stroke_width=2)
    svg.text(x + GPU_W / 2, y + 13, f"GPU {gpu.index}  {look.letter} {state}", 12, fill=look.ink, bold=True,
             title=title)
    svg.text(x + GPU_W / 2, y + 31, _short_model(gpu.name)[:26], 11, title=title)
    svg.text(x + GPU_W / 2, y + 47, _short_bus(gpu.pci_bus_id), 11, title=title)
    clique = f" \u00b7 clique {gpu.fabric.clique_id}" if gpu.fabric is not None else ""
    svg.text(x + GPU_W / 2, y + 61, (why[0] if why else f"{gpu.memory_mib // 1024} GiB{clique}")[:28], 10,
             fill=look.ink, title=title)


Label = tuple[float, float, str, str, str]  # x, y, words, colour, hover text


def _edge(svg: Svg, x1: float, y1: float, x2: float, y2: float, active: int, want: int | None,
          what: str, at: float = 0.5, star: bool = False) -> Label:
    """One link edge and its label: `NV4` as wanted (on a star always `18/18`), `3/4` dashed in the fail
    colour when short or over."""
    if want is None or active == want:
        label = f"{active}/{want}" if star else f"NV{active}"
        stroke, dash, state = "#37474f", False, "as the rig says"
    else:
        stroke, dash, label = STATES["fail"].ink, True, f"{active}/{want}"
        state = f"{active} of {want} NVLinks active"
    title = f"{what}: {state}"
    svg.line(x1, y1, x2, y2, stroke, 3 if not dash else 3.5, title, dash)
    return x1 + (x2 - x1) * at, y1 + (y2 - y1) * at, label, stroke, title


def _labels(svg: Svg, labels: list[Label]) -> None:
    """Edge labels go on last, above every line and box, so none is hidden or crossed."""
    for x, y, words, colour, title in labels:
        svg.label(x, y, words, 12, fill=colour, stroke=colour, title=title)


def _is_star(facts: Facts, wanted: Wanted) -> bool:
    switch_links = any(link.remote_type == "switch" for g in facts.gpus for link in g.nvlinks)
    return facts.nvswitch or wanted.kind == "nvswitch" or switch_links


def _star(svg: Svg, top: float, facts: Facts, wanted: Wanted, findings: Sequence[Finding]) -> float:
    gpus = facts.gpus
    up = gpus[: (len(gpus) + 1) // 2]
    down = gpus[len(up):]
    per_row = max(len(up), 1)
    step = (WIDTH - 40) / per_row
    fabric_y = top + GPU_H + 90
    fabric = sorted({(g.fabric.clique_id, g.fabric.cluster_uuid) for g in gpus if g.fabric is not None})
    if fabric:  # a GB200/GB300 tray: the switches are the rack's switch trays
        cliques = ", ".join(str(clique) for clique, _ in fabric)
        clusters = ", ".join(sorted({cluster[:8] for _, cluster in fabric}))
        name = f"NVLink fabric (rack switch trays) \u00b7 clique {cliques} \u00b7 cluster {clusters}"
    else:
        name = "NVSwitch fabric"
    title = f"{name}: every GPU's NVLinks end at a switch"
    rows = ((up, top), (down, fabric_y + 40 + 90))
    labels = []
    for row, y in rows:
        for k, gpu in enumerate(row):
            cx = 20 + step * (k + 0.5)
            active = sum(1 for link in gpu.nvlinks if link.active and link.remote_type == "switch")
            want = wanted.links or len(gpu.nvlinks)
            edge_y = y + GPU_H if y < fabric_y else y
            fabric_edge = fabric_y if y < fabric_y else fabric_y + 40
            what = f"GPU {gpu.index} to the fabric"
            labels.append(_edge(svg, cx, edge_y, cx, fabric_edge, active, want, what, star=True))
    svg.rect(20, fabric_y, WIDTH - 40, 40, "#eceff1", "#37474f", title, rx=8, stroke_width=2)
    svg.text(WIDTH / 2, fabric_y + 20, name, 13, bold=True, title=title)
    for row, y in rows:
        for k, gpu in enumerate(row):
            _gpu_box(svg, 20 + step * (k + 0.5) - GPU_W / 2, y, facts, gpu, findings)
    _labels(svg, labels)
    return fabric_y + 40 + 90 + (GPU_H if down else -90)


def _mesh(svg: Svg, top: float, facts: Facts, wanted: Wanted, findings: Sequence[Finding]) -> float:
    gpus = facts.gpus
    n = len(gpus)
    if n <= 2:
        spots = [(WIDTH / 2 + (k - (n - 1) / 2) * 360, top + GPU_H / 2 + 10) for k in range(n)]
        bottom = top + GPU_H + 10
    else:
        width = WIDTH if n <= 4 else WIDE
        rx, ry = width / 2 - GPU_W / 2 - 20, 110 + 28 * n
        cx, cy = width / 2, top + ry + GPU_H / 2
        turn = [2 * math.pi * k / n for k in range(n)]
        spots = [(cx + rx * math.sin(a), cy - ry * math.cos(a)) for a in turn]
        bottom = cy + ry + GPU_H / 2 + 10
    where = {gpu.index: spot for gpu, spot in zip(gpus, spots, strict=True)}
    labels = []
    for a_gpu in gpus:
        for b_gpu in gpus:
            a, b = a_gpu.index, b_gpu.index
            if a >= b:
                continue
            pair = facts.pair(a, b)
            active = pair.nvlinks if pair is not None else 0
            want = wanted.pair_links(a, b)
            if not active and not want:
                continue
            (x1, y1), (x2, y2) = where[a], where[b]
            # The diameters all cross the centre: their labels are moved off it, each to its own side.
            through = n > 2 and n % 2 == 0 and abs(a - b) == n // 2
            at = (0.3 if a % 2 else 0.7) if through else 0.5
            labels.append(_edge(svg, x1, y1, x2, y2, active, want, f"GPU {a} - GPU {b}", at=at))
    for gpu in gpus:
        x, y = where[gpu.index]
        _gpu_box(svg, x - GPU_W / 2, y - GPU_H / 2, facts, gpu, findings)
    _labels(svg, labels)
    return bottom


def box_svg(name: str, facts: Facts | None, wanted: Wanted, findings: Sequence[Finding] = (),
            error: str | None = None, listed: bool = True) -> Svg:
    """The picture of one host; without facts (unreachable, or facts of another format) a greyed box.
    `findings` colour the GPUs they name and, when `listed`, are written under the box."""
    if facts is not None and facts.schema_version != FACTS_SCHEMA_VERSION:
        error = (f"facts of format {facts.schema_version}; this mgpu-provision reads format "
                 f"{FACTS_SCHEMA_VERSION}: run the same version on both ends")
        facts = None
    if facts is None:
        svg = Svg(WIDTH, 110, f"{name}: no facts")
        look = STATES["unreachable"]
        reason = error or "no facts"
        svg.rect(10, 10, WIDTH - 20, 90, look.fill, look.ink, f"{name}: {reason}")
        svg.text(WIDTH / 2, 40, f"{name}  {look.letter} no facts", 14, fill=look.ink, bold=True)
        svg.text(WIDTH / 2, 70, reason[:110], 11, fill=look.ink, title=reason)
        return svg
    parts = [facts.board.model or "", f"driver {facts.driver.version}" if facts.driver.version else
             facts.driver.nvml, f"rig: {wanted.kind}" + (f" x{wanted.links}" if wanted.links else "")]
    if facts.host.simulated:
        parts.append("simulated")
    header = " \u00b7 ".join(p for p in parts if p)
    top = 56
    star = bool(facts.gpus) and _is_star(facts, wanted)
    width = WIDE if facts.gpus and not star and len(facts.gpus) > 4 else WIDTH
    # The height is known only once drawn: draw into a scratch document, then size the real one.
    scratch = Svg(width, 0, "")
    if not facts.gpus:
        scratch.text(WIDTH / 2, top + 20, "no GPUs", 13)
        bottom = top + 40.0
    elif star:
        bottom = _star(scratch, top, facts, wanted, findings)
    else:
        bottom = _mesh(scratch, top, facts, wanted, findings)
    shown = findings if listed else ()
    y = bottom + (16 if facts.lost_gpus or shown else 0)
    for lost in facts.lost_gpus:
        look = STATES["fail"]
        line = f"{look.letter} GPU {lost.index} ({_short_bus(lost.pci_bus_id)}) is lost: {lost.error}"
        scratch.text(20, y, line, 12, anchor="start", fill=look.ink, bold=True)
        y += 18
    for finding in shown[:MAX_FINDINGS]:
        look = STATES[finding.state]
        line = f"{look.letter} {finding.text}"
        cut = int((width - 40) / text_width("x", 11))
        scratch.text(20, y, line[:cut - 1] + ("\u2026" if len(line) >= cut else ""), 11, anchor="start",
                     fill=look.ink if finding.state == "fail" else "#212121", title=finding.text)
        y += 16
    if len(shown) > MAX_FINDINGS:
        scratch.text(20, y, f"\u2026 and {len(shown) - MAX_FINDINGS} more", 11, anchor="start")
        y += 16
    svg = Svg(width, y + 8, f"{name}: {header}")
    svg.rect(0, 0, width, y + 8, "#ffffff", "#ffffff", rx=0)
    svg.text(20, 18, name, 16, anchor="start", bold=True, title=name)
    svg.text(20, 40, header, 12, anchor="start", fill="#455a64", title=header)
    svg.parts += scratch.parts[1:]
    return svg


def picture_paths(path: Path, names: Sequence[str]) -> dict[str, Path]:
    """Where each host's picture goes: FILE itself for one host, else FILE's name with `-HOST` before its
    suffix, beside it (`box.svg` -> `box-gpu-a.svg`)."""
    if len(names) == 1:
        return {names[0]: path}
    return {name: path.with_name(f"{path.stem}-{name}{path.suffix or '.svg'}") for name in names}


def write_pictures(path: Path, pictures: Mapping[str, Svg]) -> list[Path]:
    written = []
    for name, where in picture_paths(path, list(pictures)).items():
        write_atomic(where, pictures[name].render())
        written.append(where)
    return written
