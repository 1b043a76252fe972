"""The node check apply installs where the rig asks (`node_check:`), and removes where it no longer does.

Five files and one enabled timer: the agent itself at a stable path (the very zipapp that answered the
facts), the expectations the shipped judge holds the node to (`judge.records.Expectation` as JSON, from
`HostContext.node_expectation`), the command `mgpu-provision-check` that runs the judge from that agent, and a
systemd service + timer that run the command every `interval`. The plan shows them as file changes and the
timer as a `service:` change, like the boot unit (`boot_unit.py`).

The expectations hold the digests of the env files apply writes, never of these five: the expectations
file cannot hold its own digest, and a changed check file is found by the next plan.
"""

from __future__ import annotations

import json
import posixpath
from typing import TYPE_CHECKING

from ... import protocol
from ...facts import Facts, Unit
from ...judge.records import expectation_to_json
from ..change import Action, Change, HostContext, Phase
from ..files import DesiredFile, diff_files, diff_unwanted, node_path, render

if TYPE_CHECKING:
    from ...rig import LoadedRig
    from ...rig.models import Host, NodeCheck

UNIT = "mgpu-provision-check"
SERVICE, TIMER = UNIT + ".service", UNIT + ".timer"
PHASE: Phase = "env"
LOCK_FILE = "check.lock"
# What a run may take beyond its own deadline before systemd ends it (the check ends itself first).
UNIT_GRACE_S = 15
# The timer's first run after it starts, unless its interval is shorter.
FIRST_RUN_S = 60
SPAN_SECONDS = {"s": 1, "min": 60, "h": 3600}


def first_run(interval: str) -> str:
    """When the timer first fires after it starts: a minute, or the interval when that is shorter."""
    digits = interval.rstrip("sminh")  # the rig's TIME_SPAN: digits, then one unit
    seconds = int(digits) * SPAN_SECONDS[interval[len(digits) :]]
    return interval if seconds < FIRST_RUN_S else f"{FIRST_RUN_S}s"


def _section(loaded: LoadedRig) -> NodeCheck:
    """The rig's section, or its defaults: where a check the rig no longer asks for was installed."""
    return loaded.spec.node_check or loaded.defaults.node_check


def _unit_paths(loaded: LoadedRig, host: Host) -> tuple[str, str] | None:
    folder = loaded.spec.files.systemd_dir
    if folder is None:
        return None
    return (
        node_path(loaded, host, posixpath.join(folder, SERVICE)),
        node_path(loaded, host, posixpath.join(folder, TIMER)),
    )


def paths(loaded: LoadedRig, host: Host) -> list[str]:
    """Every path this resource writes or removes on `host` (what the facts must describe)."""
    if host.os != "linux":
        return []
    section = _section(loaded)
    paths = [node_path(loaded, host, p) for p in (section.agent, section.expectations, section.command)]
    return paths + list(_unit_paths(loaded, host) or ())


def wanted(loaded: LoadedRig, host: Host) -> bool:
    return loaded.spec.node_check is not None and host.os == "linux"


def units(loaded: LoadedRig, host: Host) -> list[str]:
    """The units whose state the facts must report: the timer, where the rig asks for the check (where it
    does not, its file tells whether one is left to disable, and no systemctl call is paid for)."""
    return [TIMER] if wanted(loaded, host) and _unit_paths(loaded, host) is not None else []


def desired(ctx: HostContext) -> list[DesiredFile]:
    """The expectations, the command and (with a timer) its units, where the rig asks for the check."""
    if not wanted(ctx.loaded, ctx.host):
        return []
    where = _section(ctx.loaded).expectations
    content = json.dumps(expectation_to_json(ctx.node_expectation), indent=2, sort_keys=True) + "\n"
    expectations = DesiredFile(node_path(ctx.loaded, ctx.host, where), content, "0644", PHASE)
    return [expectations, _command(ctx.loaded, ctx.host), *_timer_units(ctx.loaded, ctx.host)]


def _command(loaded: LoadedRig, host: Host) -> DesiredFile:
    """`mgpu-provision-check`: the judge of the installed agent over its expectations, under a deadline."""
    section = _section(loaded)

    def where(path: str) -> str:
        return node_path(loaded, host, path)

    content = render(
        "mgpu-provision-check.j2",
        rig_name=host.rig,
        host_name=host.name,
        python=host.python or loaded.spec.defaults.python or "python3",
        agent=where(section.agent),
        expectations=where(section.expectations),
        deadline_s=f"{section.deadline_s:g}",
        lock=where(posixpath.join(loaded.spec.files.state_dir, LOCK_FILE)),
        textfile_dir=section.textfile_dir and where(section.textfile_dir),
        simulate=host.simulate and where(host.simulate),
    )
    return DesiredFile(where(section.command), content, "0755", PHASE)


def _timer_units(loaded: LoadedRig, host: Host) -> list[DesiredFile]:
    """The service that runs the command and the timer that starts it every `interval`; none without an
    interval or a systemd folder."""
    section = _section(loaded)
    units = _unit_paths(loaded, host)
    if units is None or section.interval is None:
        return []
    service, timer = units
    context = {"rig_name": host.rig, "host_name": host.name}
    command = node_path(loaded, host, section.command)
    diag = loaded.rig_of(host).health.dcgm_diag  # the check runs it after the facts, within its budget
    timeout = int(section.deadline_s) + (0 if diag is None else int(diag.budget_s)) + UNIT_GRACE_S
    first = first_run(section.interval)
    return [
        DesiredFile(
            service,
            render("node-check.service.j2", command=command, timer=TIMER, timeout_s=timeout, **context),
            "0644",
            PHASE,
        ),
        DesiredFile(
            timer,
            render("node-check.timer.j2", service=SERVICE, interval=section.interval, first=first, **context),
            "0644",
            PHASE,
        ),
    ]


def diff(ctx: HostContext) -> list[Change]:
    """Install the check (agent, expectations, command, units) and enable its timer where the rig asks;
    disable the timer, then remove every file of the check where it does not."""
    if ctx.host.os != "linux":
        return []
    timer = ctx.facts.units.get(TIMER)
    if not wanted(ctx.loaded, ctx.host):
        return _removed(ctx, timer)
    # No systemd on the box, or a simulated one (its twin stands in for the NVIDIA layer, not for systemd,
    # and a timer would judge the real GPUs): no units are managed, the command is run by hand or by Slurm.
    systemd = (timer is None or timer.service != "unknown") and not ctx.facts.host.simulated
    unit_files = _unit_paths(ctx.loaded, ctx.host) or ()
    want = [w for w in desired(ctx) if systemd or w.path not in unit_files]
    files = diff_files(want, ctx.facts)
    return _agent(ctx.loaded, ctx.host, ctx.facts) + files + _timer_changes(ctx, timer, files, systemd)


def _removed(ctx: HostContext, timer: Unit | None) -> list[Change]:
    """The check's timer disabled, then its files removed: where the rig no longer asks for it."""
    why = "the rig asks for no node check"
    units = _unit_paths(ctx.loaded, ctx.host)
    left = units is not None and (have := ctx.facts.file(units[1])) is not None and have.exists
    # Disabled (and stopped) first, while systemctl still finds the unit by its file.
    changes = [_timer(f"disable {TIMER}: {why}", "installed", False)] if left else []
    return changes + diff_unwanted(paths(ctx.loaded, ctx.host), ctx.facts, why, PHASE)


def _timer_changes(ctx: HostContext, timer: Unit | None, files: list[Change], systemd: bool) -> list[Change]:
    """The timer enabled and started (restarted when its unit files change), or disabled and its units
    removed where the rig asks for no timer."""
    enabled = bool(timer and timer.enabled)
    state = "not reported" if timer is None else f"{timer.service}, {'enabled' if enabled else 'disabled'}"
    unit_files = _unit_paths(ctx.loaded, ctx.host) or ()
    interval = _section(ctx.loaded).interval
    with_timer = systemd and interval is not None and bool(unit_files)
    running = enabled and timer is not None and timer.service == "active"
    changes = []
    if with_timer and running and any(c.resource in {f"file:{p}" for p in unit_files} for c in files):
        # A running timer keeps the unit it loaded: stopped, then started again on the new files.
        changes.append(_timer(f"restart {TIMER}: its units change", state, False))
        running = False
    if with_timer and not running:
        changes.append(_timer(f"enable and start {TIMER}: the node check runs every {interval}", state, True))
    elif not with_timer and systemd:
        why = "the rig asks for no timer"
        if enabled:
            changes.append(_timer(f"disable {TIMER}: {why}", state, False))
        changes += diff_unwanted(list(unit_files), ctx.facts, why, PHASE)
    return changes


def _agent(loaded: LoadedRig, host: Host, facts: Facts) -> list[Change]:
    """The agent that answered the facts, installed where the command runs it from."""
    path = node_path(loaded, host, _section(loaded).agent)
    have = facts.file(path)
    want = facts.agent_digest
    if want is None:
        summary = "the agent that answered runs from a source tree, not a zipapp: apply cannot install it"
        return [Change(f"file:{path}", "manual", summary, None, None, phase=PHASE)]
    if have is not None and have.exists and have.sha256 == want:
        return []
    current = None if have is None or not have.exists else f"sha256 {(have.sha256 or '?')[:12]}"
    action: Action = "create" if current is None else "update"
    summary = f"install the agent {want[:12]} for the node check"
    step = protocol.agent_step(path, want)
    desired = f"sha256 {want[:12]}"
    return [Change(f"file:{path}", action, summary, current, desired, agent_step=step, phase=PHASE)]


def _timer(summary: str, state: str, enable: bool) -> Change:
    desired = "enabled" if enable else "disabled"
    step = protocol.service_step(TIMER, enable, enable)
    return Change(f"service:{TIMER}", "update", summary, state, desired, agent_step=step, phase=PHASE)
