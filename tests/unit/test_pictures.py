"""The pictures (`facts --svg`, `plan --svg`, `plan --report`): well-formed, complete, deterministic, and
looked at — rendered by rsvg-convert and by a real headless Chromium.

Golden files under tests/fixtures/pictures/ hold the reviewed output; after a deliberate change of the
drawing, write them again with `MGPU_WRITE_GOLDEN=1` and look at the PNGs (docs/pictures/) before
committing. The PNG checks decode pixels with zlib (tests/support/pictures.png_pixels).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mgpu_provision.cli import main
from mgpu_provision.commands.box_picture import Finding, Wanted, box_svg, picture_paths
from mgpu_provision.commands.fleet_report import (
    CHECKS,
    change_state,
    fold,
    read_smoke,
    report_html,
    write_plan_pictures,
)
from mgpu_provision.commands.svg import STATES, write_atomic
from mgpu_provision.errors import ProvisionError
from mgpu_provision.plan.change import Change
from tests.support import pictures
from tests.support.pictures import (
    bridge_facts,
    chromium_screenshot,
    console_errors,
    dgx1_facts,
    fleet_plan,
    fleet_rig,
    gb200_facts,
    is_red,
    nvswitch_facts,
    png_pixels,
    rsvg_png,
)

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "pictures"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "pictures"
SVG = "{http://www.w3.org/2000/svg}"
BRIDGE = Wanted("nvlink-bridge", 4, ((0, 1),))
NVSWITCH = Wanted("nvswitch", 12)
needs_rsvg = pytest.mark.skipif(shutil.which("rsvg-convert") is None, reason="rsvg-convert (librsvg2-bin)")
needs_chromium = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="Debian's chromium")


def golden(name: str, text: str) -> None:
    """Compare with the golden file; with MGPU_WRITE_GOLDEN=1 write it, and its PNG under docs/pictures/
    (rsvg-convert for a box, a Chromium screenshot for a report) for a person to look at."""
    path = GOLDEN / name
    if os.environ.get("MGPU_WRITE_GOLDEN"):
        path.write_text(text)
        png = DOCS / (path.stem + ".png")
        if name.endswith(".svg"):
            shutil.copy(rsvg_png(path), png)
            path.with_suffix(".png").unlink()
        else:
            with tempfile.TemporaryDirectory() as profile:
                chromium_screenshot(path, png, Path(profile))
    assert text == path.read_text(), f"{name} differs from its golden file (MGPU_WRITE_GOLDEN=1 rewrites)"


def words(root: ET.Element) -> list[str]:
    """Every text element's words (they follow its <title>)."""
    found = []
    for text in root.iter(f"{SVG}text"):
        title = text.find(f"{SVG}title")
        found.append((text.text if title is None else title.tail) or "")
    return found


def titles(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}title")]


def degraded_board() -> str:
    return box_svg("hgx-1", nvswitch_facts(down=[{"gpu": 5, "link": 3}, {"gpu": 5, "link": 7}]),
                   NVSWITCH).render()


def dgx1_mesh() -> str:
    facts, cells = dgx1_facts(down=[{"gpu": 1, "link": 0}])
    return box_svg("dgx-1", facts, Wanted("nvlink", None, (), cells)).render()


BOXES = {
    "dgx1-mesh-8gpu.svg": dgx1_mesh,
    "bridge-2gpu.svg": lambda: box_svg("gpu-a", bridge_facts(down=[{"gpu": 1, "link": 2}]), BRIDGE).render(),
    "nvswitch-8gpu-degraded.svg": degraded_board,
    "gb200-tray.svg": lambda: box_svg("tray-1", gb200_facts(), Wanted("nvswitch", 18)).render(),
}


@pytest.mark.parametrize("name", sorted(BOXES))
def test_box_pictures_are_well_formed_deterministic_and_golden(name: str) -> None:
    text = BOXES[name]()
    assert text == BOXES[name]()
    root = ET.fromstring(text.split("\n", 1)[1])
    rects = [t for t in titles(root) if re.match(r"GPU \d+: ", t)]
    count = {"bridge-2gpu.svg": 2, "nvswitch-8gpu-degraded.svg": 8, "gb200-tray.svg": 4,
             "dgx1-mesh-8gpu.svg": 8}[name]
    assert sorted({t.split(":")[0] for t in rects}) == [f"GPU {i}" for i in range(count)]
    # Every drawn element carries its hover text.
    for element in root:
        if element.tag in (f"{SVG}rect", f"{SVG}line", f"{SVG}text") and element.get("fill") != "#ffffff":
            assert element.find(f"{SVG}title") is not None or element.tag == f"{SVG}text", element.attrib
    golden(name, text)


def test_a_short_bridge_link_is_dashed_red_with_its_count() -> None:
    root = ET.fromstring(BOXES["bridge-2gpu.svg"]().split("\n", 1)[1])
    (edge,) = root.iter(f"{SVG}line")
    assert edge.get("stroke-dasharray") and edge.get("stroke") == STATES["fail"].ink
    labels = words(root)
    assert "3/4" in labels
    healthy = ET.fromstring(box_svg("gpu-a", bridge_facts(), BRIDGE).render().split("\n", 1)[1])
    (edge,) = healthy.iter(f"{SVG}line")
    assert edge.get("stroke-dasharray") is None and "NV4" in words(healthy)


def test_an_nvswitch_board_is_a_star_not_a_mesh() -> None:
    root = ET.fromstring(degraded_board().split("\n", 1)[1])
    edges = list(root.iter(f"{SVG}line"))
    assert len(edges) == 8  # one per GPU, not the 28 pairs
    labels = words(root)
    assert labels.count("12/12") == 7 and "10/12" in labels
    dashed = [e for e in edges if e.get("stroke-dasharray")]
    assert [e.find(f"{SVG}title").text for e in dashed] == ["GPU 5 to the fabric: 10 of 12 NVLinks active"]


def test_a_gb200_tray_shows_its_fabric_clique() -> None:
    labels = words(ET.fromstring(BOXES["gb200-tray.svg"]().split("\n", 1)[1]))
    assert any("clique 7" in label and "cluster 5e1c9a52" in label for label in labels)


@needs_rsvg
@pytest.mark.parametrize(("name", "red"), [("bridge-2gpu.svg", True), ("nvswitch-8gpu-degraded.svg", True),
                                           ("dgx1-mesh-8gpu.svg", True),
                                           ("gb200-tray.svg", False), ("bridge-healthy.svg", False)])
def test_rendered_box_has_its_size_and_red_only_for_a_failure(name: str, red: bool, tmp_path: Path) -> None:
    healthy = name == "bridge-healthy.svg"
    text = box_svg("gpu-a", bridge_facts(), BRIDGE).render() if healthy else BOXES[name]()
    svg = tmp_path / name
    svg.write_text(text)
    width, height, pixels = png_pixels(rsvg_png(svg))
    root = ET.fromstring(text.split("\n", 1)[1])
    assert (width, height) == (int(float(root.get("width"))), int(float(root.get("height"))))
    assert any(is_red(p) for p in pixels) is red


def test_facts_of_another_format_and_a_host_without_facts_are_greyed() -> None:
    old = bridge_facts().model_copy(update={"schema_version": 0})
    text = box_svg("gpu-a", old, BRIDGE).render()
    assert "facts of format 0; this mgpu-provision reads format 1" in text
    assert STATES["unreachable"].fill in text and "GPU 0" not in text
    gone = box_svg("gpu-b", None, BRIDGE, error="ssh: connection refused").render()
    assert "ssh: connection refused" in gone and STATES["unreachable"].fill in gone


def test_change_states_follow_action_and_severity() -> None:
    failed = Change("xid", "verify-failed", "Xid 79", None, None)
    assert change_state(failed) == "fail"
    assert change_state(Change("driver", "manual", "drain", None, None)) == "warn"
    assert change_state(Change("file:/x", "create", "new", None, None)) == "drift"
    assert change_state(Change("throttle", "warn", "clocks held down", None, None)) == "warn"


# GPU 0 in hardware thermal slowdown: a warning (judge/records.SEVERITIES, after DCGM's MonitorThermal).
HOT = {"gpus": [{"index": 0, "throttle": ["hw_thermal"]}, {"index": 1, "throttle": []}], "xid": [],
       "xid_source": "journal"}


def twelve(tmp_path: Path):  # type: ignore[no-untyped-def]
    loaded = fleet_rig(tmp_path, 10, 2)
    plan = fleet_plan(loaded, {
        "gpu-0003": bridge_facts(down=[{"gpu": 0, "link": 1}]),
        "gpu-0005": bridge_facts(health=HOT),
        "gpu-0007": "ssh: connect to host gpu-0007 port 22: Connection refused",
        "hgx-02": nvswitch_facts(down=[{"gpu": 5, "link": 3}]),
    })
    return loaded, plan


def test_fleet_rows_fold_healthy_hosts_and_keep_odd_ones(tmp_path: Path) -> None:
    loaded, plan = twelve(tmp_path)
    rows = fold(loaded, plan)
    assert [r.label for r in rows] == [
        "gpu-[0001-0002,0004,0006,0008-0010] all ok", "gpu-0003", "gpu-0005", "gpu-0007", "hgx-01 all ok",
        "hgx-02",
    ]
    assert sorted(h.host for r in rows for h in r.hosts) == sorted(h.host for h in plan.hosts)
    cells = {r.label: dict(zip(CHECKS, r.cells, strict=True)) for r in rows}
    assert cells["gpu-0003"]["topology"] == "fail" and cells["hgx-02"]["topology"] == "fail"
    assert set(cells["gpu-0007"].values()) == {"unreachable"}
    assert cells["gpu-0005"]["health"] == "warn"
    assert set(cells["gpu-0005"].values()) == {"ok", "warn", "skipped"}
    assert cells["hgx-01 all ok"]["slurm"] == "skipped"


def test_fleet_report_is_self_contained_linked_and_golden(tmp_path: Path) -> None:
    loaded, plan = twelve(tmp_path)
    html = report_html(loaded, plan)
    assert html == report_html(loaded, plan)
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    svgs = re.findall(r"<svg .*?</svg>", html, re.S)
    assert len(svgs) == 7  # the heat map and one box per row
    for svg in svgs:
        ET.fromstring(svg)
    targets = set(re.findall(r'<a href="#([^"]+)">', html))
    assert targets == set(re.findall(r'<section id="([^"]+)">', html)) == {
        "host-gpu-0001", "host-gpu-0003", "host-gpu-0005", "host-gpu-0007", "host-hgx-01", "host-hgx-02"}
    heat = ET.fromstring(svgs[0])
    cell = next(t for t in titles(heat) if t == "gpu-0003 \u00b7 topology: fail")
    assert cell
    for name, state in STATES.items():  # the legend: colour, letter and word for every state
        assert state.meaning in titles(heat), name
    assert "Connection refused" in html
    golden("fleet-12.html", html)


def test_two_thousand_hosts_are_a_few_rows(tmp_path: Path) -> None:
    loaded = fleet_rig(tmp_path, 2000)
    odd = {"gpu-0640": bridge_facts(down=[{"gpu": 1, "link": 0}]), "gpu-1999": "no route to host"}
    plan = fleet_plan(loaded, odd, plan_healthy=False)
    html = report_html(loaded, plan)
    assert [r.label for r in fold(loaded, plan)] == [
        "gpu-[0001-0639,0641-1998,2000] all ok", "gpu-0640", "gpu-1999"]
    assert len(html) < 2_000_000
    golden("fleet-2000.html", html)


def test_smoke_bandwidth_beside_its_rows(tmp_path: Path) -> None:
    loaded, plan = twelve(tmp_path)
    report = tmp_path / "smoke.json"
    report.write_text('{"format_version": 1, "exit_code": 0, "hosts": {}, "groups": [{"master": "hgx-01", '
                      '"ok": true, "bandwidth": [{"busbw_gbps": 182.5}, {"busbw_gbps": 190.25}], '
                      '"nodes": [{"host": "hgx-01"}, {"host": "hgx-02"}]}]}')
    html = report_html(loaded, plan, read_smoke(report, tmp_path / "r.html"))
    assert html.count("\u2713 190.25 GB/s<") == 2 and "smoke busbw" in html
    report.write_text('{"run_id": "x", "groups": []}')
    with pytest.raises(ProvisionError, match="format None; this mgpu-provision reads format 1"):
        read_smoke(report, tmp_path / "r.html")
    with pytest.raises(ProvisionError, match=r"give --report FILE\.html too"):
        read_smoke(report, None)


def test_an_unwritable_path_is_a_plain_error_and_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ProvisionError, match="cannot write it"):
        write_atomic(blocker / "report.html", "x")
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "report.html"
    target.mkdir()  # a folder where the file goes: the rename fails, the temporary file is removed
    with pytest.raises(ProvisionError, match="cannot write it"):
        write_atomic(target, "x")
    assert [p.name for p in folder.iterdir()] == ["report.html"]


def test_the_cli_refuses_a_report_path_in_a_missing_folder(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rig = tmp_path / "rig.yaml"
    rig.write_text("version: 1\nhosts: []\nrigs: {}\n")
    with pytest.raises(SystemExit) as exited:
        main(["plan", str(rig), "--report", str(tmp_path / "nope" / "r.html")])
    assert exited.value.code == 1  # a usage error, as every path option (commands/paths.py)
    assert "does not exist" in capsys.readouterr().err


def test_plan_svg_writes_one_file_per_host(tmp_path: Path) -> None:
    loaded, plan = twelve(tmp_path)
    write_plan_pictures(loaded, plan, svg=tmp_path / "box.svg")
    written = sorted(p.name for p in tmp_path.glob("box-*.svg"))
    assert written == sorted(f"box-{h.host}.svg" for h in plan.hosts)
    assert picture_paths(tmp_path / "box.svg", ["a"]) == {"a": tmp_path / "box.svg"}
    text = (tmp_path / "box-gpu-0003.svg").read_text()
    assert "topology: GPU 0 link 1 is inactive" in text  # the findings under the box


def test_findings_colour_the_gpu_they_name() -> None:
    finding = Finding("fail", "xid: GPU 1 logged Xid 79 (fallen off the bus)")
    root = ET.fromstring(box_svg("gpu-a", bridge_facts(), BRIDGE, [finding]).render().split("\n", 1)[1])
    boxes = {t.split(":")[0]: t for t in titles(root) if re.match(r"GPU \d: ", t)}
    assert ", fail: xid: GPU 1 logged" in boxes["GPU 1"] and ", ok: healthy" in boxes["GPU 0"]


@needs_chromium
def test_chromium_shows_the_report_without_console_errors(tmp_path: Path) -> None:
    loaded, plan = twelve(tmp_path)
    page = tmp_path / "report.html"
    page.write_text(report_html(loaded, plan))
    profile = tmp_path / "profile"
    profile.mkdir()
    log = chromium_screenshot(page, tmp_path / "shot.png", profile)
    assert console_errors(log) == []
    width, height, pixels = png_pixels(tmp_path / "shot.png")
    assert (width, height) == (1280, 900)
    assert len(set(pixels[:: 97])) > 20  # not blank: text, cells and boxes in many colours
    assert any(is_red(p) for p in pixels)  # gpu-0003's failed topology cell is on the first screen


@needs_chromium
def test_the_console_check_sees_an_error(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text('<html><body><script>console.error("boom")</script></body></html>')
    profile = tmp_path / "profile"
    profile.mkdir()
    assert console_errors(chromium_screenshot(page, tmp_path / "bad.png", profile))


def test_support_module_is_used() -> None:
    assert pictures.CHROMIUM_FLAGS[0] == "--headless"


LOCAL_RIG = """\
version: 1
defaults: {{connect_timeout_s: 2}}
hosts:
  - {{name: box, rig: pair, connection: local, python: {python}, simulate: {twin}}}
  - {{name: far, address: 127.0.0.1, port: 1, rig: pair}}  # nothing listens there: refused
rigs:
  pair:
    gpus: {{model: "NVIDIA GeForce RTX 3090", count: 2}}
    bridge: {{kind: nvlink-bridge, pairs: [[0, 1]], links: 4}}
files: {{state_dir: {state}}}  # the local host's health sample: the test's folder, not this machine's
"""


def test_the_commands_write_their_pictures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the agent cache of a local host lives in ~/.cache
    rig = tmp_path / "rig.yaml"
    twin = pictures.TWINS / "rtx3090-nvlink.yaml"
    rig.write_text(LOCAL_RIG.format(python=sys.executable, twin=twin, state=tmp_path / "state"))
    assert main(["facts", str(rig), "--limit", "box", "--svg", str(tmp_path / "box.svg"), "--json"]) == 0
    root = ET.fromstring((tmp_path / "box.svg").read_text().split("\n", 1)[1])
    assert "NV4" in words(root) and "simulated" in titles(root)[0]
    report = tmp_path / "report.html"
    code = main(["plan", str(rig), "--report", str(report), "--svg", str(tmp_path / "p.svg"), "--json"])
    assert code == 2  # `far` is unreachable
    html = report.read_text()
    assert 'id="host-box"' in html
    assert "far" in html and STATES["unreachable"].fill in html
    assert sorted(p.name for p in tmp_path.glob("p-*.svg")) == ["p-box.svg", "p-far.svg"]
    assert '"format_version"' in capsys.readouterr().out  # --json still printed beside the files
    old = tmp_path / "smoke.json"
    old.write_text('{"run_id": "r1", "groups": []}')
    report.unlink()
    assert main(["plan", str(rig), "--report", str(report), "--smoke", str(old)]) == 1  # before any host
    assert "reads format 1" in capsys.readouterr().err and not report.exists()
