"""nvidia-imex on GB200/GB300 NVL72 compute trays (`driver.imex`): the package at exactly the driver's
version, its unit enabled and running, an IMEX channel for processes to use, and the domain it forms.

Multi-node NVLink shares GPU memory across the trays of one NVLink domain through the IMEX daemon, which,
like Fabric Manager, runs only at the loaded driver's exact version. apply installs it (NVIDIA's
repository: `nvidia-imex` from 580, `nvidia-imex-<branch>` from 550) and enables its unit; a missing channel
is a check for a person (channel 0 is created when the nvidia module loads with NVreg_CreateImexChannel0=1).
No domain forms without peers: the daemon reads `nodes_config.cfg` (one IP address a line, the same list on
every node: NVIDIA's IMEX guide, "Deployment Models") only when it starts, so apply writes it as a managed
file and restarts the daemon when it changes; `peers: per_job` leaves it to the Slurm prolog. Once the
daemon runs, the domain's state (`nvidia-imex-ctl -N -j`) is judged: anything but UP is a failed check.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ... import protocol
from ...catalog import names, sources
from ...judge import driver as judge
from ...rig.plain import imex_domain
from ..change import Action, Change, HostContext, check_failed, failed_checks
from ..files import DesiredFile, diff_files, node_path
from .driver import debian_family, resolve, satisfies

if TYPE_CHECKING:
    from ...rig import LoadedRig
    from ...rig.models import Host, ImexDomain

UNIT = "nvidia-imex"


def _driver(ctx: HostContext) -> str | None:
    """The installed driver when it is the rig's and the rig asks for IMEX: nvidia-imex is there, or this
    apply installs it; None while the driver comes first (IMEX follows at its version)."""
    want = ctx.rig.driver
    if want is None or not want.imex or ctx.host.os != "linux":
        return None
    driver = ctx.facts.driver.installed or ctx.facts.driver.version
    return driver if driver is not None and satisfies(driver, want) else None


def diff(ctx: HostContext) -> list[Change]:
    want, driver = ctx.rig.driver, _driver(ctx)
    if want is None or driver is None:
        return []
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
    if start and imex.service == "active" and not _config_changes(ctx):
        # A nodes_config.cfg about to be written restarts the daemon: its domain is judged after that.
        changes += failed_checks(judge.imex(ctx.facts_json, ctx.expect))
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


def _domain(loaded: LoadedRig, host: Host) -> ImexDomain | None:
    """The domain whose nodes_config.cfg apply writes on `host`; None without IMEX or with `per_job`."""
    driver = loaded.rig_of(host).driver
    domain = imex_domain(driver, loaded.defaults.imex_domain) if host.os == "linux" else None
    return None if domain is None or domain.peers == "per_job" else domain


def paths(loaded: LoadedRig, host: Host) -> list[str]:
    domain = _domain(loaded, host)
    return [] if domain is None else [node_path(loaded, host, domain.nodes_config)]


def peers(loaded: LoadedRig, host: Host) -> list[str]:
    """The domain's addresses: the rig's list, or with `fleet` every host of this host's rig type."""
    domain = _domain(loaded, host)
    if domain is None:
        return []
    if domain.peers == "fleet":
        return [other.target for other in loaded.spec.hosts if other.rig == host.rig]
    return list(domain.peers)


def desired(ctx: HostContext) -> list[DesiredFile]:
    """nodes_config.cfg: one IP address a line, as NVIDIA's IMEX guide writes it. Written once nvidia-imex is
    there or comes in the same apply (after its install step), over the package's own file: a conffile found
    on disk before its package makes dpkg ask what to keep, and apt runs here without a terminal."""
    if _driver(ctx) is None:
        return []
    content = "".join(f"{address}\n" for address in peers(ctx.loaded, ctx.host))
    return [DesiredFile(path, content, "0644", "driver") for path in paths(ctx.loaded, ctx.host)]


def _config_changes(ctx: HostContext) -> list[Change]:
    return diff_files(desired(ctx), ctx.facts)


def diff_config(ctx: HostContext) -> list[Change]:
    """nodes_config.cfg, and the daemon's restart when it changes while the driver it runs on is loaded (it
    reads the file only at start, and this apply's install may have just started it with the package's
    file); a daemon that starts later, at the boot that loads the driver, reads the new one."""
    written = _config_changes(ctx)
    if not written or ctx.facts.driver.loaded != _driver(ctx):
        return written
    state = ctx.facts.imex.service if ctx.facts.imex is not None else "absent"
    restart = Change(
        "imex",
        "update",
        f"restart {UNIT}: it reads {written[0].resource.removeprefix('file:')} only when it starts",
        state,
        "restarted",
        agent_step=protocol.service_step(UNIT, True, True, restart=True),
        phase="driver",
    )
    return [*written, restart]
