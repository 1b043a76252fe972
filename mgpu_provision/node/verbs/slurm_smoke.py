"""The `slurm-smoke` verb: `smoke --via srun`, one Slurm step in place of one SSH call per node.

`prepare` (on every node of the DDP group) checks the installed launcher and env files as `smoke` does and
writes the smoke program and its config to a folder named after the run, the same path on every node, since
one srun command line serves them all. `run` (on one node of the group) starts that step:
`srun --immediate --kill-on-bad-exit=1 -N<nnodes> --ntasks-per-node=1 -w <nodes> --gres=gpu:<nproc>
--cpus-per-task=... [--exclusive, partition, account, reservation] <launcher> <program>`, the
launcher taking node rank, count and master from Slurm's environment; `--immediate` ends the wait for nodes
that Slurm cannot give, and `--kill-on-bad-exit=1` ends every node's part once one rank fails. `collect` (on
every node) reads back the ranks' result files there and removes the folder. The node runs srun: it has
slurm.conf and munge's key, the control machine need not.

Stdlib only, Python 3.8: this module runs on the nodes inside the agent zipapp.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time

from ...typing_lite import TYPE_CHECKING
from ..core.errors import AgentFailure
from ..host.machine import find_tool
from . import smoke

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

IMMEDIATE_S = 10  # how long srun may wait for the nodes before it gives up (without it: forever)
_JOB_ID = re.compile(r"jobid (\d+)|StepId=(\d+)\.")


def workdir(run_id: str) -> str:
    return os.path.join(tempfile.gettempdir(), "mgpu-smoke-" + re.sub(r"[^\w.-]", "_", run_id)[:64])


def prepare(req: smoke.Request) -> Dict[str, Any]:
    refused = smoke.not_applied(req)
    if refused is not None:
        return refused
    if req.launcher is None:
        raise AgentFailure(
            "bad-request", "smoke --via srun runs the installed launcher: files.launcher is null"
        )
    folder = workdir(req.run_id)
    os.makedirs(os.path.join(folder, "out"), exist_ok=True)
    for name, data in (
        ("mgpu_smoke_program.py", smoke.program_source()),
        ("config.json", json.dumps(smoke.program_config(req, os.path.join(folder, "out"))).encode()),
    ):
        # A temporary name of each writer's own, then a rename: nodes that share /tmp write these at once.
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=name + ".")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(folder, name))
    return {"ok": True, "kind": None, "diagnosis": None}


def srun_command(srun: str, req: smoke.Request, nodes: List[str], options: List[str]) -> List[str]:
    """The step's command line; `options` ask Slurm for the GPUs, CPUs, partition... (the control side's
    `plan.resources.slurm.srun_options`), so a cluster with ConstrainDevices=yes lets the ranks see GPUs."""
    folder = workdir(req.run_id)
    return [
        srun, "-v", "--immediate=%d" % IMMEDIATE_S, "--kill-on-bad-exit=1", "-N%d" % req.nnodes,
        "--ntasks-per-node=1", "-w", ",".join(nodes), "--job-name=" + req.run_id,
        "--time=%d" % time_limit_min(req.timeout_s), *options,
        *smoke.torchrun_command(
            req, os.path.join(folder, "mgpu_smoke_program.py"), os.path.join(folder, "config.json")
        ),
    ]  # fmt: skip


def time_limit_min(timeout_s: float) -> int:
    """The job's time limit, in srun's whole minutes, past smoke's own deadline: Slurm ends the step even
    if this node's agent dies before it can."""
    return math.ceil(timeout_s / 60.0) + 1


def job_id(output: str) -> Optional[str]:
    """The job's id, from srun's own words at `-v` ("jobid 12: nodes(2):...")."""
    match = _JOB_ID.search(output)
    return (match.group(1) or match.group(2)) if match else None


def run_step(req: smoke.Request, nodes: List[str], options: List[str]) -> Dict[str, Any]:
    srun = find_tool("srun")
    if srun is None:
        raise AgentFailure("slurm", "srun is not installed on this node (Debian: slurm-client)")
    env = smoke.child_environment(req, dict(os.environ), rig_env=False)
    env.pop("SLURM_JOB_ID", None)  # a step of its own allocation, never of the agent's caller's job
    # srun passes the environment on to every node's task: torchrun's log folder (torchelastic_*, never
    # deleted by torch) goes into the run's folder there, which `collect` removes, as `smoke` does.
    env["TMPDIR"] = workdir(req.run_id)
    started = time.monotonic()
    process = subprocess.Popen(
        srun_command(srun, req, nodes, options), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    code: Optional[int] = None
    try:
        output, _ = process.communicate(timeout=req.timeout_s)
        code = process.returncode
    except subprocess.TimeoutExpired:
        # srun passes SIGTERM on to the step's tasks on every node and ends the step; SIGKILL would leave
        # them to the job's time limit.
        process.terminate()
        try:
            output, _ = process.communicate(timeout=smoke.GRACE_S * 3)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
    elapsed = round(time.monotonic() - started, 3)
    job = job_id(output)
    ok = code == 0
    if ok:
        diagnosis = None
    elif code is None:
        diagnosis = "srun step %s did not end within %g s" % (job or "?", req.timeout_s)
    else:
        said = " | ".join(smoke.tail(output, 3))
        diagnosis = "srun exited with code %d: %s" % (code, said)
    return {
        "ok": ok, "kind": None if ok else ("timeout" if code is None else "srun"), "diagnosis": diagnosis,
        "exit_code": code, "elapsed_s": elapsed, "job_id": job, "nodes": nodes,
        "log_tail": [] if ok else smoke.tail(output, smoke.LOG_TAIL_LINES),
    }  # fmt: skip


def collect(req: smoke.Request) -> Dict[str, Any]:
    folder = workdir(req.run_id)
    ranks = []
    for path in glob.glob(os.path.join(folder, "out", "rank-*.json")):
        with open(path) as f:
            ranks.append(json.load(f))
    shutil.rmtree(folder, ignore_errors=True)
    ranks.sort(key=lambda r: int(r.get("rank", -1)))
    return {"ok": True, "kind": None, "diagnosis": None, "ranks": ranks}


def run(args: Dict[str, Any], simulated: bool = False) -> Dict[str, Any]:
    """`prepare`, `run` (with `nodes`: the group's Slurm node names) or `collect`, as the module says."""
    action = args["action"]
    req = smoke.Request(
        {k: v for k, v in args.items() if k not in ("action", "nodes", "srun_options")}, simulated
    )
    if action == "prepare":
        return prepare(req)
    if action == "run":
        return run_step(req, [str(n) for n in args["nodes"]], [str(o) for o in args["srun_options"]])
    return collect(req)
