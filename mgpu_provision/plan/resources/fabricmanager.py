"""Fabric Manager on NVSwitch boxes: installed at exactly the driver's version, enabled and running.

Without it (or at another version: it refuses to start) the GPUs of an HGX/DGX box show PCIe instead of
NVLink and CUDA init can fail. With `driver.fabricmanager: true` apply owns it: it comes with a driver
install, and on a box whose driver is already right, Fabric Manager behind or missing is an update
(installed at the driver's version, held, its unit enabled, which NVIDIA's packages do not do) and a stopped
or disabled service is enabled and started. The service is only started when the driver's module is loaded;
before the reboot that loads it, it is enabled to start at boot. Without the flag the same findings are
failed checks for a person.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import protocol
from ...catalog import sources
from ...catalog.names import own_version
from ...judge import driver as judge
from ...rig.cards import nvlink5_hgx
from ..change import Change, HostContext, failed_checks
from .driver import debian_family, resolve, satisfies

if TYPE_CHECKING:
    from ...rig.models import Driver

UNIT = protocol.FABRICMANAGER_UNIT


def diff(ctx: HostContext) -> list[Change]:
    facts, want = ctx.facts, ctx.rig.driver
    if not ctx.expect.fabricmanager:  # an NVSwitch rig, or one whose driver comes with Fabric Manager
        return []
    driver = facts.driver.installed or facts.driver.version
    if want is not None and want.fabricmanager and ctx.host.os == "linux":
        if driver is None or not satisfies(driver, want):
            return []  # the driver step installs Fabric Manager with the driver, at its version
        return _converge(ctx, want, driver)
    return failed_checks(judge.fabricmanager(ctx.facts_json, ctx.expect))


def _converge(ctx: HostContext, want: Driver, driver: str) -> list[Change]:
    fm = ctx.facts.fabricmanager
    version = fm.version if fm else None
    start = ctx.facts.driver.loaded == driver
    judged = {finding.kind for finding in judge.fabricmanager(ctx.facts_json, ctx.expect)}
    if judged & {"missing", "version"}:
        source = resolve(want, ctx.facts.host, ctx.rig.gpus.model)
        if source.name is None or source.problem:
            why = source.problem or "no package source"
            summary = f"Fabric Manager {version or 'missing'} → {driver}: {why}"
            return [Change("fabricmanager", "manual", summary, version, driver, phase="driver")]
        packages = package_set(
            source.name, source.method, driver, nvlink5_hgx(ctx.rig.gpus.model), debian_family(ctx.facts.host)
        )
        step = protocol.fabricmanager_step(driver, source.name, source.method, packages, want.hold, start)
        if version is None:
            summary = f"install Fabric Manager {driver} (the driver's version)"
            return [Change("fabricmanager", "create", summary, None, driver, agent_step=step, phase="driver")]
        summary = f"Fabric Manager {version} → {driver} (it starts only at the driver's version)"
        return [Change("fabricmanager", "update", summary, version, driver, agent_step=step, phase="driver")]
    assert fm is not None
    if fm.enabled is not False and ("service" not in judged or not start):
        return []
    state = fm.service + (", disabled" if fm.enabled is False else "")
    wanted = "enabled and active" if start else "enabled (it starts at boot)"
    step = protocol.service_step(UNIT, True, start)
    summary = f"the {UNIT} service: {state} → {wanted}"
    return [Change("fabricmanager", "update", summary, state, wanted, agent_step=step, phase="driver")]


def package_set(
    source: str, method: str, version: str, nvlink5: bool = False, debian: bool = False
) -> protocol.PackageSet:
    """Fabric Manager and NSCQ at the driver's branch (with NVSDM, NVLink Subnet Manager and its tools on
    NVLink5 boards): apt's set from `source`, or the RPM names (zypper locks each of them; dnf and yum lock
    by version)."""
    branch = protocol.branch_of(version)
    names = sources.fabricmanager_packages(source, branch, method, nvlink5)
    if method != "apt":
        locked = [name for name in names if not own_version(name)] if method == "zypper" else []
        return protocol.PackageSet([], names, locked)
    return sources.apt_set(source, branch, "default", False, names, debian_family=debian)
