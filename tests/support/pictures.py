"""The boxes and fleets the picture tests and the picture benchmark draw: facts built from the topology
fixtures and example twins, planned by the real `plan_host` against a rig file written here."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import yaml

from mgpu_provision.catalog.topology import parse_topology
from mgpu_provision.facts import Facts, ManagedFile
from mgpu_provision.jobs.plan import FleetPlan, HostPlan
from mgpu_provision.plan.expectation import captured_cells
from mgpu_provision.plan.host import plan_host
from mgpu_provision.rig.loader import load_rig
from mgpu_provision.rig.models import Host
from mgpu_provision.rig.rig import LoadedRig
from tests.support.factories import DRIVER_OK, HOST_INFO, TOPOLOGIES, box_facts, facts_from_twin

REPO = Path(__file__).resolve().parents[2]
TWINS = REPO / "examples" / "twins"

RIGS: dict[str, Any] = {
    "rtx3090-pair": {
        "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
        "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
    },
    "a100-hgx": {
        "gpus": {"model": "NVIDIA A100-SXM4-80GB", "count": 8},
        "bridge": {"kind": "nvswitch", "links": 12},
    },
}


def bridge_facts(down: list[dict[str, int]] | None = None, **health: Any) -> Facts:
    """Two RTX 3090s on a 4-link bridge (tests/fixtures/topologies/2x-rtx3090-nvlink-bridge.txt)."""
    box = {"topology": "2x-rtx3090-nvlink-bridge.txt", "model": "NVIDIA GeForce RTX 3090", "down": down or []}
    document = {"agent_version": "0.1.0", "host": dict(HOST_INFO), **box_facts(box), **health}
    document["driver"] = dict(DRIVER_OK)
    return Facts.model_validate(document)


def nvswitch_facts(down: list[dict[str, int]] | None = None) -> Facts:
    """An 8x A100 NVSwitch board (tests/fixtures/topologies/8x-a100-nvswitch.txt)."""
    box = {"topology": "8x-a100-nvswitch.txt", "model": "NVIDIA A100-SXM4-80GB", "nvswitch": True,
           "down": down or []}
    fabricmanager = {"version": DRIVER_OK["version"], "service": "active", "enabled": True}
    return Facts.model_validate(
        {"agent_version": "0.1.0", "host": dict(HOST_INFO), **box_facts(box), "fabricmanager": fabricmanager}
    )


def dgx1_facts(down: list[dict[str, int]]) -> tuple[Facts, tuple[tuple[str, ...], ...]]:
    """A DGX-1's hybrid cube mesh of 8 V100s (NV1 and NV2 pairs), and the captured matrix its rig holds."""
    topology = "dgx1-v100-hybrid-cube-mesh.txt"
    box = {"topology": topology, "model": "Tesla V100-SXM2-16GB", "down": down}
    facts = Facts.model_validate({"agent_version": "0.1.0", "host": dict(HOST_INFO), **box_facts(box)})
    return facts, captured_cells(parse_topology((TOPOLOGIES / topology).read_text()))


def gb200_facts() -> Facts:
    """The example GB200 compute tray twin, read by the agent's own facts verb."""
    return facts_from_twin(TWINS / "gb200-tray.yaml")


def fleet_rig(folder: Path, hosts: int, h100: int = 0) -> LoadedRig:
    """A rig of `hosts` bridged RTX 3090 pairs (gpu-0001...) and `h100` NVSwitch boards (hgx-01...)."""
    spec = {
        "version": 1,
        "hosts": [{"name": f"gpu-{k:04d}", "rig": "rtx3090-pair"} for k in range(1, hosts + 1)]
        + [{"name": f"hgx-{k:02d}", "rig": "a100-hgx"} for k in range(1, h100 + 1)],
        "rigs": {name: rig for name, rig in RIGS.items() if name == "rtx3090-pair" or h100},
    }
    path = folder / "rig.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_rig(path)


def applied(loaded: LoadedRig, host: Host, facts: Facts) -> Facts:
    """`facts` with the managed files apply would write already in place (a box apply has run on)."""
    files = [
        ManagedFile(path=step["path"], exists=True, mode=step["mode"],
                    sha256=hashlib.sha256(step["content"].encode()).hexdigest(), content=step["content"])
        for change in plan_host(loaded, host, facts)
        if (step := change.agent_step) is not None and step.get("kind") == "file"
    ]
    return facts.model_copy(update={"files": [*facts.files, *files]})


def fleet_plan(loaded: LoadedRig, odd: dict[str, Facts | str], plan_healthy: bool = True) -> FleetPlan:
    """Every host planned from a healthy box of its rig type, but `odd` ones: their facts, or (a string)
    the reason they were unreachable. Without `plan_healthy` the healthy hosts are given the empty plan
    the real planner gives them (the 12-host fleet checks that), so that 2,000 hosts take no minute."""
    healthy = {"rtx3090-pair": bridge_facts(), "a100-hgx": nvswitch_facts()}
    plans = []
    for host in loaded.spec.hosts:
        given = odd.get(host.name, healthy[host.rig])
        if not plan_healthy and host.name not in odd:
            plans.append(HostPlan(host.name, "ok", (), simulated=False, facts=given))
            continue
        if isinstance(given, str):
            plans.append(HostPlan(host.name, "unreachable", error=given))
            continue
        changes = tuple(plan_host(loaded, host, applied(loaded, host, given)))
        plans.append(HostPlan(host.name, "ok", changes, simulated=False, facts=given))
    return FleetPlan(tuple(plans))


# --- looking at the pictures -------------------------------------------------------------------------

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,900", "--enable-logging=stderr", "--v=0",
)


def png_pixels(path: Path) -> tuple[int, int, list[tuple[int, ...]]]:
    """Width, height and RGB(A) pixels of an 8-bit RGB or RGBA PNG (what rsvg-convert and Chromium write),
    decoded with zlib: no imaging library needed."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), f"{path}: bit depth {depth}, colour type {colour}"
    step = 4 if colour == 6 else 3
    raw = zlib.decompress(b"".join(chunks))
    stride = width * step
    previous = bytearray(stride)
    pixels: list[tuple[int, ...]] = []
    for row in range(height):
        kind = raw[row * (stride + 1)]
        line = bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up = previous[i]
            corner = previous[i - step] if i >= step else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        pixels += [tuple(line[i:i + step]) for i in range(0, stride, step)]
        previous = line
    return width, height, pixels


def is_red(pixel: tuple[int, ...]) -> bool:
    """The fail colour (#d32f2f) and its antialiased edges; no other state's colour comes near it."""
    return pixel[0] >= 190 and pixel[1] <= 80 and pixel[2] <= 80 and (len(pixel) < 4 or pixel[3] >= 128)


def rsvg_png(svg: Path) -> Path:
    png = svg.with_suffix(".png")
    subprocess.run(["rsvg-convert", str(svg), "-o", str(png)], check=True, timeout=60)
    return png


def chromium_screenshot(page: Path, png: Path, profile: Path) -> str:
    """Open `page` in headless Chromium (a fresh, empty profile) and screenshot it; returns its log."""
    done = subprocess.run(
        ["/usr/bin/chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
         page.absolute().as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def console_errors(log: str) -> list[str]:
    """The page's console messages and failed loads in Chromium's log (`:CONSOLE(`, `net::ERR_`)."""
    return [line for line in log.splitlines() if ":CONSOLE" in line or "net::ERR_" in line]
