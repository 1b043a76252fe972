"""The driver's internal mirror (`driver.repo`): what the agent is told about it, and what plan says when
the set does not resolve from it.

The agent checks a mirror in facts, with a simulated install against the mirror alone (node/packages/
mirror.py), before plan shows any change: a mirror that lacks a package of the set, or is signed with
another key than the one the rig gives, is a failed check naming the package or the key, and apply would
refuse the install before changing anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...catalog import sources
from ..change import Change, HostContext, check_failed
from .driver import branch_of_rig

if TYPE_CHECKING:
    from ...rig import LoadedRig
    from ...rig.models import Host


def repo_of(loaded: LoadedRig, host: Host) -> dict[str, str] | None:
    """The mirror as the agent takes it (the key file's text read here, relative to the rig file)."""
    driver = loaded.rig_of(host).driver
    if driver is None or driver.repo is None:
        return None
    key = loaded.resolve(driver.repo.key).read_text()  # validate made sure it reads
    repo = {"url": driver.repo.url, "key": key, "suite": driver.repo.suite}
    if driver.repo.components:
        repo["components"] = driver.repo.components
    return repo


def packages_of(loaded: LoadedRig, host: Host) -> list[str]:
    """The set facts simulate from the mirror: the rig's own `packages`, or the named source's set (a
    source from os-release is known only after facts: then apply checks it before installing)."""
    rig = loaded.rig_of(host)
    driver = rig.driver
    if driver is None or driver.repo is None:
        return []
    if driver.packages:
        return list(driver.packages)
    if driver.source is None or driver.source == "rhel" or driver.method in ("dnf", "yum", "zypper"):
        return []  # an RPM mirror is read by apply right after it is written (node/packages/rpmrepo.py)
    branch = branch_of_rig(driver)
    flavor = driver.flavor or sources.default_flavor(driver.source, rig.gpus.model, branch)
    return sources.apt_set(driver.source, branch, flavor, driver.fabricmanager).install


def diff(ctx: HostContext) -> list[Change]:
    found = ctx.facts.driver_mirror
    driver = ctx.rig.driver
    if found is None or driver is None or driver.repo is None:
        return []
    if found.error:
        return [check_failed("driver", f"driver.repo: {found.error}", "unusable", driver.repo.url)]
    if found.missing:
        summary = (
            f"mirror {driver.repo.url} lacks {', '.join(found.missing)}: the driver's set does not resolve "
            "from it (apply would refuse before changing anything)"
        )
        return [check_failed("driver", summary, "incomplete", "complete")]
    return []
