"""The plan: what differs between the rig file and each box, as a list of Changes, decided without I/O.

`facts_request` says what the agent must read for a host's plan; `plan_host` runs every resource's pure diff
over those facts and lists the Changes in playbook-step order (checks first, a reboot last so that it
follows everything it must load): the order apply carries them out in, so plan and apply show one order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import protocol
from ..facts import Facts
from ..judge.records import Expectation
from ..rig.models import Host
from . import expectation
from .change import PHASES, Change, HostContext
from .resources import (
    boot_unit,
    checks,
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

XORG_CONF = "/etc/X11/xorg.conf"

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
    persistence.diff,
    gpu_settings.diff,
    sli.diff,
)


def facts_request(loaded: LoadedRig, host: Host) -> dict[str, Any]:
    """The `facts` verb's args for this host: its managed files (with content, for diffs), its X config and,
    when the rig file names a smoke python, that python for the torch probe (importing torch takes seconds,
    and a rig that never said which python has torch would only get a failed probe of `python3`)."""
    managed = envfiles.managed_paths(loaded, host)
    slurm_files = slurm.managed_paths(loaded.rig_of(host))
    smoke = loaded.spec.smoke
    xorg = [path for path, phase in managed if phase == "sli"]
    unit = boot_unit.unit_path(loaded, host)
    checker = node_check.managed_paths(loaded, host)
    return protocol.facts_request(
        files=[path for path, _ in managed] + ([unit] if unit else []) + checker + slurm_files,
        include_content=True,
        python=smoke.python if "python" in smoke.model_fields_set else None,
        xorg_paths=xorg,
        # A ServerLayout in the main X config or beside the snippet hides the snippet's Screen.
        xorg_layout_paths=[XORG_CONF, *(os.path.dirname(path) for path in xorg)]
        if sli.desired_mode(host, loaded.rig_of(host))
        else [],
        units=([boot_unit.UNIT] if unit else []) + node_check.units(loaded, host),
        driver_repo=mirror.repo_of(loaded, host),
        driver_packages=mirror.packages_of(loaded, host),
        state_dir=envfiles.node_path(loaded, host, loaded.spec.files.state_dir),
        slurm=loaded.rig_of(host).slurm is not None,
    )


def expectation_of(loaded: LoadedRig, host: Host, facts: Facts) -> Expectation:
    """What a node holds itself to once apply has run: the rig's expectation with the managed files (and
    their digests) apply writes to this host."""
    desired = envfiles.desired_files(loaded, host, facts)
    return _expectation(
        loaded, host, desired + slurm.desired_files(host, loaded.rig_of(host), facts, _deadline(loaded))
    )


def _deadline(loaded: LoadedRig) -> float:
    """The node check's deadline, which the Slurm health script fits inside slurmd's."""
    check = loaded.spec.node_check
    return check.deadline_s if check is not None else slurm.HEALTH_TIMEOUT_S - 15.0


def _expectation(loaded: LoadedRig, host: Host, desired: list[envfiles.DesiredFile]) -> Expectation:
    return expectation.build(loaded, host, {want.path: want.sha256 for want in desired})


def plan_host(loaded: LoadedRig, host: Host, facts: Facts) -> list[Change]:
    """Every Change that would bring `host` to the rig file, in playbook-step order (checks first)."""
    rig = loaded.rig_of(host)
    visible = loaded.visible_indices(host, [gpu.uuid for gpu in facts.gpus])
    ctx = HostContext(
        host=host,
        rig=rig,
        facts=facts,
        visible_count=rig.gpus.count if visible is None else len(visible),
        expected_topology=loaded.topologies.get(host.rig),
        driver_repo=mirror.repo_of(loaded, host),
    )
    changes = [change for diff in DIFFS for change in diff(ctx)]
    changes += envfiles.env_checks(loaded, host, facts)
    desired = envfiles.desired_files(loaded, host, facts)
    changes += envfiles.diff_files(desired, facts)
    changes += envfiles.diff_unwanted(envfiles.unwanted_files(loaded, host), facts)
    changes += slurm.diff(host, rig, facts, _deadline(loaded))
    changes += boot_unit.diff(loaded, host, facts)  # after the NVML steps of its phase, which set them now
    # After the env files: the expectations it installs hold their digests.
    managed = desired + slurm.desired_files(host, rig, facts, _deadline(loaded))
    changes += node_check.diff(loaded, host, facts, _expectation(loaded, host, managed))
    return sorted(changes, key=lambda c: PHASES.index(c.phase))  # stable within a step
