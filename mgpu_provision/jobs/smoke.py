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
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ProvisionError
from ..facts import Facts
from ..fleet.options import MAX_FORKS, FleetOptions
from ..fleet.pool import HostOutcome, run_fleet
from ..fleet.replies import CleanupReply, SmokeReply
from ..fleet.session import AgentSession, read_facts, read_reply
from ..fleet.targets import HostTarget
from ..judge.health import FAILING_THROTTLE
from ..plan.change import HostContext
from ..plan.files import node_path
from ..plan.host import facts_request
from ..plan.resources.envfiles import desired, environment, launcher_path, path_prepends
from ..protocol import DATA_PARALLEL_TIMEOUT_S, smoke_cleanup_request, smoke_request
from ..rig.rig import LoadedRig, Rendezvous
from .smoke_baseline import entry_of, group_key, spread
from .smoke_baseline import judge as judge_baseline
from .smoke_baseline import record as write_baseline
from .smoke_isolate import DEFAULT_BUDGET_S, Isolation, RunRound, Trial, bisect, pairwise

if TYPE_CHECKING:
    from ..rig.models import Host

# Beyond the node's own deadline: the torch probe, the SIGTERM/SIGKILL grace, the SSH round trip, and the
# DataParallel process that a CUDA node runs after its ranks.
CALL_MARGIN_S = 90.0 + DATA_PARALLEL_TIMEOUT_S
CLEANUP_TIMEOUT_S = 30.0
# Default all_reduce busbw floors where a public figure exists, for one node on its switch/mesh (GPU model
# as NVML names it, rig bridge kind, GPUs per node): Azure's health checks (azurehpc-health-checks, conf/
# nd96isr_h100_v5.conf, nd96isr_h200_v5.conf, nd96asr_v4.conf, nd40rs_v2.conf, nd128isr_ndr_gb200_v6.conf:
# check_nccl_allreduce) pass 8x H100 at 460, 8x H200 at 431, 8x A100 at 228, 8x V100 at 110 and 4x GB200 at
# 432 GB/s, measured at 8 to 16 GiB; smoke stops at 4 GiB, below the plateau, so the floors keep a margin
# under those figures. B200 has none: no public all_reduce pass mark was found for an HGX B200 node.
DEFAULT_FLOORS_GBPS = (
    ("H100 80GB HBM3", "nvswitch", 8, 400.0),
    ("H200", "nvswitch", 8, 380.0),
    ("A100-SXM4", "nvswitch", 8, 200.0),
    ("V100-SXM2", "nvlink", 8, 95.0),
    ("GB200", "nvswitch", 4, 380.0),
)
# What a node's answer says when it failed before any of its ranks ran: it names itself, with its reason.
PRE_RUN_KINDS = frozenset(
    {"unreachable", "failed", "error", "not-applied", "torch-missing", "python-broken", "no-cuda"}
)
# A node whose ranks smoke ended because another node of its group had failed: it is not the bad one.
STOPPED = "stopped"


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
    network: tuple[str | None, bool] = (None, False)  # the rig's ddp.fabric and ddp.gpudirect_rdma

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
    baseline: dict[str, Any] | None = None  # the box's smoke baseline as it answered: record, problem


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
    baseline: dict[str, Any] | None = None  # the box's own figure it was judged against (smoke_baseline)
    isolation: dict[str, Any] | None = None  # the search for the bad node (smoke_isolate.Isolation)
    burn_in: dict[str, Any] | None = None  # --burn-in: the spread of the plateau busbw over the runs

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
    if floor is None and rendezvous.nnodes == 1:
        floor = default_floor(rig.gpus.model, rig.bridge.kind, rendezvous.nproc_per_node)
    ddp = rig.ddp
    return NodePart(
        host.name,
        rendezvous,
        args,
        floor,
        (rig.gpus.min_pcie_gen, rig.gpus.min_pcie_width),
        (ddp.fabric, ddp.gpudirect_rdma) if ddp is not None else (None, False),
    )


def interconnect(bridge_kind: str, gpu_count: int) -> str:
    """What joins every pair of the rig's GPUs, as the node judges NCCL's transport: a bridge joins all of
    them only on a two-GPU box; elsewhere bridged pairs share the box with pairs that must cross PCIe."""
    if bridge_kind == "nvswitch":
        return "nvswitch"
    if bridge_kind == "nvlink" or (bridge_kind == "nvlink-bridge" and gpu_count == 2):
        return "nvlink"
    return "pcie"


def default_floor(model: str, bridge_kind: str, gpus: int = 8) -> float | None:
    return next(
        (
            f
            for name, kind, n, f in DEFAULT_FLOORS_GBPS
            if name in model and kind == bridge_kind and n == gpus
        ),
        None,
    )


def for_this_node(loaded: LoadedRig, host: Host, part: NodePart, facts: Facts) -> dict[str, Any]:
    """The part's arguments completed with what depends on the node (its facts, as apply renders them):
    the env files' variables, and what the launcher and env files must hold before smoke runs them."""
    return {
        **part.args,
        "env": dict(environment(loaded, loaded.rig_of(host), facts)),
        "path_prepend": dict(path_prepends(loaded, loaded.rig_of(host))),
        "files": installed_files(loaded, host, part.args["launcher"], facts),
        "state_dir": node_path(loaded, host, loaded.spec.files.state_dir),
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
        value.get("baseline"),
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


def network_problems(node: NodeReport, network: tuple[str | None, bool]) -> list[str]:
    """What NCCL's own channel lines to other nodes say against the rig's network: an InfiniBand or RoCE
    fabric that NCCL left for sockets (`NET/Socket`, src/transport/net.cc), or no `/GDRDMA` where the rig
    expects GPUDirect RDMA. The line is quoted."""
    fabric, gdr = network
    lines = (node.transport or {}).get("inter_lines") or {}
    problems = []
    sockets = [line for via, line in sorted(lines.items()) if via.startswith("NET/Socket")]
    if fabric in ("infiniband", "roce") and sockets:
        problems.append(
            f"{node.host}: the rig's fabric is {fabric}, but NCCL fell back to sockets between nodes "
            f"(no usable HCA, or NCCL_IB_DISABLE / NCCL_NET set?): {sockets[0]}"
        )
    plain = [line for via, line in sorted(lines.items()) if via.startswith("NET/") and "/GDRDMA" not in via]
    if gdr and plain:
        problems.append(
            f"{node.host}: the rig expects GPUDirect RDMA, but NCCL's channels to other nodes do not use it "
            f"(nvidia-peermem loaded? NIC and GPU under one PCIe switch?): {plain[0]}"
        )
    return problems


def plateau_gbps(bandwidth: list[dict[str, Any]]) -> float | None:
    """The busbw the floor is judged on: the best of the two largest sizes; None without a measurement."""
    largest = sorted(bandwidth, key=lambda b: float(b["size_mib"]))[-2:]
    return max((float(b["busbw_gbps"]) for b in largest), default=None)


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
    # The nodes that failed by themselves first: the first problem is what a trial of the search says.
    failed = sorted((n for n in nodes if not n.ok), key=lambda n: n.kind == STOPPED)
    problems = [f"{n.host}: {n.diagnosis or n.kind or 'failed'}" for n in failed]
    ranks = {int(r["rank"]): r for n in nodes for r in n.ranks if "rank" in r}
    missing = sorted(set(range(expected)) - set(ranks))
    if missing and not problems:
        problems.append(f"ranks {missing} of {expected} never reported")
    wrong = sorted(r for r, res in ranks.items() if res.get("world_size") != expected)
    if wrong:
        problems.append(f"ranks {wrong} saw a world size other than {expected}")
    for node in nodes:
        problems += load_problems(node, parts[0].min_pcie) + network_problems(node, parts[0].network)
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


@dataclass(frozen=True)
class SmokeOptions:
    """What a smoke run does beyond one run of every group."""

    pairs: bool = False  # every group pairwise too, pass or fail: acceptance of new nodes
    isolate: bool = True  # a failing group is bisected down to its bad node
    budget_s: float = DEFAULT_BUDGET_S  # the searches start no round past this many seconds
    burn_in_s: float | None = None  # repeat the whole run this long; the spread goes into the baseline


class PeerStop:
    """Ends the rest of a DDP group once one of its nodes has failed, instead of letting them wait.

    A node whose ranks died before the process group formed (or that never started them) leaves its peers
    waiting for it at the rendezvous or in the process group's first collective until their timeout (half
    the smoke timeout): every run with a bad node, and every round of the search for it, cost that much.
    Its failure now ends the peers' runs at once, and those peers are reported as stopped by it, not as
    failures of their own: the run's processes on the others are ended by `end` (the smoke-cleanup verb),
    again every `every_s` while a peer is still in its call (one still reading its facts, checking its
    files or torch has no process to end yet), for at most `for_s`. A peer still reading its facts makes
    its call all the same: skipping it (as before) reported a node without torch as stopped, one bad
    node named of two. A peer that failed before its ranks ran (no torch, a stale launcher)
    keeps its own reason; one whose ranks failed by themselves in the same instant may be reported as
    stopped (the search still finds it: its next run has no bad peer)."""

    def __init__(
        self,
        parts: Mapping[str, NodePart],
        end: Callable[[list[str]], object],
        for_s: float,
        every_s: float = 1.0,
    ) -> None:
        self.group_of = {host: part.group for host, part in parts.items()}
        self.running = set(parts)
        self.stopped: dict[str, str] = {}  # peer -> the node whose failure stopped it
        self.end, self.for_s, self.every_s = end, for_s, every_s
        self.lock = threading.Lock()

    def done(self, host: str, ok: bool) -> None:
        with self.lock:
            if host not in self.running:
                return
            self.running.discard(host)
            if ok or host in self.stopped:
                return
            peers = sorted(h for h in self.running if self.group_of[h] == self.group_of[host])
            peers = [h for h in peers if h not in self.stopped]
            self.stopped.update(dict.fromkeys(peers, host))
        deadline = time.monotonic() + self.for_s
        while peers:
            self.end(peers)
            time.sleep(self.every_s)
            with self.lock:
                peers = [h for h in peers if h in self.running]
            if time.monotonic() > deadline:
                return

    def relabel(self, outcomes: Mapping[str, HostOutcome[dict[str, Any]]]) -> dict[str, HostOutcome[Any]]:
        """The outcomes, each failed peer's as stopped by the node that failed."""
        found = dict(outcomes)
        for host, by in self.stopped.items():
            got = found[host]
            value = got.value or {}
            failed = got.status == "ok" and value and not value.get("ok")
            if failed and value.get("kind") not in PRE_RUN_KINDS:  # a pre-run failure was its own
                found[host] = dataclasses.replace(got, value={**value, **stopped_reply(by)})
        return found


def stopped_reply(by: str) -> dict[str, Any]:
    """What a peer's smoke call says when PeerStop ended it for `by`."""
    return {"ok": False, "kind": STOPPED, "diagnosis": f"stopped after {by} failed"}


class SmokeRun:
    """One `smoke` command's runs over the fleet: the full run, then the smaller ones that name a bad node.
    Every run starts all its nodes at once; the first failure in a DDP group ends the rest of it
    (`PeerStop`); hosts whose call failed get a cleanup call after."""

    def __init__(
        self,
        loaded: LoadedRig,
        parts: list[NodePart],
        targets: list[HostTarget],
        options: FleetOptions,
        on_node_done: Callable[[str, bool], None] | None,
    ) -> None:
        self.loaded, self.options, self.on_node_done = loaded, options, on_node_done
        self.by_host = {p.host: p for p in parts}
        self.targets = [t for t in targets if t.name in self.by_host]
        self.timeout = loaded.spec.smoke.timeout_s + CALL_MARGIN_S
        self.sent: dict[str, dict[str, Any]] = {}  # the full run's arguments per node, for the smaller runs
        self.trials = 0
        self.round_s = 0.0  # how long the last run took: what the next round is expected to take

    def full(self, run_id: str) -> tuple[SmokeReport, Mapping[str, HostOutcome[dict[str, Any]]]]:
        parts = {
            name: dataclasses.replace(p, args={**p.args, "run_id": run_id})
            for name, p in self.by_host.items()
        }
        stopping = threading.Event()  # set on Ctrl-C: a node still reading its facts starts no run after

        def args_of(session: AgentSession) -> dict[str, Any]:
            name = session.target.name
            host = self.loaded.host(name)
            facts = read_facts(session, facts_request(self.loaded, host))
            self.sent[name] = for_this_node(self.loaded, host, parts[name], facts)
            if stopping.is_set():
                raise ProvisionError("interrupted before the run started")
            return self.sent[name]

        outcomes = self.run(parts, args_of, stopping, report=True)
        return build_report(run_id, list(parts.values()), outcomes, None), outcomes  # each part: its floor

    def run(
        self,
        parts: Mapping[str, NodePart],
        args_of: Callable[[AgentSession], dict[str, Any]],
        stopping: threading.Event | None = None,
        report: bool = False,
    ) -> Mapping[str, HostOutcome[dict[str, Any]]]:
        chosen = [t for t in self.targets if t.name in parts]
        started = time.monotonic()
        by_name = {t.name: t for t in chosen}
        # Past the rendezvous timeout (a quarter of the smoke timeout, node side) a peer fails by itself.
        stop_for = self.loaded.spec.smoke.timeout_s * 0.25
        peers = PeerStop(parts, lambda hosts: self.clean_up([by_name[h] for h in hosts], parts), stop_for)
        called: set[str] = set()
        then = self.options.on_host_done

        def host_done(name: str) -> None:
            if name not in called:  # no session: unreachable, which its peers need not wait for
                peers.done(name, False)
            if then is not None:
                then(name)

        def call(session: AgentSession) -> dict[str, Any]:
            name = session.target.name
            called.add(name)
            try:
                args = args_of(session)
                # Even when a peer failed already: a run it starts is ended (`end`), and its own
                # pre-run failure (no torch, a stale launcher) names it too.
                result = read_reply(session, "smoke", args, SmokeReply, self.timeout).model_dump()
            except Exception:
                peers.done(name, False)
                if report and self.on_node_done is not None:
                    self.on_node_done(name, False)
                raise
            peers.done(name, bool(result.get("ok")))
            if report and self.on_node_done is not None:
                self.on_node_done(name, bool(result.get("ok")))
            return result

        try:
            # A DDP group with a member still queued behind a fork limit can never complete: start them all.
            run = dataclasses.replace(self.options, forks=len(chosen), on_host_done=host_done)
            outcomes = run_fleet(chosen, call, run)
        except KeyboardInterrupt:
            # Ending the run's processes on every node also ends the smoke calls waiting for them.
            if stopping is not None:
                stopping.set()
            run_id = next(iter(parts.values())).args["run_id"]
            raise SmokeInterrupted(interrupted_line(run_id, self.clean_up(chosen, parts))) from None
        failed = [t for t in chosen if outcomes[t.name].status != "ok"]
        if failed:
            self.clean_up(failed, parts)
        self.round_s = time.monotonic() - started
        return peers.relabel(outcomes)

    def clean_up(
        self, hosts: list[HostTarget], parts: Mapping[str, NodePart]
    ) -> dict[str, HostOutcome[CleanupReply]]:
        # The node's own deadline ends its processes anyway; this ends them now, even if that call died.
        def call(s: AgentSession) -> CleanupReply:
            part = parts[s.target.name]
            request = smoke_cleanup_request(part.args["run_id"], part.node_rank)
            return read_reply(s, "smoke-cleanup", request, CleanupReply, CLEANUP_TIMEOUT_S)

        return run_fleet(hosts, call, dataclasses.replace(self.options, forks=len(hosts)))

    def trial_round(self, run_id: str, groups: list[tuple[str, ...]]) -> list[Trial]:
        """Each of `groups` as a DDP group of its own, without the installed launchers (they were written for
        the whole group): those that share no node at once, on ports from the rig's upwards."""
        waves: list[list[tuple[str, ...]]] = []
        for nodes in groups:
            wave = next((w for w in waves if not any(set(nodes) & set(other) for other in w)), None)
            if wave is None:
                waves.append([nodes])
            else:
                wave.append(nodes)
        found: dict[tuple[str, ...], Trial] = {}
        spent = 0.0
        for wave in waves:
            parts: dict[str, NodePart] = {}
            for index, nodes in enumerate(wave):
                self.trials += 1
                trial_id = f"{run_id}-t{self.trials}"
                parts.update(self.trial_parts(nodes, trial_id, index))
            outcomes = self.run(parts, prepared(parts))
            spent += self.round_s
            for nodes in wave:
                members = [parts[name] for name in nodes]
                group = judge_group(members, [node_report(p, outcomes[p.host]) for p in members])
                why = group.problems[0] if group.problems else None
                found[nodes] = Trial(nodes, group.ok, plateau_gbps(group.bandwidth), why)
        self.round_s = spent
        return [found[nodes] for nodes in groups]

    def trial_parts(self, nodes: tuple[str, ...], trial_id: str, index: int) -> dict[str, NodePart]:
        first = self.by_host[nodes[0]]
        rendezvous = first.rendezvous._replace(
            master=nodes[0],
            members=nodes,
            master_addr=self.loaded.host(nodes[0]).target,
            port=first.rendezvous.port + index,
            rdzv_id=trial_id,
        )
        parts = {}
        for rank, name in enumerate(nodes):
            own = rendezvous._replace(node_rank=rank)
            args = {**self.sent[name], **own.settings(), "run_id": trial_id, "launcher": None, "files": []}
            parts[name] = dataclasses.replace(self.by_host[name], rendezvous=own, args=args, floor_gbps=None)
        return parts

    def isolate(self, run_id: str, group: GroupReport, how: SmokeOptions) -> GroupReport:
        """The group with the search for its bad node, when it failed (or always, with `--pairs`)."""
        if group.ok and not how.pairs:
            return group
        named = {n.host: n.diagnosis or n.kind or "failed" for n in group.nodes if n.kind in PRE_RUN_KINDS}
        named.update(
            {n.host: "no smoke call reached it" for n in group.nodes if n.host not in self.sent | named}
        )
        if named:  # a node that failed before any rank ran names itself: no run without it can say more
            isolation = Isolation("none", sorted(named), named, note="named by its own failure")
        else:
            started = time.monotonic()
            estimate = self.round_s

            def time_left() -> bool:
                return time.monotonic() - started + max(estimate, self.round_s) <= how.budget_s

            members = [n.host for n in group.nodes]
            trials: RunRound = lambda groups: self.trial_round(run_id, groups)  # noqa: E731
            if how.pairs:
                isolation = pairwise(members, trials, time_left)
            else:
                isolation = bisect(members, trials, time_left, group.problems[0] if group.problems else None)
        problems = list(group.problems)
        if isolation.culprits:
            problems.append(
                f"bad node{'s' if len(isolation.culprits) > 1 else ''}: "
                + "; ".join(isolation.evidence[n] for n in isolation.culprits)
            )
        elif not group.ok:
            problems.append(f"no single bad node found ({isolation.mode}): {isolation.note}")
        return dataclasses.replace(group, problems=problems, isolation=isolation.as_dict())


def prepared(parts: Mapping[str, NodePart]) -> Callable[[AgentSession], dict[str, Any]]:
    """A smaller run's arguments, made before it starts."""
    return lambda session: parts[session.target.name].args


def run_smoke(
    loaded: LoadedRig,
    hosts: list[Host],
    targets: list[HostTarget],
    options: FleetOptions,
    on_node_done: Callable[[str, bool], None] | None = None,
    how: SmokeOptions = SmokeOptions(),
) -> SmokeReport:
    """Run the smoke on every selected host at once (again and again for a burn-in); judge each group
    against its floor and its own baseline; search a failing group for its bad node; record the baseline
    of each group that passed."""
    run_id = new_run_id()
    hosts, skipped = with_ddp(loaded, hosts)
    parts = plan_smoke(loaded, hosts, run_id)
    if len(parts) > MAX_FORKS:
        raise ProvisionError(f"smoke starts every node at once; {len(parts)} hosts exceed {MAX_FORKS}")
    smoke = SmokeRun(loaded, parts, targets, options, on_node_done)
    report, _ = smoke.full(run_id)
    figures: dict[str, list[float]] = {g.master: [] for g in report.groups}
    burn_in_until = time.monotonic() + (how.burn_in_s or 0.0)
    while True:
        for group in report.groups:
            figure = plateau_gbps(group.bandwidth)
            if figure is not None:
                figures[group.master].append(figure)
        runs = max(len(f) for f in figures.values()) if figures else 0
        # A burn-in repeats at least once: a spread needs two figures.
        if not how.burn_in_s or not report.ok or (time.monotonic() >= burn_in_until and runs >= 2):
            break
        report, _ = smoke.full(new_run_id())
    notices = [*skipped, *report.notices]
    groups = []
    drop = loaded.spec.smoke.baseline_drop
    for group in report.groups:
        key = baseline_key(group)
        answers = {node.host: node.baseline for node in group.nodes}
        problem, compared, said = judge_baseline(
            key, plateau_gbps(group.bandwidth), answers, drop, time.time()
        )
        notices += said
        spread_of = spread(figures[group.master]) if how.burn_in_s and figures[group.master] else None
        group = dataclasses.replace(
            group, problems=[*group.problems, *([problem] if problem else [])], baseline=compared,
            burn_in=spread_of,
        )  # fmt: skip
        if how.isolate or how.pairs:
            group = smoke.isolate(report.run_id, group, how)
        groups.append(group)
        if group.ok:
            notices += record_baseline(smoke, report.run_id, group, key)
    return SmokeReport(report.run_id, groups, notices)


def baseline_key(group: GroupReport) -> str:
    return group_key([n.host for n in group.nodes], group.nproc_per_node, group.backend)


def record_baseline(smoke: SmokeRun, run_id: str, group: GroupReport, key: str) -> list[str]:
    """Write a passing group's figures to each of its nodes; a notice for each node that could not take
    them."""
    figure = plateau_gbps(group.bandwidth)
    if figure is None:
        return []
    entry = entry_of(figure, run_id, group.burn_in)
    pairs = {
        name: trial["busbw_gbps"]
        for trial in ((group.isolation or {}).get("rounds") or [[]])[0]
        for name in trial["nodes"]
        if trial["ok"] and trial["busbw_gbps"] is not None
    }
    per_node = {
        n.host: {"group": key, "busbw_gbps": figure, "pair_busbw_gbps": pairs.get(n.host)}
        for n in group.nodes
    }
    state_dirs = {name: smoke.sent[name]["state_dir"] for name in per_node if name in smoke.sent}
    written = write_baseline(smoke.targets, state_dirs, key, entry, per_node, smoke.options)
    return [
        f"{name}: the smoke baseline was not recorded: {outcome.error}"
        for name, outcome in written.items()
        if outcome.status != "ok"
    ]


def interrupted_line(run_id: str, cleaned: Mapping[str, HostOutcome[Any]]) -> str:
    """What Ctrl-C stopped: the nodes whose processes of the run were ended, and those that could not be
    reached to end them (their own deadline ends them)."""
    ended = [name for name, outcome in cleaned.items() if outcome.status == "ok"]
    missed = [f"{name} ({outcome.error})" for name, outcome in cleaned.items() if outcome.status != "ok"]
    line = f"smoke run {run_id} stopped; its processes were ended on {', '.join(ended) or 'no node'}"
    return line + (f"; not reached: {', '.join(missed)}" if missed else "")
