"""SLI mode: an X config snippet on Linux, a manual Control Panel step on Windows.

SLI only affects X/OpenGL rendering (CUDA, NCCL and PyTorch use NVLink whatever it says), and NVIDIA drivers
since 455 accept only "Off" and "Mosaic" (the rig-file rules refuse the rest; the model spells them as
nvidia-xconfig does). Linux boxes get the snippet `envfiles.desired_files` renders at `files.xorg_conf`;
Windows has no documented command-line switch, so a Windows box gets a `manual` change naming the Control
Panel steps.
"""

from __future__ import annotations

from ...spec.models import Host, Rig
from ..change import Change, HostContext

# NVIDIA Control Panel -> 3D Settings -> "Set SLI and PhysX configuration": the choice for each mode.
_WINDOWS_CHOICE = {"Off": "Disable SLI", "Mosaic": "Span display with Surround"}


def desired_mode(host: Host, rig: Rig) -> str | None:
    """The mode the X config snippet must set, or None when no snippet is managed (no `sli`, or Windows)."""
    if rig.sli is None or host.os == "windows":
        return None
    return rig.sli.mode


def diff(ctx: HostContext) -> list[Change]:
    """Windows boxes: a manual step unless the reported mode already matches (apply cannot set it there)."""
    if ctx.rig.sli is None or ctx.host.os != "windows":
        return []
    mode = ctx.rig.sli.mode
    current = ctx.facts.sli.mode
    if current is not None and current.lower() == mode.lower():
        return []
    where = 'NVIDIA Control Panel > 3D Settings > "Set SLI and PhysX configuration"'
    summary = f'set SLI to {mode} by hand: {where} > "{_WINDOWS_CHOICE[mode]}"'
    return [Change("sli", "manual", summary, current, mode, phase="sli")]
