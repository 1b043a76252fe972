"""The `slurm-node` verb: this node's line at the Slurm controller, and the drain a rolling apply sets on it.

`apply --drain slurm` changes a node only once Slurm has stopped giving it jobs and its running jobs have
ended (DRAINED). The node runs scontrol, not the control side: it has slurm.conf and munge's key, the control
machine need not. A drain someone else set (an admin's, the health check's) is never overwritten, and
`resume` lifts only a drain whose reason is the one given, so an admin's drain outlives the rollout.
"""

from __future__ import annotations

import socket
import subprocess

from ...typing_lite import TYPE_CHECKING
from ..core.errors import AgentFailure
from ..host.machine import controller_line, find_tool, registered_name, run_tool

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional


def _line(scontrol: str, name: str) -> Dict[str, str]:
    line, error = controller_line(scontrol, name)
    if line is None:
        raise AgentFailure("slurm", error or "scontrol show node {}: no answer".format(name))
    return line


def _update(scontrol: str, name: str, words: List[str]) -> None:
    done = run_tool([scontrol, "update", "nodename=" + name, *words])
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or "exit {}".format(done.returncode)
        raise AgentFailure("slurm", "scontrol update nodename={} {}: {}".format(name, " ".join(words), said))


def run(args: Dict[str, Any]) -> Dict[str, Any]:
    """`show`: the node's line; `drain`: drain it with `reason` unless it is drained already; `resume`: end
    the drain only when its reason starts with `reason`. `changed` says whether scontrol update ran."""
    scontrol = find_tool("scontrol")
    if scontrol is None:
        raise AgentFailure("slurm", "scontrol is not installed on this node (Debian: slurm-client)")
    action = args["action"]
    reason: Optional[str] = args["reason"]
    try:
        _, name = registered_name(find_tool("slurmd"), socket.gethostname().split(".")[0])
        line = _line(scontrol, name)
        drained = "DRAIN" in line.get("State", "")
        ours = drained and reason is not None and line.get("Reason", "").startswith(reason)
        changed = False
        if action == "drain" and not drained:
            _update(scontrol, name, ["state=drain", "reason=" + (reason or "mgpu: apply")])
            changed = True
        elif action == "resume" and ours:
            _update(scontrol, name, ["state=resume"])
            changed = True
        if changed:
            line = _line(scontrol, name)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AgentFailure("slurm", "scontrol: {}".format(exc)) from None
    return {"node": name, "line": line, "changed": changed}
