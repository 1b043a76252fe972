"""Running one job on many hosts at once: a bounded worker pool, one agent session per host and worker.

Every command that touches nodes (facts, plan, apply, smoke, reclaim) goes through `run_fleet`: it gives each
host its own session in its own worker and turns each host's fate into a `HostOutcome`, so that one dead box
never stops or hides the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from ..errors import ConnectionFailed, ProvisionError
from . import session
from .options import MAX_FORKS, AgentPayload, FleetOptions, Timeouts, limit_of
from .session import AgentSession
from .targets import HostTarget

T = TypeVar("T")
# `-v` shows these (and Paramiko's own steps: banner, key exchange, authentication) with timestamps.
log = logging.getLogger(__name__)


@dataclass
class HostOutcome(Generic[T]):
    """One host's fate: `fn`'s value when ok, else the plain-words error; unreachable = never logged in."""

    status: Literal["ok", "failed", "unreachable"]
    value: T | None
    error: str | None
    elapsed_s: float


def _default_agent() -> AgentPayload:
    # Imported on first use: building the zipapp reads the node-side sources, which only fleet runs need.
    from .bundle import build_agent

    bundle: AgentPayload = build_agent()
    return bundle


def fate(exc: Exception) -> tuple[Literal["failed", "unreachable"], str]:
    """A host's status and words after `exc` ended its work: unreachable when the connection failed; a
    bug or an unforeseen library error is named by its type."""
    if isinstance(exc, ConnectionFailed):
        return "unreachable", str(exc)
    return "failed", str(exc) if isinstance(exc, ProvisionError) else f"{type(exc).__name__}: {exc}"


def _run_one(
    target: HostTarget, fn: Callable[[AgentSession], T], options: FleetOptions, agent: AgentPayload
) -> HostOutcome[T]:
    started = time.monotonic()

    def outcome(
        status: Literal["ok", "failed", "unreachable"], error: str | None, value: T | None = None
    ) -> HostOutcome[T]:
        if options.on_host_done is not None:
            options.on_host_done(target.name)
        return HostOutcome(status, value, error, time.monotonic() - started)

    log.info("%s: connecting", target.name)
    try:
        opened = session.open_session(target, options, agent)
    except ConnectionFailed as exc:
        return outcome("unreachable", str(exc))
    log.info("%s: connected and logged in after %.2fs", target.name, time.monotonic() - started)
    try:
        return outcome("ok", None, fn(opened))
    except Exception as exc:  # a bug or an unforeseen library error must still not hide the other hosts
        return outcome(*fate(exc))
    finally:
        opened.close()
        log.info("%s: done after %.2fs", target.name, time.monotonic() - started)


def run_fleet(
    targets: list[HostTarget], fn: Callable[[AgentSession], T], options: FleetOptions
) -> dict[str, HostOutcome[T]]:
    """Run `fn` once per host, at most `forks` at a time; outcomes keyed by host name in target order.

    On Ctrl-C the caller gets the KeyboardInterrupt at once: hosts not started are dropped, and the calls
    in flight are not waited for (a smoke call lasts its whole run; `jobs/smoke.py` ends them itself)."""
    if not targets:
        return {}
    agent = options.agent or _default_agent()
    forks = max(1, min(options.forks or len(targets), MAX_FORKS, len(targets)))
    pool = ThreadPoolExecutor(max_workers=forks, thread_name_prefix="mgpu-fleet")
    try:
        futures = {t.name: pool.submit(_run_one, t, fn, options, agent) for t in targets}
        outcomes = {name: future.result() for name, future in futures.items()}
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return outcomes


def call_many(
    targets: list[HostTarget],
    verb: str,
    requests: dict[str, dict[str, Any]],
    options: FleetOptions,
    timeout: Timeouts = None,
) -> dict[str, HostOutcome[dict[str, Any]]]:
    """The batch seam: `verb` with each host's own arguments (`requests[name]`), every host's result or
    error, in target order; `timeout` bounds every host's command, or each its own (`{name: seconds}`;
    None: the host's command_timeout_s). `options.via` picks the engine: today's pool (one Fabric session
    a host), or ClusterShell (fleet/clush.py), which takes the SSH hosts; local hosts and injected
    sessions stay on the pool."""

    def one(opened: AgentSession) -> dict[str, Any]:
        return opened.call(verb, requests[opened.target.name], limit_of(timeout, opened.target.name))

    if options.via != "clush" or options.sessions is not None:
        return run_fleet(targets, one, options)
    from .clush import call_many_clush  # the optional extra: imported only under --via clush

    ssh = [t for t in targets if t.connection == "ssh"]
    outcomes = run_fleet([t for t in targets if t.connection != "ssh"], one, options)
    if ssh:
        agent = options.agent or _default_agent()
        for name, got in call_many_clush(ssh, verb, requests, options, agent, timeout).items():
            outcomes[name] = HostOutcome(*got)
    return {t.name: outcomes[t.name] for t in targets}
