"""Persistence mode: keep the driver loaded between jobs so each job does not pay GPU initialisation.

Managed through NVIDIA's persistence daemon, nvidia-persistenced: installed (Debian and RHEL ship it as a
package of its own; Ubuntu's driver packages carry it), enabled, so that every boot puts every GPU in
persistence mode, and running. NVML's legacy setting is lost at every boot; it is used only to correct GPUs
that differ while the daemon is already as it should be. The daemon is started only when the driver's
module is loaded; before the reboot that loads a new driver it is enabled and starts at boot.
Linux only, and only when the rig file asks for a value.
"""

from __future__ import annotations

from ... import protocol
from ...catalog import persistenced, sources
from ..change import Change, HostContext, Phase
from .driver import resolve

UNIT = protocol.PERSISTENCED_UNIT
_WORD = {True: "on", False: "off"}


def diff(ctx: HostContext) -> list[Change]:
    wanted = ctx.rig.gpus.persistence_mode
    if wanted is None or ctx.host.os != "linux":
        return []
    daemon = _daemon_change(ctx, wanted)
    if daemon is not None:
        return [daemon]
    return _legacy(ctx, wanted)


def _daemon_change(ctx: HostContext, wanted: bool) -> Change | None:
    daemon = ctx.facts.persistenced
    if daemon is None or daemon.service == "unknown":
        return None  # no systemd to ask: only NVML's setting can be managed
    driver = ctx.facts.driver
    start = driver.installed is not None and driver.loaded == driver.installed
    running = daemon.service == "active"
    # Enabled and active is not yet persistence: Ubuntu's unit runs the daemon with --no-persistence-mode.
    mode_off = wanted and daemon.exec_start is not None and not persistenced.persistence_on(daemon.exec_start)
    if wanted and daemon.enabled and (running or not start) and not mode_off:
        return None
    if not wanted and not daemon.enabled and not running:
        return None
    package, method = _package(ctx) if wanted and daemon.service == "absent" else (None, None)
    step = protocol.persistenced_step(wanted, start, package, method)
    state = f"{daemon.service}, {'enabled' if daemon.enabled else 'disabled'}"
    if not wanted:
        desired = "disabled and stopped"
    else:
        desired = "enabled and active" if start else "enabled (it starts at boot)"
    summary = f"persistence mode {_WORD[wanted]} through {UNIT}: {state} → {desired}"
    if mode_off:
        state = f"{state}, without {persistenced.ON}"
        desired = f"{desired}, {persistenced.ON} (drop-in)"
        summary = (
            f"persistence mode on through {UNIT}: its command line {daemon.exec_start!r} lacks "
            f"{persistenced.ON} (a drop-in adds it)"
        )
    # Installing the daemon is a package install of the driver set: it runs after the driver's own install
    # (same phase, later in plan order), so apt or dnf resolves its dependencies at the pinned version.
    phase: Phase = "driver" if daemon.service == "absent" else "persistence"
    return Change("persistence", "update", summary, state, desired, agent_step=step, phase=phase)


def _package(ctx: HostContext) -> tuple[str | None, str | None]:
    """Where the daemon is a package of its own, its name and the package manager that installs it."""
    want = ctx.rig.driver
    if want is None or want.method == "runfile":
        return None, None  # the runfile installs the daemon with the driver
    source = resolve(want, ctx.facts.host, ctx.rig.gpus.model)
    if source.name is None or source.name == "ubuntu":
        return None, None
    return sources.PERSISTENCED_PACKAGE, source.method


def _legacy(ctx: HostContext, wanted: bool) -> list[Change]:
    if not ctx.nvml_ok:
        return []
    wrong = [gpu.index for gpu in ctx.facts.gpus if gpu.persistence_mode is not wanted]
    if not wrong:
        return []
    listed = ", ".join(str(i) for i in wrong)
    return [
        Change(
            resource="persistence",
            action="update",
            summary=f"persistence mode {_WORD[not wanted]} → {_WORD[wanted]} (GPU {listed})",
            current=_WORD[not wanted],
            desired=_WORD[wanted],
            agent_step=protocol.persistence_step(wrong, wanted),
            phase="persistence",
        )
    ]
