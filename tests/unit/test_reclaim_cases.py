"""What reclaim's classifier says about each kind of GPU memory holder: live jobs kept, leftovers ended.

Each case is a process tree as /proc shows it after something happened (a logout, a SIGKILLed torchrun, a
dead training script), the holder the NVIDIA layer names, and the verdict with its reason. A process missing
from the tree is dead. The first cases are the review's: live jobs the old classifier marked for ending.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from mgpu_provision.node.host import procs
from mgpu_provision.node.host.procs import ProcInfo
from mgpu_provision.node.verbs import reclaim
from mgpu_provision.node.verbs.reclaim import OWN_GROUP, Classification
from tests.factories import INIT, SHELL, job, proc, session

RUN = "3f2a9c"


def rank(pid: int, ppid: int, argv: str = "/usr/bin/python3 -u train.py", **kw: object) -> ProcInfo:
    """A torchrun worker: torchrun starts each in a session of its own with its run id in the environment."""
    return session(pid, ppid, argv, **{"torchrun_run": RUN, **kw})


class Case(NamedTuple):
    name: str
    tree: tuple[ProcInfo, ...]  # the live processes besides init; the holder is the last one
    kind: str
    reason: str


LEFTOVER_RANK = f"a torchrun worker whose torchrun is gone (run {RUN})"

CASES = [
    # --- the review's live jobs
    Case(
        "docker run --init: the container's main process under docker-init",
        (
            session(900, 1, "/usr/bin/containerd-shim-runc-v2 -id 4f1c", comm="containerd-shim"),
            session(901, 900, "/sbin/docker-init -- python serve.py", comm="docker-init"),
            proc(902, 901, "python serve.py", pgid=902, sid=901),
        ),
        "attached",
        OWN_GROUP,
    ),
    Case(
        "a container's main process under tini",
        (session(901, 1, "tini -- python serve.py", comm="tini"), proc(902, 901, pgid=902, sid=901)),
        "attached",
        OWN_GROUP,
    ),
    Case(
        "nohup python train.py & from an interactive shell, after logout",
        (job(200, 1, ignores_hup=True),),
        "attached",
        OWN_GROUP,
    ),
    Case(
        "nohup python train.py & from a script or `ssh host '...'`, after its shell exited",
        (proc(200, 1, pgid=190, sid=190, ignores_hup=True),),
        "attached",
        "it ignores SIGHUP: started with nohup to outlive its shell",
    ),
    Case("a setsid'd job", (session(200, 1),), "attached", OWN_GROUP),
    # --- leftovers
    Case(
        "torchrun SIGKILLed: rank 0 left behind",
        (rank(301, 1), rank(302, 1)),
        "orphaned",
        LEFTOVER_RANK,
    ),
    Case(
        "torchrun SIGKILLed: rank 1 left behind, owner logged in",
        (SHELL, rank(301, 1), rank(302, 1)),
        "orphaned",
        LEFTOVER_RANK,
    ),
    Case(
        "torchrun --no-python run.sh SIGKILLed: the python under the leftover shell rank",
        (rank(310, 1, "bash run.sh"), proc(311, 310, pgid=310, sid=310, torchrun_run=RUN)),
        "orphaned",
        f"its process group leader pid 310 (bash) is left over: {LEFTOVER_RANK}",
    ),
    Case(
        "DataLoader worker whose main process was killed",
        (proc(401, 1, "python train.py", comm="pt_data_worker", pgid=400, sid=400),),
        "orphaned",
        "its process group and session leaders (pid 400) are gone: the job that started it has ended",
    ),
    Case(
        "a worker whose job leader and login shell are both gone",
        (proc(401, 1, pgid=400),),
        "orphaned",
        "its process group and session leaders (pids 400, 50) are gone: the job that started it has ended",
    ),
    Case(
        "a service's leftover child after its main process was restarted",
        (proc(72, 1, "inferd-worker", pgid=71, sid=71, unit="inferd.service"),),
        "orphaned",
        "its process group and session leaders (pid 71) are gone: the job that started it has ended",
    ),
    Case(
        "a defunct leader whose threads run on",
        (job(200, 50, state="Z"),),
        "orphaned",
        "zombie: its main thread exited, other threads still hold the GPU",
    ),
    # --- live jobs
    Case(
        "a rank of a live torchrun",
        (SHELL, job(300, 50, "torchrun --nproc-per-node 2 train.py", comm="pt_elastic"), rank(301, 300)),
        "torchrun",
        "part of the live torchrun job of pid 300 (pt_elastic)",
    ),
    Case(
        "a service's main process",
        (session(70, 1, "/usr/bin/inferd --port 9000", unit="inferd.service"),),
        "attached",
        "a service's main process (inferd.service)",
    ),
    Case(
        "a service's main process whose main thread exited while others serve on",
        (session(70, 1, "/usr/bin/inferd --port 9000", unit="inferd.service", state="Z"),),
        "attached",
        "a service's main process (inferd.service)",
    ),
    Case(
        "a DataLoader worker of a live training script",
        (SHELL, job(400, 50), proc(401, 400, pgid=400)),
        "attached",
        "its process group leader pid 400 (python) is alive",
    ),
    Case(
        "the second command of a pipeline whose first command finished",
        (SHELL, proc(401, 50, pgid=400)),
        "attached",
        "its session leader pid 50 (bash) is alive",
    ),
    Case(
        "a worker whose main process died while its owner is still logged in",
        (SHELL, proc(401, 1, comm="pt_data_worker", pgid=400)),
        "attached",
        "its session leader pid 50 (bash) is alive",
    ),
]


def lookup(*tree: ProcInfo) -> procs.Lookup:
    by_pid = {p.pid: p for p in (INIT, *tree)}
    return by_pid.get


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_classify(case: Case) -> None:
    holder = case.tree[-1]
    assert reclaim.classify(holder, lookup(*case.tree)) == Classification(case.kind, case.reason)


def test_a_dead_leader_is_one_that_exited_even_if_not_yet_reaped() -> None:
    dead_main = job(400, 50, state="Z", alive=False)
    worker = proc(401, 1, pgid=400, sid=400)
    assert reclaim.classify(worker, lookup(dead_main, worker)).kind == "orphaned"


def test_leaders_are_followed_one_step_only() -> None:
    # A leader whose own group is elsewhere (not possible on Linux, possible in bad data) ends the walk.
    a, b = proc(100, 1, pgid=101, sid=101), proc(101, 1, pgid=100, sid=100)
    assert reclaim.classify(a, lookup(a, b)) == Classification(
        "attached", "its process group leader pid 101 (python) is alive"
    )
