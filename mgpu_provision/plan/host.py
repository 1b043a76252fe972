"""The plan: what differs between the rig file and each box, as a list of Changes, decided without I/O.

One lane: every resource is a `diff(ctx)` in `DIFFS`, over the one `HostContext` of a host. The resources
that write files on a node are also entries in `FILES` (their paths and desired files): `facts_request`
asks the agent to describe those paths, the plan diffs their files, and the node check's expectations hold
the digests of the checked ones. `plan_host` lists the Changes in playbook-step order (checks first, a
reboot last so that it follows everything it must load): the order apply carries them out in, so plan
and apply show one order.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import protocol
from ..facts import Facts
from ..judge.records import Expectation
from .change import PHASES, Change, HostContext
from .files import DesiredFile, ManagedFiles, node_path
from .resources import (
    boot_unit,
    checks,
    containers,
    driver,
    envfiles,
    fabricmanager,
    gpu_settings,
    imex,
    mirror,
    node_check,
    persistence,
    sli,
    slurm,
)
from .resources import torch as torch_probe

if TYPE_CHECKING:
    from ..rig import LoadedRig
    from ..rig.models import Host

XORG_CONF = "/etc/X11/xorg.conf"

# Every resource that writes files on a node, in the order its Changes are listed within a playbook step.
# A new managed file is one entry: its paths, its desired files, and (only when writing the files is not
# all there is to it) its own diff.
FILES: tuple[ManagedFiles, ...] = (
    ManagedFiles(envfiles.paths, envfiles.desired),  # profile.d script, EnvironmentFile, launcher
    ManagedFiles(sli.paths, sli.desired, sli.diff_snippet),  # removed again under SLI Off
    # After the NVML steps of its phase, which set the values now; not checked: the unit runs at boot only.
    ManagedFiles(boot_unit.paths, boot_unit.desired, boot_unit.diff, checked=False),
    ManagedFiles(slurm.paths, slurm.desired, slurm.diff),  # with slurmd's restart and the controller checks
    ManagedFiles(imex.paths, imex.desired, imex.diff_config),  # nodes_config.cfg, nvidia-imex's restart
    # Last: the expectations it installs hold the digests of the files above (not its own).
    ManagedFiles(node_check.paths, node_check.desired, node_check.diff, checked=False),
)

# Checks before changes: a person reads what is wrong with the box before what apply would do about it.
DIFFS: tuple[Callable[[HostContext], list[Change]], ...] = (
    checks.gpus,
    checks.topology,
    checks.pcie,
    fabricmanager.diff,
    imex.diff,
    checks.health,
    checks.kernel,
    mirror.diff,
    torch_probe.diff,
    driver.diff,
    containers.diff,
    persistence.diff,
    gpu_settings.diff,
    sli.diff,
    envfiles.checks,
    *(files.changes for files in FILES),
)


def facts_request(loaded: LoadedRig, host: Host) -> dict[str, Any]:
    """The `facts` verb's args for this host: its managed files (with content, for diffs), its X config and,
    when the rig file names a smoke python, that python for the torch probe (importing torch takes seconds,
    and a rig that never said which python has torch would only get a failed probe of `python3`)."""
    smoke = loaded.spec.smoke
    rig = loaded.rig_of(host)
    xorg = sli.paths(loaded, host)
    return protocol.facts_request(
        files=[path for files in FILES for path in files.paths(loaded, host)],
        include_content=True,
        python=smoke.python if "python" in smoke.model_fields_set else None,
        xorg_paths=xorg,
        # A ServerLayout in the main X config or beside the snippet hides the snippet's Screen.
        xorg_layout_paths=[XORG_CONF, *(os.path.dirname(path) for path in xorg)]
        if sli.desired_mode(host, loaded.rig_of(host))
        else [],
        units=boot_unit.units(loaded, host) + node_check.units(loaded, host),
        driver_repo=mirror.repo_of(loaded, host),
        driver_packages=mirror.packages_of(loaded, host),
        nvidia_repository=driver.asks_nvidia_repository(rig, host),
        state_dir=node_path(loaded, host, loaded.spec.files.state_dir),
        slurm=loaded.rig_of(host).slurm is not None,
        containers=None if rig.containers is None else rig.containers.runtimes,
    )


def host_context(loaded: LoadedRig, host: Host, facts: Facts) -> HostContext:
    """The one input of every diff for `host`: with the driver mirror read and the digests of the managed
    files the node check holds the node to."""
    ctx = HostContext(loaded, host, facts, driver_repo=mirror.repo_of(loaded, host))
    # Read first: a visible device that no GPU of the host answers to fails its plan before any diff runs.
    _ = ctx.visible_count
    checked = {want.path: want.sha256 for want in desired_files(ctx, checked=True)}
    return dataclasses.replace(ctx, checked_files=checked)


def desired_files(ctx: HostContext, checked: bool = False) -> list[DesiredFile]:
    """Every file the registry's resources want on the host (`checked`: only those the node check holds)."""
    return [want for files in FILES if files.checked or not checked for want in files.desired(ctx)]


def expectation_of(loaded: LoadedRig, host: Host, facts: Facts) -> Expectation:
    """What a node holds itself to once apply has run: the rig's expectation with the managed files (and
    their digests) apply writes to this host."""
    return host_context(loaded, host, facts).node_expectation


def plan_host(loaded: LoadedRig, host: Host, facts: Facts) -> list[Change]:
    """Every Change that would bring `host` to the rig file, in playbook-step order (checks first)."""
    ctx = host_context(loaded, host, facts)
    changes = [change for diff in DIFFS for change in diff(ctx)]
    return sorted(changes, key=lambda c: PHASES.index(c.phase))  # stable within a step
