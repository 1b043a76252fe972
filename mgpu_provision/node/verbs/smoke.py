"""The node side of `smoke`: start this node's part of the DDP run under torchrun, bounded, and clean up.

The agent's `smoke` verb calls `run(args)`. It checks that the launcher and env files apply installed are
still what the rig file renders and that the interpreter has torch, writes the smoke program (shipped beside
this module, in the agent zipapp) to a temporary folder, and runs the installed launcher (`mgpu-torchrun`,
which sources the env files and execs torchrun with the group's rendezvous) in its own session with a hard
deadline; with no launcher (`files.launcher: null`) it runs `<python> -m torch.distributed.run` itself.
Whatever happens, every process it started is ended before it answers: torchrun puts each worker in a
session of its own, so the workers are found by a marker variable in their environment (a /proc scan), not
by process group. The ranks' result files are the verdict: once every local rank has written one, smoke ends
torchrun itself rather than let it wait in its exit barrier for peers that may never come. On a CUDA run the
DataParallel check follows, alone on the node: the program again, as one process, once torchrun and every
rank have ended (`run_data_parallel`). The answer carries each rank's result, the node's data_parallel row
and, on failure, a diagnosis read from the logs that names the rendezvous endpoint.

`cleanup` (the `smoke-cleanup` verb) ends one node's leftovers of a run when a host's call died.

Stdlib only, Python 3.8: this module runs on the nodes inside the agent zipapp.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from ... import protocol
from ...catalog import envpath
from ...typing_lite import TYPE_CHECKING
from ..core.errors import AgentFailure
from ..host import files, procs, torch_probe
from ..nvidia.backend import Backend
from . import smoke_baseline
from .smoke_program import DATA_PARALLEL_FILE, DATA_PARALLEL_FLAG, data_parallel_row
from .smoke_watch import NCCL_LOG_ENV, LoadSampler, transport, transport_problem

if TYPE_CHECKING:
    from typing import IO, Any

MARKER_ENV = "MGPU_PROVISION_SMOKE"  # value: the run id; every process of a run inherits it
GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long
# After the last local result, how long torchrun may take to leave by itself before smoke ends it: its exit
# barrier normally completes within a second, and a slow peer's agent may still need the store it hosts.
EXIT_GRACE_S = 5.0
POLL_S = 0.2
PROBE_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 15
# Timed all_reduces and warm-ups per size: nccl-tests' defaults (-n 20, -w 5) on GPUs; few on the CPU,
# where Gloo on a simulated node proves the plumbing, not a bandwidth.
GPU_ITERS, GPU_WARMUP_ITERS = 20, 5
CPU_ITERS, CPU_WARMUP_ITERS = 5, 1
SAMPLE_S = 1.0  # clock events and PCIe link of the busy GPUs, this often
# all_reduce sizes when the rig file names none. Over NVLink/NVSwitch busbw still climbs past 256 MiB (NCCL's
# maintainers ask for `all_reduce_perf -b 32 -f 2 -e 8G` on 8-GPU boxes, NVIDIA/nccl issue #583; Azure's
# checks measure at 8 and 16 GiB), so those rigs go to 4 GiB, capped by the GPUs' free memory
# (smoke_program); PCIe boxes plateau well below that; Gloo moves them through the CPU.
NVLINK_SIZES_MIB = [1.0, 16.0, 64.0, 256.0, 1024.0, 4096.0]
GPU_SIZES_MIB = [1.0, 4.0, 16.0, 64.0, 128.0, 256.0]
CPU_SIZES_MIB = [0.25, 1.0, 4.0]


class Request:
    """The verb's arguments (types checked at the agent's door, `protocol.VERB_ARGS["smoke"]`), with defaults.

    python, nnodes, node_rank, nproc_per_node, master_addr, master_port, backend (nccl|gloo), rdzv_backend
    (static|c10d), rdzv_id, timeout_s, batch_size; optional: sizes_mib (default by backend), env (str -> str:
    what the env files set), path_prepend (str -> [str]: what they put in front of PATH and the like),
    run_id (default rdzv_id), node (the name used in messages, default the
    hostname), iters (timed all_reduces per size), launcher (the installed launcher's path, or null), files
    (what the launcher and env files must hold: role, path, content, mode), interconnect (nvlink, nvswitch
    or pcie: what joins the rig's GPUs; picks the sizes and the transport NCCL must use), state_dir (where
    the box's smoke baseline is read from). `simulated`: the agent's twin.
    """

    def __init__(self, args: dict[str, Any], simulated: bool = False) -> None:
        self.simulated = simulated  # the node's NVIDIA layer is a twin: its GPUs cannot run NCCL
        self.python = str(args["python"])
        self.nnodes = int(args["nnodes"])
        self.node_rank = int(args["node_rank"])
        if self.node_rank >= self.nnodes:
            raise AgentFailure(
                "bad-request", f"smoke: node_rank {self.node_rank} must be below nnodes {self.nnodes}"
            )
        self.nproc_per_node = int(args["nproc_per_node"])
        self.master_addr = str(args["master_addr"])
        self.master_port = int(args["master_port"])
        self.backend = str(args["backend"])
        self.rdzv_backend = str(args["rdzv_backend"])
        self.rdzv_id = str(args["rdzv_id"])
        self.run_id = str(args["run_id"] or self.rdzv_id)
        self.timeout_s = float(args["timeout_s"])
        self.batch_size = int(args["batch_size"])
        interconnect = args["interconnect"]
        self.interconnect: str | None = str(interconnect) if interconnect else None
        gpu = self.run_backend == "nccl"
        sizes = args["sizes_mib"]
        if not sizes:
            linked = self.interconnect in ("nvlink", "nvswitch")
            sizes = (NVLINK_SIZES_MIB if linked else GPU_SIZES_MIB) if gpu else CPU_SIZES_MIB
        self.sizes_mib = [float(s) for s in sizes]
        self.iters = int(args["iters"] or (GPU_ITERS if gpu else CPU_ITERS))
        self.warmup_iters = GPU_WARMUP_ITERS if gpu else CPU_WARMUP_ITERS
        self.env: dict[str, str] = dict(args["env"])
        self.path_prepend: dict[str, list[str]] = dict(args["path_prepend"])
        self.node = str(args["node"] or socket.gethostname())
        launcher = args["launcher"]
        self.launcher: str | None = str(launcher) if launcher else None
        self.files: list[dict[str, str]] = list(args["files"])
        self.state_dir: str | None = args["state_dir"]

    @property
    def run_backend(self) -> str:
        """The backend the ranks use: the rig's, except Gloo on a simulated node. Never a quiet fallback:
        NCCL on a node whose torch cannot use CUDA fails the node instead (`probe_torch`)."""
        return "gloo" if self.simulated else self.backend

    @property
    def marker(self) -> str:
        return marker(self.run_id, self.node_rank)

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


def marker(run_id: str, node_rank: int) -> str:
    return f"{run_id}/{node_rank}"


def timeouts(timeout_s: float) -> tuple[int, float]:
    """(rendezvous, process-group) timeouts, well below the hard deadline so that a missing peer is reported
    by torch with the endpoint it waited on before the deadline kills the run without a reason. The
    rendezvous gets a quarter: importing torch alone can take half a minute on a busy node."""
    rendezvous = max(2, int(timeout_s * 0.25))
    return rendezvous, max(2.0, timeout_s * 0.5)


def rendezvous_options(req: Request) -> list[str]:
    """What smoke adds to the launcher's torchrun options: no restarts, and a rendezvous timeout within the
    deadline (torchrun's own default is 900 s for static, 600 s for c10d). Spelled with underscores, which
    every torchrun takes (the hyphens came with torch 2.0), whatever spelling the launcher uses."""
    rendezvous_s, _ = timeouts(req.timeout_s)
    if req.rdzv_backend == "static":
        return ["--max_restarts", "0", "--rdzv_conf", f"timeout={rendezvous_s}"]
    return ["--max_restarts", "0", "--rdzv_conf", f"join_timeout={rendezvous_s},read_timeout={rendezvous_s}"]


def torchrun_command(req: Request, program: str, config: str) -> list[str]:
    """The command of this node's part: the installed launcher with smoke's options and program, or (no
    launcher) torchrun with the rendezvous spelled out as the launcher would."""
    if req.launcher is not None:
        return [req.launcher, *rendezvous_options(req), program, config]
    settings = {
        "nnodes": req.nnodes, "nproc_per_node": req.nproc_per_node, "node_rank": req.node_rank,
        "master_addr": req.master_addr, "master_port": req.master_port, "rdzv_backend": req.rdzv_backend,
        "rdzv_id": req.rdzv_id,
    }  # fmt: skip
    command = [req.python, "-m", "torch.distributed.run"]
    for flag, value in protocol.torchrun_options(req.rdzv_backend):
        command += [flag, value.format(**settings)]
    return [*command, *rendezvous_options(req), program, config]


def program_config(req: Request, out_dir: str) -> dict[str, Any]:
    return {
        "out_dir": out_dir,
        "expected_world_size": req.nnodes * req.nproc_per_node,
        "backend": req.run_backend,
        "requested_backend": req.backend,
        "simulated": req.simulated,
        "batch_size": req.batch_size,
        "sizes_mib": req.sizes_mib,
        "iters": req.iters,
        "warmup_iters": req.warmup_iters,
        "pg_timeout_s": timeouts(req.timeout_s)[1],
    }


def child_environment(req: Request, base: dict[str, str], rig_env: bool = True) -> dict[str, str]:
    """`base` with smoke's own variables; with `rig_env`, also what the env files set (the launcher sources
    them itself, so that a run through it proves the files, not smoke's copy of their values)."""
    env = dict(base)
    if rig_env:
        env.update(req.env)
        for name, entries in req.path_prepend.items():
            env[name] = envpath.prepend(base.get(name), entries)
    env.setdefault("OMP_NUM_THREADS", "1")  # torch's default of one thread per core starves the other ranks
    if req.run_backend == "nccl":
        for name, value in NCCL_LOG_ENV.items():  # the transport NCCL chose, read from its own log
            env.setdefault(name, value)
    env["PYTHONUNBUFFERED"] = "1"  # a killed rank's last words must reach the log
    env[MARKER_ENV] = req.marker
    return env


# Log patterns, most specific first; each yields (kind, message) from the match and the request.
_CONNECT_TIMEOUT = re.compile(r"timed out after (\d+)ms while trying to connect to \(([^,]+), (\d+)\)")
_CLIENTS = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")
_EXCEPTION = re.compile(r"^(?:\[[\w ]+\]:\s*)?([\w.]*(?:Error|Exception)\b:.*)$", re.MULTILINE)
_NCCL = re.compile(r"^.*(NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError|"
                   r"ncclInvalidUsage|NCCL WARN).*$", re.MULTILINE)  # fmt: skip


def diagnose(log: str, req: Request, exit_code: int | None, timed_out: bool) -> tuple[str, str]:
    """Why a run failed, in words that name the endpoint or the error (from torchrun's and the ranks' log)."""
    last = " | ".join(tail(log, 3))
    if re.search(r"No module named '?torch", log):
        return "torch-missing", torch_missing(req)
    if "EADDRINUSE" in log or "address already in use" in log:
        return "port-in-use", f"rendezvous port {req.master_port} on {req.master_addr} is already in use"
    match = _CONNECT_TIMEOUT.search(log)
    if match:
        waited = int(match.group(1)) / 1000.0
        endpoint = f"{match.group(2)}:{match.group(3)}"
        return (
            "rendezvous-unreachable",
            f"rendezvous endpoint {endpoint} unreachable: no answer within {waited:g} s",
        )
    match = _CLIENTS.search(log)
    if match:
        seconds, joined, expected = match.group(1), match.group(2), match.group(3)
        return "rendezvous-timeout", (
            f"timed out waiting for peers at {req.endpoint}: "
            f"{joined} of {expected} nodes joined within {seconds} s"
        )
    if "RendezvousTimeoutError" in log:
        return "rendezvous-timeout", f"timed out waiting for peers at {req.endpoint}"
    if re.search(r"Connection refused|Connection reset by peer", log) and "rendezvous" in log.lower():
        return (
            "rendezvous-unreachable",
            f"rendezvous endpoint {req.endpoint} refused or dropped the connection",
        )
    match = _NCCL.search(log)
    if match:
        return "nccl", f"NCCL error: {match.group(0).strip()}"
    if timed_out:
        return (
            "timeout",
            f"no result within {req.timeout_s:g} s (hung; rendezvous at {req.endpoint}); last lines: {last}",
        )
    # A rank's own exception says why; torchrun's closing summary (ChildFailedError, "Root Cause") does not.
    errors = [m.group(1).strip() for m in _EXCEPTION.finditer(log) if "ChildFailedError" not in m.group(1)]
    if errors:
        return "crash", f"torchrun exited with code {exit_code}: {errors[-1]}"
    return "crash", f"torchrun exited with code {exit_code}; last lines: {last}"


def torch_missing(req: Request) -> str:
    return f"torch is not installed in {req.python} on {req.node}"


_NOISE = (
    "frame #",
    "Traceback (most recent call last)",
    "Failed to initialize NumPy",
    "<omitting python frames>",
)


def tail(log: str, lines: int) -> list[str]:
    """The last lines that say something: indented traceback frames, C++ frames and warnings do not."""
    useful = [
        line.rstrip()
        for line in log.splitlines()
        if line.strip() and not line[0].isspace() and not any(noise in line for noise in _NOISE)
    ]
    return useful[-lines:]


def judge(
    req: Request, ranks: list[dict[str, Any]], exit_code: int | None, timed_out: bool, log: str
) -> dict[str, Any]:
    """The node's verdict: it passes when every local rank reported every check ok, however torchrun
    ended after that (smoke may have ended it in its exit barrier, see `watch`); else the log says why."""
    kind: str | None = None
    diagnosis: str | None = None
    failed = [
        f"rank {r.get('rank')} {c['name']}: {c['detail']}"
        for r in ranks
        for c in r.get("checks", [])
        if not c["ok"]
    ]
    errors = [f"rank {r.get('rank')}: {r['error']}" for r in ranks if r.get("error")]
    if len(ranks) == req.nproc_per_node and not failed and not errors:
        return {"ok": True, "kind": None, "diagnosis": None}
    if timed_out or exit_code not in (0, None):  # None: ended by smoke once every local rank had reported
        kind, diagnosis = diagnose(log, req, exit_code, timed_out)
        if kind == "crash" and errors:
            diagnosis = "; ".join(errors)
    elif failed or errors:
        kind, diagnosis = "check-failed", "; ".join(errors + failed)
    elif len(ranks) != req.nproc_per_node:
        kind = "missing-ranks"
        diagnosis = f"{len(ranks)} of {req.nproc_per_node} local ranks reported a result"
    return {"ok": kind is None, "kind": kind, "diagnosis": diagnosis}


def marked_processes(mark: str) -> list[int]:
    """Pids whose environment carries this marker (Linux /proc; other users' processes are skipped)."""
    needle = f"{MARKER_ENV}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return found


def end_processes(mark: str, leader: subprocess.Popen[bytes] | None = None) -> list[int]:
    """End torchrun and every process of the run (`procs.end_processes`: SIGTERM, SIGKILL after GRACE_S);
    the pids still marked after that (normally none). A second sweep catches workers started meanwhile."""
    for _ in range(2):
        targets = [info for info in map(procs.read_proc, marked_processes(mark)) if info is not None]
        procs.end_processes(targets, GRACE_S)
    if leader is not None:
        leader.wait()
    return marked_processes(mark)


def reported(out_dir: str) -> int:
    """How many local ranks have written their result (each appears whole: written, then renamed)."""
    return len(glob.glob(os.path.join(out_dir, "rank-*.json")))


def watch(
    leader: subprocess.Popen[bytes],
    out_dir: str,
    local_ranks: int,
    deadline: float,
    sampler: LoadSampler | None = None,
) -> str:
    """Wait for torchrun: "exited"; "timeout" at the deadline; or "reported" when every local rank wrote its
    result and torchrun was still there EXIT_GRACE_S later. Its elastic agent then sits in an exit barrier
    for up to 300 s (a value torchrun's command line cannot change) waiting for the peers' agents; a peer
    agent whose worker failed after its result never arrives. The results already say all a smoke needs.
    Until the results are in, `sampler` reads the busy GPUs every SAMPLE_S."""
    reported_at: float | None = None
    sampled_at = 0.0
    while leader.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        if sampler is not None and reported_at is None and now - sampled_at >= SAMPLE_S:
            sampler.sample()
            sampled_at = now
        if reported_at is None and reported(out_dir) >= local_ranks:
            reported_at = now
        if reported_at is not None and now - reported_at >= EXIT_GRACE_S:
            return "reported"
        time.sleep(POLL_S)
    return "exited"


def start(command: list[str], log_file: IO[bytes], env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
    """A process of the run: no stdin, its output in the run's log, and a session of its own (one group to
    signal, apart from the agent's own)."""
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )


def data_parallel_command(req: Request, program: str, config: str) -> list[str]:
    return [req.python, program, DATA_PARALLEL_FLAG, config]


def run_data_parallel(
    req: Request, program: str, config: str, out_dir: str, env: dict[str, str]
) -> dict[str, Any]:
    """The node's data_parallel row, from the program run as one process after torchrun and every rank of
    this node have ended. DataParallel opens a context on every GPU of the node: beside the ranks that is
    refused under EXCLUSIVE_PROCESS compute mode and competes with them for memory. It carries the run's
    marker, so that `end_processes` (and `smoke-cleanup`) end it as they end the ranks."""
    still = marked_processes(req.marker)
    if still:  # never beside a rank: `end_processes` reports these as leftovers and fails the node
        return data_parallel_row(False, f"not run: processes of the DDP run are still alive: {still}")
    log_path = os.path.join(out_dir, "data-parallel.log")
    started = time.monotonic()
    with open(log_path, "wb") as log_file:
        process = start(data_parallel_command(req, program, config), log_file, env, os.path.dirname(out_dir))
        try:
            code: int | None = process.wait(timeout=protocol.DATA_PARALLEL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            end_processes(req.marker, process)
    try:
        with open(os.path.join(out_dir, DATA_PARALLEL_FILE)) as f:
            row: dict[str, Any] = json.load(f)
        return dict(row, elapsed_s=round(time.monotonic() - started, 3))
    except (OSError, ValueError):  # no result: it hung, or died before writing one
        pass
    with open(log_path, "rb") as f:
        last = " | ".join(tail(f.read().decode(errors="replace"), 3))
    if code is None:
        waited = protocol.DATA_PARALLEL_TIMEOUT_S
        return data_parallel_row(False, f"no result within {waited:g} s; last lines: {last}")
    return data_parallel_row(False, f"exited with code {code} without a result; last lines: {last}")


def program_source() -> bytes:
    """The smoke program's bytes through this module's loader: a plain file, or a member of the zipapp."""
    loader: Any = globals()["__loader__"]  # SourceFileLoader or zipimporter: both read files beside us
    data: bytes = loader.get_data(os.path.join(os.path.dirname(__file__), "smoke_program.py"))
    return data


def probe_torch(req: Request) -> dict[str, Any] | None:
    """A failed node result when the interpreter is missing or lacks torch, or when the ranks are to use
    NCCL and torch cannot give each of them a GPU (a CPU-only build, a driver too old for the build, too
    few visible GPUs); else None."""
    env = child_environment(req, dict(os.environ))  # the run's env: PYTHONPATH may be where torch is
    # Not one of the run's processes: a peer's failure ends those (control side's PeerStop), and that
    # must not end this check and leave the node reported as a broken python.
    del env[MARKER_ENV]
    probe = torch_probe.probe_torch(req.python, PROBE_TIMEOUT_S, env=env)
    if not probe["ok"]:
        return failure(req, str(probe.get("kind") or "python-broken"), f"{probe['error']} on {req.node}")
    if req.run_backend != "nccl":
        return None
    torch_here = f"torch {probe.get('version')} in {req.python} on {req.node}"
    if not probe.get("cuda_available"):
        why = (
            "it is a CPU-only build"
            if probe.get("cuda_build") is None
            else probe.get("cuda_warning") or "torch.cuda.is_available() is False"
        )
        return failure(req, "no-cuda", f"the rig says nccl, but {torch_here} cannot use CUDA: {why}")
    count = int(probe.get("device_count") or 0)
    if count < req.nproc_per_node:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        return failure(
            req,
            "no-cuda",
            f"the rig says nccl with {req.nproc_per_node} processes per node, but {torch_here} sees "
            f"{count} GPU(s)" + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""),
        )
    return None


def failure(req: Request, kind: str, diagnosis: str) -> dict[str, Any]:
    return dict(_identity(req), ok=False, kind=kind, diagnosis=diagnosis, exit_code=None, timed_out=False,
                elapsed_s=0.0, ranks=[], data_parallel=None, log_tail=[], leftover_pids=[])  # fmt: skip


def _identity(req: Request) -> dict[str, Any]:
    return {
        "node": req.node,
        "node_rank": req.node_rank,
        "nnodes": req.nnodes,
        "nproc_per_node": req.nproc_per_node,
        "master": req.endpoint,
        "run_id": req.run_id,
        "launcher": req.launcher,
        "backend": req.run_backend,
        "requested_backend": req.backend,
        "simulated": req.simulated,
        "baseline": smoke_baseline.answer(req.state_dir),
    }


def cleanup(args: dict[str, Any]) -> dict[str, Any]:
    """The `smoke-cleanup` verb: end one node's leftovers of a run, for the control side when a host's call
    died (the marker holds the node rank, because test hosts share one process table)."""
    mark = marker(str(args["run_id"]), int(args["node_rank"]))
    return {"marker": mark, "leftover_pids": end_processes(mark)}


def not_applied(req: Request) -> dict[str, Any] | None:
    """A failed node result when the launcher or an env file differs from what apply would write now."""
    found = (files.installed_problem(f["role"], f["path"], f["content"], f["mode"]) for f in req.files)
    problems = [problem for problem in found if problem is not None]
    return failure(req, "not-applied", "; ".join(problems)) if problems else None


def run(args: dict[str, Any], simulated: bool = False, backend: Backend | None = None) -> dict[str, Any]:
    """The `smoke` verb: node, node_rank, nnodes, nproc_per_node, master, run_id, launcher (what ran: the
    installed launcher, or null for torchrun), ok, kind (None or e.g. not-applied, torch-missing,
    port-in-use, rendezvous-unreachable, rendezvous-timeout, nccl, timeout, crash, check-failed), diagnosis,
    exit_code, timed_out, elapsed_s, ranks (the program's per-rank results), data_parallel (the node's
    check row after the ranks, on CUDA runs; else None), transport (what NCCL's log says joined the ranks;
    None when it logged no channel), under_load (each GPU's clock events and PCIe link while the ranks ran,
    read through `backend`), log_tail (on failure) and leftover_pids (processes that survived SIGKILL;
    normally empty)."""
    req = Request(args, simulated)
    refused = not_applied(req) or probe_torch(req)
    if refused is not None:
        return refused
    # Named after the run and node, so that anyone can tell whose folder it is (and that none is left).
    workdir = tempfile.mkdtemp(
        prefix="mgpu-smoke-%s-%d-" % (re.sub(r"[^\w.-]", "_", req.run_id)[:64], req.node_rank)
    )
    try:
        previous = {sig: signal.signal(sig, _stopped) for sig in STOP_SIGNALS}
    except ValueError:  # not the main thread (a caller in this process): its signals stay its own
        previous = {}
    try:
        return _run_in(req, workdir, backend)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# A SIGTERM (a process group stopped: a service manager, a cancelled CI job, a local run's parent) or a
# SIGHUP (a terminal's session gone) ended the agent at once, and the ranks, in a session of their own,
# ran on to their deadline while the work folder stayed. Either now unwinds the verb as Ctrl-C does: the
# run's processes are ended and its folder removed; a second signal during that cleanup is ignored.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stopped(signum: int, frame: object) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def nccl_logs(workdir: str, log: str) -> str:
    """torchrun's log and the ranks' NCCL log files (NCCL_DEBUG_FILE), as one text."""
    texts = [log]
    for path in sorted(glob.glob(os.path.join(workdir, "nccl-*.log"))):
        with open(path, "rb") as f:
            texts.append(f.read().decode(errors="replace"))
    return "\n".join(texts)


def _run_in(req: Request, workdir: str, backend: Backend | None = None) -> dict[str, Any]:
    program = os.path.join(workdir, "mgpu_smoke_program.py")
    with open(program, "wb") as f:
        f.write(program_source())
    out_dir = os.path.join(workdir, "out")
    os.mkdir(out_dir)
    config = os.path.join(workdir, "config.json")
    with open(config, "w") as f:
        json.dump(program_config(req, out_dir), f)
    log_path = os.path.join(workdir, "torchrun.log")

    # torchrun's log folder (torchelastic_*, never deleted by torch) goes into the work folder, deleted after.
    env = dict(child_environment(req, dict(os.environ), rig_env=req.launcher is None), TMPDIR=workdir)
    if req.run_backend == "nccl":  # each rank's NCCL log apart (%h host, %p pid), unless the rig says where
        env.setdefault("NCCL_DEBUG_FILE", os.path.join(workdir, "nccl-%h-%p.log"))
    sampler = LoadSampler(backend if req.run_backend == "nccl" or req.simulated else None)
    started = time.monotonic()
    with open(log_path, "wb") as log_file:
        leader = start(torchrun_command(req, program, config), log_file, env, workdir)
        try:
            ending = watch(leader, out_dir, req.nproc_per_node, started + req.timeout_s, sampler)
        finally:
            leftovers = end_processes(req.marker, leader)
            under_load = sampler.close()
    timed_out = ending == "timeout"
    exit_code = leader.returncode if ending == "exited" else None
    elapsed = time.monotonic() - started

    with open(log_path, "rb") as f:
        log = f.read().decode(errors="replace")
    ranks = []
    for path in glob.glob(os.path.join(out_dir, "rank-*.json")):
        with open(path) as f:
            ranks.append(json.load(f))
    ranks.sort(key=lambda r: int(r.get("rank", -1)))
    verdict = judge(req, ranks, exit_code, timed_out, log)
    links = transport(nccl_logs(workdir, log), {int(r["rank"]) for r in ranks if "rank" in r})
    slow = transport_problem(links, req.interconnect)
    if verdict["ok"] and slow is not None:
        verdict = {"ok": False, "kind": "transport", "diagnosis": slow}
    data_parallel: dict[str, Any] | None = None
    if req.run_backend == "nccl":
        # The environment the launcher gives: the env files' variables, which `not_applied` has just found
        # still installed as the rig file renders them.
        dp_env = dict(child_environment(req, dict(os.environ)), TMPDIR=workdir)
        data_parallel = run_data_parallel(req, program, config, out_dir, dp_env)
        leftovers = marked_processes(req.marker)
        if verdict["ok"] and not data_parallel["ok"]:
            diagnosis = f"data_parallel: {data_parallel['detail']}"
            verdict = {"ok": False, "kind": "check-failed", "diagnosis": diagnosis}
    if leftovers:
        verdict = {"ok": False, "kind": "leftovers", "diagnosis": f"processes survived SIGKILL: {leftovers}"}
    result = _identity(req)
    result.update(verdict)
    result.update(
        exit_code=exit_code,
        timed_out=timed_out,
        elapsed_s=round(elapsed, 3),
        ranks=ranks,
        data_parallel=data_parallel,
        transport=links,
        under_load=under_load,
        under_load_note=sampler.note,
        log_tail=[] if verdict["ok"] else tail(log, LOG_TAIL_LINES),
        leftover_pids=leftovers,
    )
    return result
