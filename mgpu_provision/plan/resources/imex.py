"""nvidia-imex on GB200/GB300 NVL72 compute trays (`driver.imex: true`): the package at exactly the driver's
version, its unit enabled and running, and an IMEX channel for processes to use.

Multi-node NVLink shares GPU memory across the trays of one NVLink domain through the IMEX daemon, which,
like Fabric Manager, runs only at the loaded driver's exact version. apply installs it (NVIDIA's
repository: `nvidia-imex` from 580, `nvidia-imex-<branch>` from 550) and enables its unit; a missing channel
is a check for a person (channel 0 is created when the nvidia module loads with NVreg_CreateImexChannel0=1).
"""

from __future__ import annotations

from ... import protocol
from ...catalog import names, sources
from ..change import Action, Change, HostContext, check_failed
from .driver import debian_family, resolve, satisfies

UNIT = "nvidia-imex"


def diff(ctx: HostContext) -> list[Change]:
    want = ctx.rig.driver
    if want is None or not want.imex or ctx.host.os != "linux":
        return []
    driver = ctx.facts.driver.installed or ctx.facts.driver.version
    if driver is None or not satisfies(driver, want):
        return []  # the driver first; IMEX follows at its version
    imex = ctx.facts.imex
    start = ctx.facts.driver.loaded == driver
    version = imex.version if imex else None
    if version != driver:
        return [_install(ctx, version, driver, want.hold, start)]
    assert imex is not None
    changes = []
    if imex.enabled is False or (start and imex.service != "active"):
        state = imex.service + (", disabled" if imex.enabled is False else "")
        wanted = "enabled and active" if start else "enabled (it starts at boot)"
        step = protocol.service_step(UNIT, True, start)
        summary = f"the {UNIT} service: {state} → {wanted}"
        changes.append(Change("imex", "update", summary, state, wanted, agent_step=step, phase="driver"))
    if start and imex.channels == 0:
        summary = (
            "no IMEX channel (/dev/nvidia-caps-imex-channels/channel0): load the nvidia module with "
            "NVreg_CreateImexChannel0=1 so that multi-node NVLink jobs can share memory"
        )
        changes.append(check_failed("imex", summary, "0 channels", "1 channel"))
    return changes


def _install(ctx: HostContext, version: str | None, driver: str, hold: bool, start: bool) -> Change:
    source = resolve(ctx.rig.driver, ctx.facts.host, ctx.rig.gpus.model) if ctx.rig.driver else None
    branch = protocol.branch_of(driver)
    package = (
        names.component(source.name, source.method, int(branch), "imex") if source and source.name else None
    )
    if source is None or source.name is None or source.problem or package is None:
        why = (source.problem if source else None) or "no nvidia-imex package in this source: use source cuda"
        return Change("imex", "manual", f"{UNIT} {version or 'missing'} → {driver}: {why}", version, driver)
    packages = protocol.PackageSet([], [package], [])
    if source.method == "apt":
        debian = debian_family(ctx.facts.host)
        packages = sources.apt_set(source.name, branch, "default", False, [package], debian_family=debian)
    step = protocol.fabricmanager_step(driver, source.name, source.method, packages, hold, start, unit=UNIT)
    action: Action = "create" if version is None else "update"
    summary = (
        f"install {UNIT} {driver} (the driver's version)"
        if version is None
        else (f"{UNIT} {version} → {driver} (it starts only at the driver's version)")
    )
    return Change("imex", action, summary, version, driver, agent_step=step, phase="driver")
