"""SLI mode: an X config snippet on Linux, a manual Control Panel step on Windows.

SLI only affects X/OpenGL rendering (CUDA, NCCL and PyTorch use NVLink whatever it says). The snippet
`desired` renders at `files.xorg_conf` names every GPU of the box by its bus id (X reads BusID
in decimal, `PCI:bus@domain:device:function`) and carries exactly one option: `"SLI" "Mosaic"` (SLI Mosaic,
professional cards) or `"BaseMosaic" "on"`; the two together stop X. `Off` is the driver default, so it
writes nothing and removes a snippet left by an earlier mode. A ServerLayout elsewhere in the X config makes X
ignore the snippet's Screen, which plan shows as a manual step. Windows has no documented command-line switch,
so a Windows box gets a `manual` change naming the Control Panel page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ProvisionError
from ...facts import Facts
from ..change import Change, HostContext, check_failed
from ..files import DesiredFile, diff_files, diff_unwanted, node_path, render

if TYPE_CHECKING:
    from ...rig import LoadedRig
    from ...rig.models import Host, Rig

SCREEN = "mgpu-provision-screen"
_PANEL = {
    "Off": '3D Settings > Configure SLI, Surround, PhysX > "Disable SLI"',
    "Mosaic": "Workstation > Set up Mosaic",
    "BaseMosaic": '3D Settings > Configure SLI, Surround, PhysX > "Span displays with Surround"',
}


def desired_mode(host: Host, rig: Rig) -> str | None:
    """The mode the X config snippet must set, or None when no snippet is wanted (no `sli`, Off, Windows)."""
    if rig.sli is None or host.os == "windows" or rig.sli.mode == "Off":
        return None
    return rig.sli.mode


def x_bus_id(pci_bus_id: str) -> str:
    """NVML's `00000000:41:00.0` (hex) as X's `PCI:65:0:0` (decimal; `@domain` only for a non-zero domain)."""
    try:
        domain_hex, bus_hex, slot = pci_bus_id.split(":")
        device_hex, function_hex = slot.split(".")
        domain, bus, device, function = (int(h, 16) for h in (domain_hex, bus_hex, device_hex, function_hex))
    except ValueError:
        raise ProvisionError(
            f"GPU bus id {pci_bus_id!r} is not domain:bus:device.function; cannot name it in the X config"
        ) from None
    return f"PCI:{bus}{f'@{domain}' if domain else ''}:{device}:{function}"


def snippet_context(host: Host, rig: Rig, facts: Facts) -> dict[str, Any] | None:
    """What the X config template needs, or None when no snippet is written (no mode, no GPUs to name)."""
    mode = desired_mode(host, rig)
    if mode is None or not facts.gpus:
        return None
    devices = [{"index": gpu.index, "bus_id": x_bus_id(gpu.pci_bus_id)} for gpu in facts.gpus]
    return {"mode": mode, "devices": devices, "screen": SCREEN}


def paths(loaded: LoadedRig, host: Host) -> list[str]:
    """The X config snippet's path on `host`, where the rig has an `sli` section (Windows: a manual step)."""
    path = loaded.spec.files.xorg_conf
    if not path or host.os == "windows" or loaded.rig_of(host).sli is None:
        return []
    return [node_path(loaded, host, path)]


def desired(ctx: HostContext) -> list[DesiredFile]:
    """The snippet as the rig wants it, for the GPUs the facts name; none under Off or without GPUs."""
    context = snippet_context(ctx.host, ctx.rig, ctx.facts)
    names = {"rig_name": ctx.host.rig, "host_name": ctx.host.name}
    content = None if context is None else render("xorg-sli.conf.j2", **context, **names)
    return [DesiredFile(path, content, "0644", "sli") for path in paths(ctx.loaded, ctx.host) if content]


def diff_snippet(ctx: HostContext) -> list[Change]:
    """The snippet written where it differs; removed under SLI Off, the driver default."""
    off = ctx.rig.sli is not None and ctx.rig.sli.mode == "Off"
    unwanted = paths(ctx.loaded, ctx.host) if off else []
    changes = diff_files(desired(ctx), ctx.facts)
    return changes + diff_unwanted(unwanted, ctx.facts, "SLI Off is the driver default", "sli")


def diff(ctx: HostContext) -> list[Change]:
    """Windows: a manual Control Panel step. Linux: why the snippet cannot be written or X would ignore it."""
    if ctx.rig.sli is None:
        return []
    if ctx.host.os == "windows":
        return _windows(ctx.rig.sli.mode, ctx.facts.sli.mode)
    mode = desired_mode(ctx.host, ctx.rig)
    if mode is None:
        return []
    if not ctx.facts.gpus:
        return [check_failed("sli", f"cannot write the X config for SLI {mode}: no GPU bus ids to name")]
    return [
        Change(
            "sli",
            "manual",
            f'X uses the ServerLayout in {layout.file}, which does not list Screen "{SCREEN}": add it to '
            f"that layout (or remove the layout) for SLI {mode} to take effect",
            ", ".join(layout.screens) or "no screens",
            SCREEN,
            phase="sli",
        )
        for layout in ctx.facts.xorg_layouts
        if SCREEN not in layout.screens
    ]


def _windows(mode: str, current: str | None) -> list[Change]:
    """A manual step unless the reported mode already matches (apply cannot set it there)."""
    if current is not None and current.lower() == mode.lower():
        return []
    summary = f"set SLI to {mode} by hand in the NVIDIA Control Panel: {_PANEL[mode]}"
    return [Change("sli", "manual", summary, current, mode, phase="sli")]
