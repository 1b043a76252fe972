"""The NVIDIA driver: installed at the rig's exact version or branch, and loaded (which may take a reboot).

A new driver only takes effect once its kernel module is loaded, so every install comes with a reboot Change:
with `reboot: allowed` apply carries it out (resource "reboot", phase "reboot", carried out by the agent's
`reboot` verb rather than `apply`); with `reboot: never` it is a manual step saying so.
A box where the right driver is installed but another module runs, or none at all (nouveau bound, a refused
reboot), gets the same reboot Change alone.
"""

from __future__ import annotations

from ... import protocol
from ...spec.models import Driver
from ..change import Action, Change, HostContext


def diff(ctx: HostContext) -> list[Change]:
    want = ctx.rig.driver
    if want is None:
        return []
    info = ctx.facts.driver
    installed = info.installed or info.version
    desired = want.version or f"{want.branch}.x"
    if not _satisfies(installed, want):
        install = _install(ctx, want, installed, desired)
        if install.action == "manual":
            return [install]
        return [install, _reboot(want, desired, loaded=info.loaded)]
    # Installed with nothing loaded (nouveau bound, a refused reboot) is as pending as another version loaded.
    if info.reboot_required or info.loaded != installed:
        return [_reboot(want, str(installed), loaded=info.loaded, installed=installed)]
    return []


def _satisfies(installed: str | None, want: Driver) -> bool:
    if installed is None:
        return False
    if want.version is not None:
        return installed == want.version
    return installed.split(".")[0] == want.branch


def _install(ctx: HostContext, want: Driver, installed: str | None, desired: str) -> Change:
    summary = f"driver {installed} → {desired}" if installed else f"install driver {desired}"
    action: Action = "update" if installed else "create"
    if ctx.host.os != "linux":
        summary = f"{summary} (by hand on {ctx.host.os})"
        return Change("driver", "manual", summary, installed, desired, reboot=True, phase="driver")
    target = {"version": want.version} if want.version else {"branch": str(want.branch)}
    runfile = {"runfile": want.runfile_url, "sha256": want.runfile_sha256} if want.method == "runfile" else {}
    step = protocol.driver_step(
        want.method,
        target,
        flavor=want.flavor,
        hold=want.hold,
        fabricmanager=want.fabricmanager,
        **runfile,
    )
    return Change("driver", action, summary, installed, desired, reboot=True, agent_step=step, phase="driver")


def _reboot(want: Driver, version: str, loaded: str | None, installed: str | None = None) -> Change:
    if want.reboot == "never":
        if installed == version and loaded is None:
            summary = f"installed {version}, no kernel module loaded: reboot required (policy: never)"
        else:
            summary = f"reboot required to load driver {version} (policy: never)"
        return Change(
            "reboot",
            "manual",
            summary,
            loaded,
            version,
            reboot=True,
            phase="reboot",
        )
    return Change(
        "reboot",
        "update",
        f"reboot to load driver {version} (running: {loaded or 'none'})",
        loaded,
        version,
        reboot=True,
        agent_step=protocol.reboot_step(),
        phase="reboot",
    )
