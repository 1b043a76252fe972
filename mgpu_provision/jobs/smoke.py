"""The control side of `smoke`: start every node's part of the DDP run at once, and judge the fleet.

Deciding who runs what (`plan_smoke`) and whether the result passes (`judge_group`) are pure functions over
the rig and the nodes' answers (checked on arrival: fleet/replies.py); `run_smoke` is the thin shell that
runs the node side (`node/verbs/smoke.py`, the agent's `smoke` verb) on all hosts together through
`fleet.run_fleet`. Each node
runs with its `Rendezvous` (`LoadedRig.rendezvous`), the same one apply wrote into its launcher, so smoke
runs whole DDP groups only: a selection holding part of a group is refused, since ranks cannot be renumbered
behind the launchers' back.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProvisionError
from ..facts import Facts
from ..fleet.options import MAX_FORKS, FleetOptions
from ..fleet.pool import HostOutcome, run_fleet
from ..fleet.replies import CleanupReply, SmokeReply
from ..fleet.session import AgentSession, read_facts, read_reply
from ..fleet.targets import HostTarget
from ..judge.health import FAILING_THROTTLE
from ..plan.change import HostContext
from ..plan.host import facts_request
from ..plan.resources.envfiles import desired, environment, launcher_path, path_prepends
from ..protocol import DATA_PARALLEL_TIMEOUT_S, smoke_cleanup_request, smoke_request
from ..rig.models import Host
from ..rig.rig import LoadedRig, Rendezvous

# Beyond the node's own deadline: the torch probe, the SIGTERM/SIGKILL grace, the SSH round trip, and the
# DataParallel process that a CUDA node runs after its ranks.
CALL_MARGIN_S = 90.0 + DATA_PARALLEL_TIMEOUT_S
CLEANUP_TIMEOUT_S = 30.0
# Default all_reduce busbw floors where a public figure exists, for one node of 8 GPUs on its switch/mesh
# (GPU model as NVML names it, rig bridge kind): Azure's health checks (azurehpc-health-checks, conf/
# nd96isr_h100_v5.conf, nd96isr_h200_v5.conf, nd96asr_v4.conf, nd40rs_v2.conf: check_nccl_allreduce)
# pass H100 at 460, H200 at 431, A100 at 228 and V100 at 110 GB/s, measured at 8 to 16 GiB; smoke stops at
# 4 GiB, below the plateau, so the floors keep a margin under those figures.
DEFAULT_FLOORS_GBPS = (
    ("H100 80GB HBM3", "nvswitch", 400.0),
    ("H200", "nvswitch", 380.0),
    ("A100-SXM4", "nvswitch", 200.0),
    ("V100-SXM2", "nvlink", 95.0),
)


class SmokeInterrupted(KeyboardInterrupt):
    """Ctrl-C during a smoke run, after every node's processes of the run were ended; says which."""


@dataclass(frozen=True)
class NodePart:
    """One host's part of the run: its rendezvous and the `smoke` verb's arguments (node side's `Request`)."""

    host: str
    rendezvous: Rendezvous
    args: dict[str, Any]
    floor_gbps: float | None = None  # the rig's busbw floor, else the default for its GPUs (None: none)
    min_pcie: tuple[int | None, int | None] = (None, None)  # the rig's (gen, width), judged under load

    @property
    def group(self) -> str:
        return self.rendezvous.master

    @property
    def node_rank(self) -> int:
        return self.rendezvous.node_rank


@dataclass(frozen=True)
class NodeReport:
    host: str
    node_rank: int
    ok: bool
    kind: str | None
    diagnosis: str | None
    ranks: list[dict[str, Any]]
    elapsed_s: float
    launcher: str | None = None  # the installed launcher the node ran; None: torchrun started by smoke
    data_parallel: dict[str, Any] | None = None  # the node's DataParallel row, run after its ranks (CUDA)
    transport: dict[str, Any] | None = None  # what NCCL's log says joined the ranks (node side)
    under_load: list[dict[str, Any]] = field(default_factory=list)  # per GPU while the ranks ran


@dataclass(frozen=True)
class GroupReport:
    """One DDP group's verdict: every node passed, every rank joined, busbw at the largest sizes >= floor."""

    master: str
    endpoint: str
    nnodes: int
    nproc_per_node: int
    expected_world_size: int
    world_size: int | None
    backend: str | None  # what rank 0 used: the rig's backend, or Gloo on simulated nodes; never a fallback
    requested_backend: str  # what the rig file says
    ranks_joined: int
    bandwidth: list[dict[str, Any]]
    busbw_floor_gbps: float | None
    problems: list[str]
    floor_judged: bool = True  # False on simulated nodes (Gloo on the CPU): the floor is not theirs to meet
    nodes: list[NodeReport] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)  # per rank: host, backend, device, GPU
    srun: dict[str, Any] | None = None  # --via srun: the step's job_id, nodes, exit_code, elapsed_s

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class SmokeReport:
    run_id: str
    groups: list[GroupReport]
    notices: list[str] = field(default_factory=list)  # what the user should know even when it passed

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.groups)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "notices": self.notices,
            "groups": [{**dataclasses.asdict(g), "ok": g.ok} for g in self.groups],
        }


def with_ddp(loaded: LoadedRig, hosts: list[Host]) -> tuple[list[Host], list[str]]:
    """The hosts whose rig has a `ddp` section, and a notice naming the others (smoke runs DDP groups, so
    it leaves them out); when none has one, all of them, for `plan_smoke` to refuse."""
    chosen = [h for h in hosts if loaded.rig_of(h).ddp is not None]
    left = [h.name for h in hosts if loaded.rig_of(h).ddp is None]
    if not chosen or not left:
        return hosts, []
    return chosen, [f"skipped {', '.join(left)}: no `ddp` section in their rig (smoke runs DDP groups only)"]


def plan_smoke(loaded: LoadedRig, hosts: list[Host], run_id: str) -> list[NodePart]:
    """Each selected host's part, group by group (master first); errors name what to fix."""
    without = [h.name for h in hosts if loaded.rig_of(h).ddp is None]
    if without:
        raise ProvisionError(
            f"smoke needs a `ddp` section in the rig of {', '.join(without)} (master, port, backend)"
        )
    selected = {h.name for h in hosts}
    groups: dict[str, Rendezvous] = {}
    for host in hosts:
        rendezvous = loaded.rendezvous(host)
        assert rendezvous is not None  # checked above; narrows the type
        groups.setdefault(rendezvous.master, rendezvous)
    parts = []
    for group in groups.values():
        left_out = [name for name in group.members if name not in selected]
        if left_out:
            raise ProvisionError(
                f"smoke runs whole DDP groups: the launchers of {', '.join(group.members)} were written for "
                f"{group.nnodes} nodes, but {', '.join(left_out)} {'is' if len(left_out) == 1 else 'are'} "
                f"not selected; add {'it' if len(left_out) == 1 else 'them'} to --limit"
            )
        for name in group.members:
            parts.append(node_part(loaded, loaded.host(name), run_id))
    return parts


def node_part(loaded: LoadedRig, host: Host, run_id: str) -> NodePart:
    rendezvous = loaded.rendezvous(host)
    assert rendezvous is not None
    smoke = loaded.spec.smoke
    launcher = launcher_path(loaded, host)
    rig = loaded.rig_of(host)
    args = smoke_request(
        node=host.name,
        python=smoke.python,
        run_id=run_id,
        timeout_s=smoke.timeout_s,
        batch_size=smoke.batch_size,
        launcher=launcher,
        sizes_mib=smoke.sizes_mib or (),
        interconnect=interconnect(rig.bridge.kind, rig.gpus.count),
        **rendezvous.settings(),
    )
    floor = smoke.busbw_floor_gbps
    if floor is None and rendezvous.nnodes == 1 and rendezvous.nproc_per_node == 8:
        floor = default_floor(rig.gpus.model, rig.bridge.kind)
    return NodePart(host.name, rendezvous, args, floor, (rig.gpus.min_pcie_gen, rig.gpus.min_pcie_width))


def interconnect(bridge_kind: str, gpu_count: int) -> str:
    """What joins every pair of the rig's GPUs, as the node judges NCCL's transport: a bridge joins all of
    them only on a two-GPU box; elsewhere bridged pairs share the box with pairs that must cross PCIe."""
    if bridge_kind == "nvswitch":
        return "nvswitch"
    if bridge_kind == "nvlink" or (bridge_kind == "nvlink-bridge" and gpu_count == 2):
        return "nvlink"
    return "pcie"


def default_floor(model: str, bridge_kind: str) -> float | None:
    return next((f for name, kind, f in DEFAULT_FLOORS_GBPS if name in model and kind == bridge_kind), None)


def for_this_node(loaded: LoadedRig, host: Host, part: NodePart, facts: Facts) -> dict[str, Any]:
    """The part's arguments completed with what depends on the node (its facts, as apply renders them):
    the env files' variables, and what the launcher and env files must hold before smoke runs them."""
    return {
        **part.args,
        "env": dict(environment(loaded, loaded.rig_of(host), facts)),
        "path_prepend": dict(path_prepends(loaded, loaded.rig_of(host))),
        "files": installed_files(loaded, host, part.args["launcher"], facts),
    }


def installed_files(
    loaded: LoadedRig, host: Host, launcher: str | None, facts: Facts
) -> list[dict[str, str]]:
    """What the node's launcher and env files must hold before smoke runs them: what apply writes now."""
    if launcher is None:  # smoke runs torchrun itself from the rig file: no installed file is used
        return []
    return [
        {
            "role": "launcher" if file.path == launcher else "env file",
            "path": file.path,
            "content": file.content,
            "mode": file.mode,
        }
        for file in desired(HostContext(loaded, host, facts))
    ]


def node_report(part: NodePart, outcome: HostOutcome[dict[str, Any]]) -> NodeReport:
    value = outcome.value
    if outcome.status != "ok" or value is None:
        return NodeReport(
            part.host,
            part.node_rank,
            False,
            outcome.status,
            outcome.error,
            [],
            outcome.elapsed_s,
            part.args["launcher"],
        )
    return NodeReport(
        part.host,
        part.node_rank,
        bool(value.get("ok")),
        value.get("kind"),
        value.get("diagnosis"),
        list(value.get("ranks") or []),
        float(value.get("elapsed_s") or outcome.elapsed_s),
        part.args["launcher"],
        value.get("data_parallel"),
        value.get("transport"),
        list(value.get("under_load") or []),
    )


def load_problems(node: NodeReport, min_pcie: tuple[int | None, int | None]) -> list[str]:
    """What the GPUs showed while busy: a hardware slowdown, or a PCIe link that trained below what the
    device and slot allow (a riser or a dirty slot) or below the rig's minimum."""
    problems = []
    min_gen, min_width = min_pcie
    for gpu in node.under_load:
        where = f"{node.host} GPU {gpu['index']}"
        slow = [FAILING_THROTTLE[r] for r in gpu.get("throttle") or () if r in FAILING_THROTTLE]
        if slow:
            problems.append(
                f"{where} was in {', '.join(slow)} while busy: check its cooling and power (PSU, cables)"
            )
        for unit, seen, most, least in (
            ("gen ", gpu.get("pcie_gen"), gpu.get("pcie_max_gen"), min_gen),
            ("x", gpu.get("pcie_width"), gpu.get("pcie_max_width"), min_width),
        ):
            below = []
            if seen is not None and most is not None and seen < most:
                below.append(f"the {unit}{most} card and slot allow")
            if seen is not None and least is not None and seen < least:
                below.append(f"the rig's {unit}{least}")
            if below:
                problems.append(
                    f"{where}'s PCIe link trained to {unit}{seen} under load, below {' and '.join(below)}: "
                    "reseat the card, check the riser and slot"
                )
    return problems


def judge_group(
    parts: list[NodePart], nodes: list[NodeReport], floor_gbps: float | None = None
) -> GroupReport:
    """Pure: the group passes when every node passed, ranks 0..N-1 each saw world size N, no GPU slowed
    down or ran a trained-down PCIe link while busy, and the busbw of the largest all_reduce sizes reaches
    the floor (`floor_gbps`, else the parts' own: the rig's or the default for its GPUs)."""
    rendezvous = parts[0].rendezvous
    if floor_gbps is None:
        floor_gbps = parts[0].floor_gbps
    expected = rendezvous.world_size
    problems = [f"{n.host}: {n.diagnosis or n.kind or 'failed'}" for n in nodes if not n.ok]
    ranks = {int(r["rank"]): r for n in nodes for r in n.ranks if "rank" in r}
    missing = sorted(set(range(expected)) - set(ranks))
    if missing and not problems:
        problems.append(f"ranks {missing} of {expected} never reported")
    wrong = sorted(r for r, res in ranks.items() if res.get("world_size") != expected)
    if wrong:
        problems.append(f"ranks {wrong} saw a world size other than {expected}")
    for node in nodes:
        problems += load_problems(node, parts[0].min_pcie)
    rank0 = ranks.get(0, {})
    bandwidth = list(rank0.get("bandwidth") or [])
    # Simulated nodes run Gloo on the CPU: their bandwidth says nothing of NVLink or the network, so a floor
    # meant for the real GPUs is not judged there (the report says so).
    floor_judged = not ranks or not all(r.get("simulated") for r in ranks.values())
    if floor_gbps is not None and bandwidth and floor_judged:
        # The plateau: the best of the two largest sizes, so one noisy measurement does not decide.
        largest = sorted(bandwidth, key=lambda b: float(b["size_mib"]))[-2:]
        best = max(largest, key=lambda b: float(b["busbw_gbps"]))
        if float(best["busbw_gbps"]) < floor_gbps:
            sizes = " and ".join(f"{float(b['size_mib']):g}" for b in largest)
            problems.append(
                f"all_reduce busbw {best['busbw_gbps']:g} GB/s (the best at {sizes} MiB) is below "
                f"the floor of {floor_gbps:g} GB/s"
            )
    return GroupReport(
        master=rendezvous.master,
        endpoint=rendezvous.endpoint,
        nnodes=rendezvous.nnodes,
        nproc_per_node=rendezvous.nproc_per_node,
        expected_world_size=expected,
        world_size=rank0.get("world_size"),
        backend=rank0.get("backend"),
        requested_backend=rendezvous.backend,
        ranks_joined=len(ranks),
        bandwidth=bandwidth,
        busbw_floor_gbps=floor_gbps,
        floor_judged=floor_judged,
        problems=problems,
        nodes=nodes,
        devices=[rank_device(node.host, result) for node in nodes for result in node.ranks],
    )


def rank_device(host: str, result: dict[str, Any]) -> dict[str, Any]:
    """Where one rank ran, from its result: which backend, on what device (GPU name, index and UUID)."""
    keys = ("rank", "backend", "device", "gpu", "simulated")
    return {"host": host, **{key: result.get(key) for key in keys}}


NO_LAUNCHER = (
    "files.launcher is null: smoke started torchrun itself with the rig file's rendezvous and environment; "
    "no installed launcher or env file was run or checked"
)


def notices(parts: list[NodePart]) -> list[str]:
    return [NO_LAUNCHER] if any(part.args["launcher"] is None for part in parts) else []


def build_report(
    run_id: str,
    parts: list[NodePart],
    outcomes: Mapping[str, HostOutcome[dict[str, Any]]],
    floor_gbps: float | None,
) -> SmokeReport:
    groups: dict[str, list[NodePart]] = {}
    for part in parts:
        groups.setdefault(part.group, []).append(part)
    return SmokeReport(
        run_id,
        [
            judge_group(members, [node_report(p, outcomes[p.host]) for p in members], floor_gbps)
            for members in groups.values()
        ],
        notices(parts),
    )


def new_run_id() -> str:
    return f"mgpu-smoke-{uuid.uuid4().hex[:12]}"


def run_smoke(
    loaded: LoadedRig,
    hosts: list[Host],
    targets: list[HostTarget],
    options: FleetOptions,
    on_node_done: Callable[[str, bool], None] | None = None,
) -> SmokeReport:
    """Run the smoke on every selected host at once; hosts whose call failed get a cleanup call after."""
    run_id = new_run_id()
    hosts, skipped = with_ddp(loaded, hosts)
    parts = plan_smoke(loaded, hosts, run_id)
    if len(parts) > MAX_FORKS:
        raise ProvisionError(f"smoke starts every node at once; {len(parts)} hosts exceed {MAX_FORKS}")
    by_host = {p.host: p for p in parts}
    chosen = [t for t in targets if t.name in by_host]
    timeout = loaded.spec.smoke.timeout_s + CALL_MARGIN_S

    stopping = threading.Event()  # set on Ctrl-C: a node still reading its facts starts no run after

    def call(session: AgentSession) -> dict[str, Any]:
        name = session.target.name
        host = loaded.host(name)
        try:
            facts = read_facts(session, facts_request(loaded, host))
            args = for_this_node(loaded, host, by_host[name], facts)
            if stopping.is_set():
                raise ProvisionError("interrupted before the run started")
            result = read_reply(session, "smoke", args, SmokeReply, timeout).model_dump()
        except Exception:
            if on_node_done is not None:
                on_node_done(name, False)
            raise
        if on_node_done is not None:
            on_node_done(name, bool(result.get("ok")))
        return result

    def clean_up(hosts: list[HostTarget]) -> dict[str, HostOutcome[CleanupReply]]:
        # The node's own deadline ends its processes anyway; this ends them now, even if that call died.
        return run_fleet(
            hosts,
            lambda s: read_reply(
                s,
                "smoke-cleanup",
                smoke_cleanup_request(run_id, by_host[s.target.name].node_rank),
                CleanupReply,
                CLEANUP_TIMEOUT_S,
            ),
            dataclasses.replace(options, forks=len(hosts)),
        )

    try:
        # A DDP group with a member still queued behind a fork limit can never complete: start them all.
        outcomes = run_fleet(chosen, call, dataclasses.replace(options, forks=len(chosen)))
    except KeyboardInterrupt:
        # Ending the run's processes on every node also ends the smoke calls waiting for them.
        stopping.set()
        raise SmokeInterrupted(interrupted_line(run_id, clean_up(chosen))) from None
    failed = [t for t in chosen if outcomes[t.name].status != "ok"]
    if failed:
        clean_up(failed)
    report = build_report(run_id, parts, outcomes, None)  # each part carries its floor
    return dataclasses.replace(report, notices=[*skipped, *report.notices])


def interrupted_line(run_id: str, cleaned: Mapping[str, HostOutcome[Any]]) -> str:
    """What Ctrl-C stopped: the nodes whose processes of the run were ended, and those that could not be
    reached to end them (their own deadline ends them)."""
    ended = [name for name, outcome in cleaned.items() if outcome.status == "ok"]
    missed = [f"{name} ({outcome.error})" for name, outcome in cleaned.items() if outcome.status != "ok"]
    line = f"smoke run {run_id} stopped; its processes were ended on {', '.join(ended) or 'no node'}"
    return line + (f"; not reached: {', '.join(missed)}" if missed else "")
