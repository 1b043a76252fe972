"""Fabric Manager on NVSwitch boxes: installed at exactly the driver's version, and its service active.

Without it (or at another version: it refuses to start) the GPUs of an HGX/DGX box show PCIe instead of NVLink
and CUDA init can fail. Apply installs it together with the driver (the driver step's `fabricmanager` flag),
so a mismatch on an otherwise right driver is reported as a failed check for a person to look at.
"""

from __future__ import annotations

from ..change import Change, HostContext, check_failed


def diff(ctx: HostContext) -> list[Change]:
    rig, facts = ctx.rig, ctx.facts
    wanted = rig.bridge.kind == "nvswitch" or (rig.driver is not None and rig.driver.fabricmanager)
    if not wanted:
        return []
    driver = facts.driver.installed or facts.driver.version
    fm = facts.fabricmanager
    if fm is None or fm.version is None:
        return [
            check_failed(
                "fabricmanager",
                "Fabric Manager is not installed; NVSwitch boxes need it at the driver's version "
                f"({driver or 'unknown'})",
                current=None,
                desired=driver,
            )
        ]
    changes: list[Change] = []
    if driver is not None and fm.version != driver:
        changes.append(
            check_failed(
                "fabricmanager",
                f"Fabric Manager {fm.version} does not match driver {driver} "
                "(it starts only at the same version)",
                current=fm.version,
                desired=driver,
            )
        )
    if fm.service != "active":
        changes.append(
            check_failed(
                "fabricmanager",
                f"the nvidia-fabricmanager service is {fm.service}, it must be active",
                current=fm.service,
                desired="active",
            )
        )
    return changes
