"""apply: bring each box to the rig file: facts, plan, one agent `apply` call, reboot if allowed, facts.

Per host (`converge_steps`), everything the plan can carry out goes to the node in ONE agent `apply` call, so
the agent holds the host's lock for the whole change; a driver that needs a reboot gets one (when the rig and
the playbook allow it); on the machine running this tool (fleet/here.py) neither a driver install nor a reboot
is sent without --allow-control-machine. Then facts are read again and whatever the plan still shows is
reported: without a reboot between, the `apply` call itself brings them back (its `then_facts`, read by a new
agent process), so a host costs one call, and under `--via clush` one login, fewer; an agent that could not
read them gets a facts call of its own. Across hosts (`rollout`), batches from `--serial` run one after
another and `--max-fail-percent` stops the later ones. `fleet_plan` is the plan shown for confirmation
before anything runs, and the one the rollout carries out. Each host's work is written once as steps
(jobs/steps.py): one session a host, or under `--via clush` the batch's hosts in lockstep through the batch
seam.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from .. import protocol
from ..errors import ConnectionFailed, ProvisionError
from ..facts import Facts
from ..fleet.here import Here, address_is_here, control_machine
from ..fleet.options import FleetOptions
from ..fleet.pool import HostOutcome
from ..fleet.replies import ApplyReply, RebootReply
from ..fleet.session import validated
from ..fleet.targets import HostTarget, describe
from ..plan.change import Change
from ..plan.files import node_path
from ..plan.host import facts_request, plan_host
from ..plan.resources.slurm import APPLY_DRAIN, APPLY_REASON
from .drain import Drained, DrainSettings, drain_steps, not_drained_words, resume_steps
from .plan import FleetPlan, HostPlan, held_names, held_on_control_machine, plan_fleet
from .playbooks import carried_out, in_step_order
from .rollout import Serial, batches, too_many_failed
from .steps import Reconnect, ReopenableSession, Steps, Wait, on_session, per_host, read

if TYPE_CHECKING:
    from ..rig import LoadedRig
    from ..rig.models import Host

RecapStatus = Literal["ok", "changed", "failed", "unreachable", "skipped"]
Progress = Callable[[str], None]

LOCK_FILE = "apply.lock"
# How long a driver install may take on the node (the agent bounds each package command at 1800 s).
DRIVER_INSTALL_BOUND_S = 3600.0
_BOOT_PROBE_TIMEOUT_S = 30.0


class PlanChanged(ProvisionError):
    """The box changed between the confirmed plan and its turn in the rollout."""


class RebootTimeout(ProvisionError):
    """A rebooted box did not come back with a new boot id in time."""


@dataclass(frozen=True)
class ApplySettings:
    steps: tuple[str, ...]  # the playbook steps selected for this run, in order
    lock_wait_s: float = 60.0
    reboot_timeout_s: float = 900.0
    poll_interval_s: float = 5.0
    allow_control_machine: bool = False  # --allow-control-machine: a driver install or reboot here is meant


@dataclass
class HostRecap:
    """How one host ended: the PLAY RECAP line, plus what was done and what is left."""

    host: str
    status: RecapStatus
    done: list[str] = field(default_factory=list)  # "kind: message" of every step that changed something
    remaining: list[Change] = field(default_factory=list)  # the plan afterwards (reboots included)
    reboot_required: bool = False
    rebooted: bool = False
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class ApplyResult:
    recaps: tuple[HostRecap, ...]
    stopped: str | None = None  # why the later batches were not run (--max-fail-percent), if they were not
    drain_skipped: tuple[str, ...] = ()  # --drain slurm: each batch skipped for not draining in time

    @property
    def converged(self) -> bool:
        return all(r.status in ("ok", "changed") and not r.reboot_required for r in self.recaps)

    @property
    def exit_code(self) -> int:
        return 0 if self.converged else 2

    def counts(self) -> dict[str, int]:
        """Hosts per recap status, every status present, plus how many need a reboot."""
        counts = {
            status: sum(1 for r in self.recaps if r.status == status) for status in get_args(RecapStatus)
        }
        counts["reboot_required"] = sum(1 for r in self.recaps if r.reboot_required)
        return counts


def finish(
    host: str,
    changes: list[Change],
    done: list[str],
    *,
    rebooted: bool = False,
    error: str | None = None,
    notes: list[str] | None = None,
    elapsed_s: float = 0.0,
    unreachable: bool = False,
) -> HostRecap:
    """The recap of a host whose plan afterwards is `changes`: a pending reboot is flagged, the rest fails.

    While a new driver waits for its reboot NVML refuses to answer, so failed checks then are not held
    against the host (they stay listed): "reboot required" is the verdict until the box has rebooted.
    """
    reboot_required = any(c.resource == "reboot" for c in changes)
    left = [
        c
        for c in changes
        if c.resource != "reboot"
        and c.action != "warn"
        and not (reboot_required and c.action == "verify-failed")
    ]
    if error is None and left:
        error = left_words(left)
    status: RecapStatus = "failed" if error else ("changed" if done or rebooted else "ok")
    if unreachable:
        status = "unreachable"
    return HostRecap(
        host,
        status,
        done=done,
        remaining=changes,
        reboot_required=reboot_required,
        rebooted=rebooted,
        error=error,
        notes=notes or [],
        elapsed_s=elapsed_s,
    )


def left_words(left: list[Change]) -> str:
    """`1 check failed: topology; 2 changes left: driver, persistence`: what keeps a host from converging,
    failed checks (which apply cannot fix, and which stop none of the host's other changes) first."""
    checks = [c.resource for c in left if c.action == "verify-failed"]
    changes = [c.resource for c in left if c.action != "verify-failed"]
    words = (("check failed", "checks failed"), ("change left", "changes left"))
    return "; ".join(
        f"{len(names)} {one if len(names) == 1 else many}: {', '.join(dict.fromkeys(names))}"
        for names, (one, many) in zip((checks, changes), words, strict=True)
        if names
    )


def without_check(recap: HostRecap, resource: str) -> HostRecap:
    """The recap as if the plan afterwards had no `resource` entry; a failed step's error stays."""
    from_plan = finish(recap.host, recap.remaining, recap.done, rebooted=recap.rebooted).error
    return finish(
        recap.host,
        [c for c in recap.remaining if c.resource != resource],
        recap.done,
        rebooted=recap.rebooted,
        error=recap.error if recap.error != from_plan else None,
        notes=list(recap.notes),
        elapsed_s=recap.elapsed_s,
        unreachable=recap.status == "unreachable",
    )


def unconfirmed(changes: list[Change], confirmed: list[Change]) -> list[Change]:
    """Changes to carry out now that the person did not see in the confirmed plan."""
    seen = {(c.resource, c.action, c.desired) for c in confirmed}
    return [c for c in changes if (c.resource, c.action, c.desired) not in seen]


def _planned(loaded: LoadedRig, host: Host, facts: Facts, steps: tuple[str, ...]) -> list[Change]:
    return in_step_order(plan_host(loaded, host, facts), steps)


def _run_steps(
    target: HostTarget,
    changes: list[Change],
    lock: str,
    settings: ApplySettings,
    simulated: bool,
    then_facts: dict[str, Any] | None,
) -> Steps[tuple[list[str], str | None, Facts | None]]:
    """One agent `apply` call for every non-reboot step: what changed, the failed step's error if any, and
    (with `then_facts`, facts arguments) the facts the agent read afterwards, None where it could not."""
    steps = [c.agent_step for c in changes if c.agent_step is not None and c.phase != "reboot"]
    if not steps:
        return [], None, None
    # The agent may wait lock_wait_s for another apply's lock before its own steps run, and a driver
    # install (a DKMS build) outlasts any ordinary command: cutting it off would leave apt running unseen.
    timeout = target.command_timeout_s + settings.lock_wait_s
    if any(step["kind"] == protocol.DRIVER for step in steps):
        timeout += DRIVER_INSTALL_BOUND_S
    if then_facts is not None:  # within the agent's own bound on them, so the steps' outcome always comes
        timeout += target.command_timeout_s
    request = protocol.apply_request(
        lock, settings.lock_wait_s, steps, simulated, then_facts, target.command_timeout_s
    )
    reply = yield from read(target, "apply", request, ApplyReply, timeout)
    after = _facts_after(target, reply.facts)
    done = [f"{r.kind}: {r.message}" for r in reply.results if r.changed]
    failed = next((r for r in reply.results if r.error), None)
    if failed is None:
        return done, None, after
    # Name the file a failed file step was writing: the agent's OS error does not always carry it.
    step = steps[failed.index] if failed.index < len(steps) else {}
    what = f"{failed.kind} {step['path']}" if "path" in step else failed.kind
    return done, f"step {failed.index + 1} ({what}) failed: {failed.error}", after


def _facts_after(target: HostTarget, envelope: dict[str, Any] | None) -> Facts | None:
    """The facts an apply reply carries, or None (not asked for, an older agent, or the agent could not
    read them): the caller then asks for facts in a call of their own, which says what went wrong."""
    if envelope is None or envelope.get("ok") is not True or not isinstance(envelope.get("result"), dict):
        return None
    try:
        return validated(envelope["result"], Facts, "facts", describe(target), "facts")
    except ProvisionError:
        return None


def reboot_steps(
    target: HostTarget, lock: str, settings: ApplySettings, progress: Progress, simulated: bool
) -> Steps[None]:
    """Reboot the host through its agent and wait until it answers with a new boot id (apply and recover)."""
    name = target.name
    # Under the host lock: a reboot must not land in the middle of another apply's steps.
    timeout = target.command_timeout_s + settings.lock_wait_s
    request = protocol.reboot_request(lock, settings.lock_wait_s, simulated)
    old = (yield from read(target, "reboot", request, RebootReply, timeout)).boot_id
    progress(f"{name}: rebooting, waiting up to {settings.reboot_timeout_s:g}s for it to come back")
    started = time.monotonic()
    while time.monotonic() - started < settings.reboot_timeout_s:
        try:
            probe = protocol.facts_request()
            facts = yield from read(target, "facts", probe, Facts, _BOOT_PROBE_TIMEOUT_S, "facts")
            if facts.host.boot_id != old:
                progress(f"{name}: back after {time.monotonic() - started:.0f}s")
                return
        except ProvisionError:  # down, or up without sshd yet: open a new connection next time
            yield Reconnect()
        progress(f"{name}: still rebooting ({time.monotonic() - started:.0f}s)")
        yield Wait(settings.poll_interval_s)
    raise RebootTimeout(f"{name} did not come back with a new boot id within {settings.reboot_timeout_s:g}s")


def reboot_and_wait(
    node: ReopenableSession, lock: str, settings: ApplySettings, progress: Progress, simulated: bool
) -> None:
    """`reboot_steps` on one host's session (recover's reboot)."""
    on_session(node, reboot_steps(node.target, lock, settings, progress, simulated))


def converge_steps(
    target: HostTarget,
    loaded: LoadedRig,
    host: Host,
    settings: ApplySettings,
    confirmed: list[Change],
    progress: Progress,
) -> Steps[HostRecap]:
    """Facts, plan, apply, (reboot), facts again: the recap says what was done and what is left."""
    started = time.monotonic()
    request = facts_request(loaded, host)
    lock = node_path(loaded, host, f"{loaded.spec.files.state_dir.rstrip('/')}/{LOCK_FILE}")
    done: list[str] = []
    notes: list[str] = []
    rebooted = False
    changes: list[Change] = []

    def end(error: str | None = None, unreachable: bool = False) -> HostRecap:
        elapsed = time.monotonic() - started
        return finish(
            host.name,
            changes,
            done,
            rebooted=rebooted,
            error=error,
            notes=notes,
            elapsed_s=elapsed,
            unreachable=unreachable,
        )

    def planned(after: Facts | None = None) -> Steps[tuple[Facts, list[Change]]]:
        """The host's plan now: from `after` (the facts apply's own call read), else from a facts call."""
        facts = after or (yield from read(target, "facts", request, Facts, what="facts"))
        return facts, _planned(loaded, host, facts, settings.steps)

    try:
        facts, changes = yield from planned()
        surprise = unconfirmed([c for c in changes if carried_out(c, settings.steps)], confirmed)
        if surprise:
            raise PlanChanged(
                f"the box changed since the plan was confirmed ({surprise[0].summary}); run apply again"
            )
        mine = control_machine(target, facts, Here.read(), address_is_here)
        for _ in range(2):  # a second round only after a reboot, for what the new driver allows
            todo = [c for c in changes if carried_out(c, settings.steps)]
            if rebooted:  # never reboot twice: a reboot still wanted afterwards is reported instead
                todo = [c for c in todo if c.resource != "reboot"]
            held = held_on_control_machine(todo) if mine and not settings.allow_control_machine else []
            if held:
                notes.append(f"not done ({held_names(held)}): {mine}; --allow-control-machine allows it")
                todo = [c for c in todo if c not in held]
            if not todo:
                break
            reboots = any(c.agent_step is not None and c.phase == "reboot" for c in todo)
            # The facts after the steps come in the apply call itself, unless a reboot comes between.
            then = None if reboots else request
            simulated = facts.host.simulated
            applied, error, after = yield from _run_steps(target, todo, lock, settings, simulated, then)
            done += applied
            if error is not None:
                _, changes = yield from planned(after)
                return end(error)
            if reboots:
                yield from reboot_steps(target, lock, settings, progress, simulated)
                rebooted = True
            facts, changes = yield from planned(after)
            if not rebooted:
                break
    except ConnectionFailed as exc:
        return end(str(exc), unreachable=True)
    except ProvisionError as exc:
        return end(str(exc))
    return end()


def release_steps(
    target: HostTarget,
    loaded: LoadedRig,
    host: Host,
    settings: ApplySettings,
    recap: HostRecap,
    drained: Drained,
) -> Steps[HostRecap]:
    """After a drained host's change and check: resume it in Slurm when it converged and the drain is this
    rollout's, then read it again for the recap; otherwise it stays drained, and the recap says why."""
    ready = without_check(recap, APPLY_DRAIN)
    if ready.status not in ("ok", "changed") or ready.reboot_required:
        if drained.ours:
            recap.notes.append(
                f"left drained in Slurm ({APPLY_REASON}): resume it (scontrol update nodename={drained.node} "
                "state=resume) once the box is right"
            )
        return recap
    if not drained.ours:
        ready.notes.append(f"left drained in Slurm: the drain is not this rollout's ({drained.reason})")
        return ready
    yield from resume_steps(target)
    facts = yield from read(target, "facts", facts_request(loaded, host), Facts, what="facts")
    changes = _planned(loaded, host, facts, settings.steps)
    notes = [*recap.notes, f"resumed in Slurm ({drained.node}) after {drained.waited_s:.0f}s drained"]
    return finish(
        host.name, changes, recap.done, rebooted=recap.rebooted, notes=notes, elapsed_s=recap.elapsed_s
    )


def to_carry_out(host: HostPlan, steps: tuple[str, ...]) -> list[Change]:
    """What a run of `steps` changes on this host (its checks and manual steps are only reported)."""
    return [c for c in host.changes if carried_out(c, steps)] if host.status == "ok" else []


def fleet_plan(
    loaded: LoadedRig, targets: list[HostTarget], steps: tuple[str, ...], options: FleetOptions
) -> FleetPlan:
    """The plan apply shows for confirmation and then carries out: the playbook's steps, in its order."""
    return plan_fleet(loaded, targets, options, lambda changes: in_step_order(changes, steps))


def _recap_of_plan(p: HostPlan) -> HostRecap:
    if p.status == "ok":
        return finish(p.host, list(p.changes), [], elapsed_s=p.elapsed_s)
    return HostRecap(p.host, p.status, error=p.error, elapsed_s=p.elapsed_s)


def _recap_of_outcome(name: str, outcome: HostOutcome[HostRecap]) -> HostRecap:
    if outcome.value is not None:
        return outcome.value
    status: RecapStatus = "unreachable" if outcome.status == "unreachable" else "failed"
    return HostRecap(name, status, error=outcome.error, elapsed_s=outcome.elapsed_s)


def rollout(
    loaded: LoadedRig,
    targets: list[HostTarget],
    plan: FleetPlan,
    settings: ApplySettings,
    options: FleetOptions,
    *,
    serial: Serial | None = None,
    max_fail_percent: float | None = None,
    drain: DrainSettings | None = None,
    progress: Progress = lambda _: None,
) -> ApplyResult:
    """Converge the hosts batch by batch; a batch over `max_fail_percent` failed leaves the rest "skipped".

    Hosts the plan found unreachable or with nothing to carry out are not contacted again: their recap is
    the plan's, and they count in their batch like the others (an unreachable host is a failed one). With
    `drain` the hosts a batch changes are drained in Slurm first (jobs/drain.py); a batch that does not
    drain in time is skipped, its drains lifted, and named in `drain_skipped`.
    """
    recaps: dict[str, HostRecap] = {}
    under_way: list[str] = []
    try:
        return _rollout(
            loaded, plan, targets, settings, options, serial, max_fail_percent, drain, progress,
            recaps, under_way,
        )  # fmt: skip
    except KeyboardInterrupt:
        raise ApplyInterrupted(interrupted_words([t.name for t in targets], recaps, under_way)) from None


class ApplyInterrupted(KeyboardInterrupt):
    """Ctrl-C during apply, carrying what finished, what was under way and what was not started."""


def interrupted_words(names: list[str], recaps: dict[str, HostRecap], under_way: list[str]) -> str:
    """`changed: a, b; under way (...): c; not started: d`, in host order, as --max-fail-percent says
    which hosts it did not touch."""
    by_status: dict[str, list[str]] = {}
    for name in names:
        status: str = "under way" if name in under_way else "not started"
        by_status.setdefault(recaps[name].status if name in recaps else status, []).append(name)
    words = {"under way": "under way (stopped where they were; the next apply finishes them)"}
    return "; ".join(f"{words.get(key, key)}: {', '.join(hosts)}" for key, hosts in by_status.items())


def _rollout(
    loaded: LoadedRig,
    plan: FleetPlan,
    targets: list[HostTarget],
    settings: ApplySettings,
    options: FleetOptions,
    serial: Serial | None,
    max_fail_percent: float | None,
    drain: DrainSettings | None,
    progress: Progress,
    recaps: dict[str, HostRecap],
    under_way: list[str],
) -> ApplyResult:
    """The rollout itself; `recaps` and `under_way` (the batch being applied) say how far it got."""
    planned = {h.host: h for h in plan.hosts}
    stop_reason: str | None = None
    stopped: str | None = None
    drain_skipped: list[str] = []
    for number, batch in enumerate(batches(targets, serial), start=1):
        if stop_reason is not None:
            recaps.update((t.name, HostRecap(t.name, "skipped", error=stop_reason)) for t in batch)
            continue
        busy = [t for t in batch if to_carry_out(planned[t.name], settings.steps)]
        recaps.update((t.name, _recap_of_plan(planned[t.name])) for t in batch if t not in busy)
        held: dict[str, Drained] = {}
        if busy and drain is not None:
            progress(f"batch {number}: draining {', '.join(t.name for t in busy)} in Slurm")
            why_not, held = _drain_batch(busy, drain, options, progress)
            if why_not is not None:
                line = f"batch {number} ({', '.join(t.name for t in busy)}) skipped: {why_not}"
                progress(line)
                drain_skipped.append(line)
                recaps.update((t.name, HostRecap(t.name, "skipped", error=line)) for t in busy)
                continue
        if busy:
            progress(f"batch {number}: applying on {', '.join(t.name for t in busy)}")
            under_way[:] = [t.name for t in busy]
            recaps.update(_converge_batch(loaded, planned, busy, settings, options, progress))
            under_way.clear()
        if held:
            _release_batch(loaded, busy, held, settings, options, recaps)
        failed = sum(1 for t in batch if recaps[t.name].status in ("failed", "unreachable"))
        if too_many_failed(failed, len(batch), max_fail_percent):
            limit = f"--max-fail-percent {max_fail_percent:g}"
            stop_reason = f"not touched: {failed} of {len(batch)} host(s) of batch {number} failed ({limit})"
            stopped = f"stopped after batch {number} ({failed} of {len(batch)} host(s) failed, {limit})"
    skipped = any(r.status == "skipped" and r.error == stop_reason for r in recaps.values())
    return ApplyResult(
        tuple(recaps[t.name] for t in targets), stopped if skipped else None, tuple(drain_skipped)
    )


def _converge_batch(
    loaded: LoadedRig,
    planned: dict[str, HostPlan],
    busy: list[HostTarget],
    settings: ApplySettings,
    options: FleetOptions,
    progress: Progress,
) -> dict[str, HostRecap]:
    """Each host of the batch converged with the steps the confirmed plan gave it: in its own session, or
    under `--via clush` all in lockstep (jobs/steps.py)."""

    def converge(target: HostTarget) -> Steps[HostRecap]:
        confirmed = to_carry_out(planned[target.name], settings.steps)
        return converge_steps(target, loaded, loaded.host(target.name), settings, confirmed, progress)

    outcomes = per_host(busy, options, converge)
    return {name: _recap_of_outcome(name, o) for name, o in outcomes.items()}


def _release_batch(
    loaded: LoadedRig,
    busy: list[HostTarget],
    held: dict[str, Drained],
    settings: ApplySettings,
    options: FleetOptions,
    recaps: dict[str, HostRecap],
) -> None:
    """The batch's own drains lifted (each host's recap says so); a host that could not be resumed keeps
    its recap with a note saying why."""

    def release(target: HostTarget) -> Steps[HostRecap]:
        name = target.name
        return release_steps(target, loaded, loaded.host(name), settings, recaps[name], held[name])

    released = per_host(busy, options, release)
    recaps.update((name, o.value) for name, o in released.items() if o.value is not None)
    for name, o in released.items():
        if o.value is None:
            recaps[name].notes.append(f"not resumed in Slurm: {o.error}")


def _drain_batch(
    busy: list[HostTarget], drain: DrainSettings, options: FleetOptions, progress: Progress
) -> tuple[str | None, dict[str, Drained]]:
    """Drain every host of the batch and wait: (None, the drains) when all are DRAINED in time; otherwise
    why not, with the drains this rollout set lifted again (a skipped batch goes back to work)."""
    outcomes = per_host(busy, options, lambda t: drain_steps(t, drain, progress))
    held = {name: o.value for name, o in outcomes.items() if o.value is not None}
    failed = [f"{name}: {o.error}" for name, o in outcomes.items() if o.value is None]
    stuck = [d for d in held.values() if not d.ready]
    if not failed and not stuck:
        return None, held
    ours = [t for t in busy if t.name in held and held[t.name].ours]
    per_host(ours, options, resume_steps)
    return "; ".join([*failed, not_drained_words(stuck, drain.timeout_s)] if stuck else failed), held
