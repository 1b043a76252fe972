"""Per-host work written once, carried out by either engine: a generator of the agent calls it needs.

apply's work on a host (facts, plan, the `apply` call, a reboot and the wait for the new boot id, facts
again; `--drain slurm`'s drain, wait and resume) is a conversation with one agent, each call chosen from
the last reply. Written as a generator that yields `Call`, `Wait` and `Reconnect` steps and is sent each
reply (or has the call's error thrown in, where its own `except` sees it as it would a session's), the
same code runs on both engines:

- `on_session` (Fabric, in run_fleet's worker): one host in one session, each call on it, the session
  reopened on `Reconnect` (a reboot dropped it);
- `in_lockstep` (`--via clush`, the batch seam): every host of a batch at once. Each round gathers every
  live host's next call and sends them in one `call_many` per verb, so hosts whose request is
  byte-identical share one ClusterShell worker; each reply goes back to its own host's generator, and a
  host that failed or went away leaves the rounds while the others go on. Hosts in a `Wait` sit the
  rounds out until it is over; `Reconnect` costs nothing there (every call is a connection of its own).

One worker per distinct request, not one bundle that each agent picks its own entry from: hosts whose steps
are the same (a persistence or driver fix across a rig type) already share a worker, while a first apply's
steps differ on every host (its env files name it), so a bundle would send each host every other host's
files — at 1,000 hosts and ~1.5 KB of steps each, 1.5 MB to every host for 1.5 KB it reads, and a change
to the agent's protocol. Measured at 8 hosts (apply --json --yes, files and persistence drifted, median of
3 on a 2-core machine at load 7-10): Fabric 5.1 s wall and 1.1 CPU-s, --via clush 7.6 s and 1.5 CPU-s,
with 2 and 4 logins a host (each call is a connection of its own under ClusterShell); since the apply call
brings back the facts after its steps (jobs/apply.py), 2 and 3.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import AgentError, ConnectionFailed, ProvisionError
from ..facts import Facts
from ..fleet.options import FleetOptions
from ..fleet.pool import HostOutcome, call_many, fate, run_fleet
from ..fleet.session import AgentSession, Reply, open_session, read_facts, read_reply, validated
from ..fleet.targets import HostTarget, describe

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One agent call: the generator is sent its result, or has its error thrown in."""

    verb: str
    args: dict[str, Any]
    timeout: float | None = None  # None: the host's command_timeout_s


@dataclass(frozen=True)
class Wait:
    """Nothing to ask for `seconds` (a reboot or a drain being waited for)."""

    seconds: float


@dataclass(frozen=True)
class Reconnect:
    """The connection may be gone (a reboot): the next call goes over a new one, if one can be opened."""


Step = Call | Wait | Reconnect
Steps = Generator[Step, dict[str, Any], T]  # sent {} after a Wait or a Reconnect


def read(
    target: HostTarget,
    verb: str,
    args: dict[str, Any],
    model: type[Reply],
    timeout: float | None = None,
    what: str = "a reply",
) -> Generator[Step, dict[str, Any], Reply]:
    """One call's result checked against its contract, as fleet/session.read_reply does it."""
    answer = yield Call(verb, args, timeout)
    return validated(answer, model, verb, describe(target), what)


class ReopenableSession:
    """The agent session of one host, reopened when a reboot drops it."""

    def __init__(self, session: AgentSession, options: FleetOptions) -> None:
        self.session = session
        self.options = options
        self._opened: AgentSession | None = None  # a session this object opened and must close

    @property
    def target(self) -> HostTarget:
        return self.session.target

    def call(self, verb: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.session.call(verb, args, timeout)

    def read(self, verb: str, args: dict[str, Any], model: type[Reply], timeout: float | None) -> Reply:
        return read_reply(self.session, verb, args, model, timeout)

    def facts(self, request: dict[str, Any], timeout: float | None = None) -> Facts:
        return read_facts(self.session, request, timeout)

    def reconnect(self) -> None:
        fresh = open_session(self.target, self.options, self.session.agent)
        self.close()
        self.session = self._opened = fresh

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
            self._opened = None

    def __enter__(self) -> ReopenableSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def on_session(node: AgentSession | ReopenableSession, steps: Steps[T]) -> T:
    """`steps` carried out on one host's session (reopened on `Reconnect` when it can be); their value."""
    resume: Callable[[], Step] = functools.partial(next, steps)
    try:
        while True:
            step = resume()
            try:
                reply = _carry_out(node, step)
            except ProvisionError as exc:
                resume = functools.partial(steps.throw, exc)
            else:
                resume = functools.partial(steps.send, reply)
    except StopIteration as stop:
        value: T = stop.value
        return value
    finally:
        steps.close()


def _carry_out(node: AgentSession | ReopenableSession, step: Step) -> dict[str, Any]:
    if isinstance(step, Call):
        return node.call(step.verb, step.args, step.timeout)
    if isinstance(step, Wait):
        time.sleep(step.seconds)
    elif isinstance(node, ReopenableSession):  # down, or up without sshd yet: the next call says which
        with contextlib.suppress(ProvisionError):
            node.reconnect()
    return {}


def per_host(
    targets: list[HostTarget], options: FleetOptions, start: Callable[[HostTarget], Steps[T]]
) -> dict[str, HostOutcome[T]]:
    """Every target's `start(target)` steps, on the engine `options.via` picks, as run_fleet's outcomes."""
    if options.via == "clush":
        return in_lockstep(targets, options, start)

    def one(session: AgentSession) -> T:
        with ReopenableSession(session, options) as node:
            return on_session(node, start(session.target))

    return run_fleet(targets, one, options)


def in_lockstep(
    targets: list[HostTarget], options: FleetOptions, start: Callable[[HostTarget], Steps[T]]
) -> dict[str, HostOutcome[T]]:
    """Every target's steps at once, one `call_many` per verb and round; outcomes in target order, each
    host's as run_fleet gives it (an error its steps do not catch fails the host, ConnectionFailed makes it
    unreachable). On Ctrl-C the caller gets the KeyboardInterrupt at once."""
    started = time.monotonic()
    by_name = {t.name: t for t in targets}
    running = {t.name: start(t) for t in targets}
    resume: dict[str, Callable[[], Step]] = {name: functools.partial(next, g) for name, g in running.items()}
    awake_at = dict.fromkeys(running, 0.0)
    outcomes: dict[str, HostOutcome[T]] = {}

    def advance(name: str) -> Step | None:
        """The host's next step, or None once it has ended (its outcome noted)."""
        try:
            return resume.pop(name)()
        except StopIteration as stop:
            outcomes[name] = HostOutcome("ok", stop.value, None, time.monotonic() - started)
        except Exception as exc:  # as run_fleet's worker: one host's error never stops the others
            status, error = fate(exc)
            outcomes[name] = HostOutcome(status, None, error, time.monotonic() - started)
        return None

    try:
        while resume:
            calls: dict[str, Call] = {}
            for name in [n for n in resume if awake_at[n] <= time.monotonic()]:
                step = advance(name)
                while isinstance(step, Reconnect):
                    resume[name] = functools.partial(running[name].send, {})
                    step = advance(name)
                if isinstance(step, Wait):
                    awake_at[name] = time.monotonic() + step.seconds
                    resume[name] = functools.partial(running[name].send, {})
                elif isinstance(step, Call):
                    calls[name] = step
            if not calls:
                if resume:
                    time.sleep(max(0.0, min(awake_at[n] for n in resume) - time.monotonic()))
                continue
            for verb in dict.fromkeys(c.verb for c in calls.values()):
                names = [n for n, c in calls.items() if c.verb == verb]
                requests = {n: calls[n].args for n in names}
                timeouts = {n: calls[n].timeout for n in names}
                replies = call_many([by_name[n] for n in names], verb, requests, options, timeouts)
                for name in names:
                    resume[name] = _reply_to(running[name], replies[name])
    finally:
        for steps in running.values():
            steps.close()
    return {t.name: outcomes[t.name] for t in targets}


def _reply_to(steps: Steps[T], got: HostOutcome[dict[str, Any]]) -> Callable[[], Step]:
    """How a host's steps resume after its call: with the result, or with the error a session raises."""
    if got.status == "ok" and got.value is not None:
        return functools.partial(steps.send, got.value)
    error: ProvisionError = (ConnectionFailed if got.status == "unreachable" else AgentError)(got.error)
    return functools.partial(steps.throw, error)
