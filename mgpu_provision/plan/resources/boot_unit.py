"""The systemd unit that sets compute mode and power limit at every boot, and whether it is enabled.

apply sets both through NVML, which forgets them when the driver unloads: after a reboot the box would run
with the defaults until someone applies again. So where the rig asks for a compute mode other than `default`
or for a power limit, apply also writes `<files.systemd_dir>/mgpu-provision-gpu-settings.service` (a
oneshot running `nvidia-smi -c` / `-pl` on every GPU) and enables it; when the rig stops asking, the unit is
disabled and removed, so the box goes back to the driver's defaults at its next boot. The plan shows the
file as a file change and the enablement as a `service:` change, after the NVML steps of the same phase.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from ... import protocol
from ..change import Change, HostContext, Phase
from ..files import DesiredFile, diff_files, diff_unwanted, node_path, render

if TYPE_CHECKING:
    from ...rig import LoadedRig
    from ...rig.models import Host, Rig

UNIT = protocol.GPU_SETTINGS_UNIT
PHASE: Phase = "persistence"  # with the NVML steps that set the same values now
# nvidia-smi's spelling of the rig's compute modes (`nvidia-smi -c` takes the name or its number).
COMPUTE_MODE_ARGS = {"exclusive_process": "EXCLUSIVE_PROCESS", "prohibited": "PROHIBITED"}


def paths(loaded: LoadedRig, host: Host) -> list[str]:
    """Where the unit goes on `host`, read even when unwanted (one may be left over); none where no unit is
    managed (Windows, `files.systemd_dir: null`)."""
    folder = loaded.spec.files.systemd_dir
    if host.os != "linux" or folder is None:
        return []
    return [node_path(loaded, host, posixpath.join(folder, UNIT + ".service"))]


def units(loaded: LoadedRig, host: Host) -> list[str]:
    """The unit whose state the facts must report, where it is managed."""
    return [UNIT] if paths(loaded, host) else []


def settings(rig: Rig) -> list[tuple[str, str]]:
    """(nvidia-smi's arguments, the setting in words) for each setting the rig manages; none: no unit.

    No `-i`: the rig's values hold for every GPU of the box, and a GPU replaced or renumbered must not
    leave the unit naming one that is gone (nvidia-smi without `-i` sets each GPU it finds)."""
    health = rig.health
    wanted = []
    if health.checks("compute_mode") and health.compute_mode in COMPUTE_MODE_ARGS:
        mode = health.compute_mode
        wanted.append((f"-c {COMPUTE_MODE_ARGS[mode]}", f"compute mode {mode}"))
    if health.checks("power") and isinstance(health.power_limit_w, int):  # `default` is what a boot gives
        watts = health.power_limit_w
        wanted.append((f"-pl {watts}", f"power limit {watts} W"))
    return wanted


def desired(ctx: HostContext) -> list[DesiredFile]:
    """The unit as the rig wants it on the host; none when the rig asks for no setting or manages no unit."""
    wanted = [arguments for arguments, _ in settings(ctx.rig)]
    if not wanted:
        return []
    content = render(
        "gpu-settings.service.j2", rig_name=ctx.host.rig, host_name=ctx.host.name, commands=wanted
    )
    return [DesiredFile(path, content, "0644", PHASE) for path in paths(ctx.loaded, ctx.host)]


def diff(ctx: HostContext) -> list[Change]:
    """Write and enable the unit where wanted; disable, then remove it where the rig no longer asks."""
    unit = ctx.facts.units.get(UNIT)
    managed = paths(ctx.loaded, ctx.host)
    if not managed or (unit is not None and unit.service == "unknown"):
        return []  # no systemd on the box (a container, another init): nothing would run the unit at boot
    enabled = bool(unit and unit.enabled)
    state = "not reported" if unit is None else f"{unit.service}, {'enabled' if enabled else 'disabled'}"
    wanted = desired(ctx)
    if wanted:
        changes = diff_files(wanted, ctx.facts)
        if not enabled:
            named = ", ".join(words for _, words in settings(ctx.rig))
            # Enabled, not started: NVML holds the values already (the NVML steps run first) until the boot.
            changes.append(_service(f"enable {UNIT}: it sets {named} at every boot", state, True))
        return changes
    # Disabled first: systemctl finds the unit's links through its file.
    changes = []
    if enabled:
        changes.append(_service(f"disable {UNIT}: the rig sets no compute mode or power limit", state, False))
    why = "the rig sets no compute mode or power limit; the driver's defaults hold after the next boot"
    return changes + diff_unwanted(managed, ctx.facts, why, PHASE)


def _service(summary: str, state: str, enable: bool) -> Change:
    desired = "enabled" if enable else "disabled"
    step = protocol.service_step(UNIT, enable, False)
    return Change(f"service:{UNIT}", "update", summary, state, desired, agent_step=step, phase=PHASE)
