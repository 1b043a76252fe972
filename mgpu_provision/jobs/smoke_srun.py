"""`smoke --via srun`: each DDP group's smoke as one Slurm step, started by one node of the group.

Slurm places the ranks and, with `--kill-on-bad-exit=1`, ends every node's part once one rank fails, which
the SSH way (`jobs/smoke.py`: one call per node) can only wait out. Three rounds through the agent's
`slurm-smoke` verb (node/verbs/slurm_smoke.py): `prepare` on every node (launcher and env files checked, the
program and config written where srun's one command line finds them), `run` on the first node of each group
(srun with `-w` the group's Slurm NodeNames, as each node's slurmd registers, and the GPUs, CPUs,
partition, account and reservation of `srun_options`), `collect` on every node
(the ranks' result files). The verdict is `judge_group`'s, over the ranks each node read back, plus the
step's exit code; the report names the job id and nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ProvisionError
from ..fleet.options import FleetOptions
from ..fleet.pool import HostOutcome, run_fleet
from ..fleet.replies import SmokeReply
from ..fleet.session import AgentSession, read_facts, read_reply
from ..fleet.targets import HostTarget
from ..plan.host import facts_request
from ..plan.resources.slurm import slurm_name, srun_options
from ..rig.rig import LoadedRig
from .smoke import (
    CALL_MARGIN_S,
    GroupReport,
    NodePart,
    NodeReport,
    SmokeReport,
    for_this_node,
    judge_group,
    notices,
    plan_smoke,
    with_ddp,
)

if TYPE_CHECKING:
    from ..rig.models import Host

ROUND_TIMEOUT_S = 120.0  # prepare and collect: facts, a few files


def without_slurm(loaded: LoadedRig, hosts: list[Host]) -> list[str]:
    return [h.name for h in hosts if loaded.rig_of(h).slurm is None]


def node_of(
    part: NodePart, prepared: HostOutcome[dict[str, Any]], ranks: list[dict[str, Any]], ran: bool
) -> NodeReport:
    """Pure: one node's row: failed when its prepare failed, or (once the step ran) any of its ranks is
    missing or failed."""
    nproc = part.rendezvous.nproc_per_node
    value = prepared.value or {}
    if prepared.status != "ok" or not value.get("ok"):
        why = prepared.error or value.get("diagnosis") or value.get("kind")
        return NodeReport(
            part.host, part.node_rank, False, value.get("kind") or prepared.status, why, [], 0.0
        )
    errors = [f"rank {r.get('rank')}: {r['error']}" for r in ranks if r.get("error")]
    failed = [
        f"rank {r.get('rank')} {c['name']}: {c['detail']}"
        for r in ranks
        for c in r.get("checks", [])
        if not c["ok"]
    ]
    diagnosis = "; ".join(errors + failed) or None
    if ran and diagnosis is None and len(ranks) != nproc:
        diagnosis = f"{len(ranks)} of {nproc} local ranks reported a result"
    if not ran:
        diagnosis = "not run: another node of the group failed its checks"
    return NodeReport(
        part.host, part.node_rank, diagnosis is None, None, diagnosis, ranks, 0.0, part.args["launcher"]
    )


def run_smoke_srun(
    loaded: LoadedRig,
    hosts: list[Host],
    targets: list[HostTarget],
    options: FleetOptions,
    run_id: str,
    on_node_done: Callable[[str, bool], None] | None = None,
) -> SmokeReport:
    hosts, skipped = with_ddp(loaded, hosts)
    missing = without_slurm(loaded, hosts)
    if missing:
        raise ProvisionError(
            f"smoke --via srun needs a `slurm` section in the rig of {', '.join(missing)} "
            "(the nodes run slurmd); use --via ssh"
        )
    parts = plan_smoke(loaded, hosts, run_id)
    by_host = {p.host: p for p in parts}
    chosen = [t for t in targets if t.name in by_host]
    every = dataclasses.replace(options, forks=len(chosen))
    args: dict[str, dict[str, Any]] = {}
    slurm_names: dict[str, str] = {}  # host -> its Slurm NodeName, which srun -w takes

    def prepare(session: AgentSession) -> dict[str, Any]:
        name = session.target.name
        host = loaded.host(name)
        facts = read_facts(session, facts_request(loaded, host))
        slurm_names[name] = slurm_name(host, facts)
        args[name] = for_this_node(loaded, host, by_host[name], facts)
        return call(session, "prepare", ROUND_TIMEOUT_S)

    def call(session: AgentSession, action: str, timeout: float, **more: Any) -> dict[str, Any]:
        request = {**args[session.target.name], "action": action, **more}
        return read_reply(session, "slurm-smoke", request, SmokeReply, timeout).model_dump()

    prepared = run_fleet(chosen, prepare, every)
    groups: dict[str, list[NodePart]] = {}
    for part in parts:
        groups.setdefault(part.group, []).append(part)
    ready = {
        master: members
        for master, members in groups.items()
        if all(prepared[p.host].status == "ok" and (prepared[p.host].value or {}).get("ok") for p in members)
    }
    starters = [t for t in targets if any(t.name == members[0].host for members in ready.values())]
    step_timeout = loaded.spec.smoke.timeout_s + CALL_MARGIN_S

    def run_step(session: AgentSession) -> dict[str, Any]:
        part = by_host[session.target.name]
        slurm = loaded.rig_of(loaded.host(part.host)).slurm
        assert slurm is not None  # without_slurm refused the others
        members = groups[part.group]
        wanted = srun_options(slurm, part.rendezvous.nproc_per_node)
        return call(
            session, "run", step_timeout, nodes=[slurm_names[p.host] for p in members], srun_options=wanted
        )

    steps = run_fleet(starters, run_step, dataclasses.replace(options, forks=max(1, len(starters))))
    # One node at a time: test hosts (and some clusters) share /tmp, and the first collect removes it.
    read_back = [t for t in chosen if t.name in args]
    collected = run_fleet(
        read_back, lambda s: call(s, "collect", ROUND_TIMEOUT_S), dataclasses.replace(options, forks=1)
    )
    report_groups = [
        _group_report(members, prepared, collected, steps.get(members[0].host), master in ready, on_node_done)
        for master, members in groups.items()
    ]
    return SmokeReport(run_id, report_groups, [*skipped, *notices(parts)])


def _group_report(
    members: list[NodePart],
    prepared: dict[str, HostOutcome[dict[str, Any]]],
    collected: dict[str, HostOutcome[dict[str, Any]]],
    step: HostOutcome[dict[str, Any]] | None,
    started: bool,
    on_node_done: Callable[[str, bool], None] | None,
) -> GroupReport:
    """One DDP group's report: its ranks as the nodes wrote them, each node judged, and the srun step that
    started the group (run from its first member) with what went wrong with it."""
    ranks: dict[int, dict[str, Any]] = {}
    for part in members:
        outcome = collected.get(part.host)
        for rank in ((outcome.value if outcome else None) or {}).get("ranks") or []:
            ranks.setdefault(int(rank.get("rank", -1)), dict(rank))
    nodes = []
    for part in members:
        own = [r for r in ranks.values() if r.get("hostname") == part.host]
        node = node_of(part, prepared[part.host], own, started)
        nodes.append(node)
        if on_node_done is not None:
            on_node_done(part.host, node.ok)
    group = judge_group(members, nodes)
    srun: dict[str, Any] | None = None
    problems = list(group.problems)
    if step is not None:
        value = step.value or {}
        srun = {k: value.get(k) for k in ("job_id", "nodes", "exit_code", "elapsed_s")}
        if step.status != "ok" or not value.get("ok"):
            problems.append(f"srun step on {members[0].host}: {step.error or value.get('diagnosis')}")
    return dataclasses.replace(group, problems=problems, srun=srun)
