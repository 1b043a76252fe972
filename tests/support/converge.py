"""Plan, apply, plan again on a simulated box: the convergence tests of one resource each.

The plan runs on the twin's facts as the control side gets them, the chosen changes' steps go through the
agent's own `apply` verb on the same twin (its overlay keeps what they changed), and the plan is taken
again: a resource that converges has no change left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mgpu_provision.node.__main__ import handle
from mgpu_provision.plan.change import Change
from mgpu_provision.plan.host import facts_request, plan_host
from mgpu_provision.rig import load_rig
from tests.support.factories import facts_from_twin, twin_state_dir


def changes_of(rig: Path, host: str, twin: Path, resources: tuple[str, ...]) -> list[Change]:
    """The plan's changes of `resources` for `host` of the rig file, on the twin's facts (with the managed
    files and the repository question the plan's facts request asks of the node)."""
    loaded = load_rig(rig)
    target = loaded.host(host)
    request = facts_request(loaded, target)
    args = {key: request[key] for key in ("files", "include_content", "nvidia_repository")}
    found = plan_host(loaded, target, facts_from_twin(twin, **args))
    return [change for change in found if change.resource in resources]


def apply_steps(twin: Path, lock: Path, changes: list[Change]) -> list[dict[str, Any]]:
    """The changes' steps through the agent's `apply` verb on the twin; each step's result."""
    args = {"lock": str(lock), "lock_wait_s": 2, "steps": [change.agent_step for change in changes]}
    # The node's state folder where facts_from_twin reads the overlay back (not the lock's folder here).
    request = {"args": args, "simulate": str(twin), "state_dir": twin_state_dir(twin)}
    reply, _ = handle("apply", json.dumps(request))
    assert reply["ok"], reply
    results: list[dict[str, Any]] = reply["result"]["results"]
    return results
