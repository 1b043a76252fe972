"""What reclaim's classifier says about each kind of GPU memory holder: live jobs kept, leftovers ended.

Each case is a process tree as /proc shows it after something happened (a logout, a SIGKILLed torchrun, a
dead training script), the holder the NVIDIA layer names, and the verdict with its reason. A process missing
from the tree is dead. The first cases are issue 28's: the seed's own case (a killed script's multiprocessing
workers, the shell still open), which the old classifier kept, and in-process elastic agents
(accelerate launch, deepspeed), whose live workers it ended.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from mgpu_provision.node.host import procs
from mgpu_provision.node.host.procs import ProcInfo
from mgpu_provision.node.verbs import reclaim
from mgpu_provision.node.verbs.reclaim import OWN_GROUP, Classification
from tests.support.factories import INIT, SHELL, job, proc, session

RUN = "3f2a9c"
PYTHON = "/usr/bin/python3"
SPAWN = [
    PYTHON,
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
]
FORKSERVER = [PYTHON, "-c", "from multiprocessing.forkserver import main; main(8, 9, ['__main__'], **{})"]


def spawned(pid: int, ppid: int, **kw: object) -> ProcInfo:
    """A child of multiprocessing's spawn context (torch.multiprocessing.spawn): by default a member of the
    job (pid 600) that the login shell (pid 50) started."""
    fields: dict[str, object] = {"pgid": 600, "comm": "python3", **kw}
    return proc(pid, ppid, **fields)._replace(argv=[*SPAWN, "--multiprocessing-fork"])


def forkserved(pid: int, ppid: int, **kw: object) -> ProcInfo:
    """The forkserver, or a child it forked (same command line)."""
    return proc(pid, ppid, **{"pgid": 600, "comm": "python3", **kw})._replace(argv=FORKSERVER)


def rank(pid: int, ppid: int, argv: str = "/usr/bin/python3 -u train.py", **kw: object) -> ProcInfo:
    """A torchrun worker: torchrun starts each in a session of its own with its run id in the environment."""
    return session(pid, ppid, argv, **{"torchrun_run": RUN, **kw})


class Case(NamedTuple):
    name: str
    tree: tuple[ProcInfo, ...]  # the live processes besides init; the holder is the last one
    kind: str
    reason: str


REPARENTED = "its parent is gone: re-parented to pid 1 (systemd)"
LEFTOVER_RANK = f"a torchelastic worker (run {RUN}) left behind: {REPARENTED}"
LEFTOVER_SPAWN = f"a multiprocessing spawn worker left behind: {REPARENTED}"
ACCELERATE = "/usr/bin/python3 /usr/local/bin/accelerate launch --num_processes 2 train.py"


def hint(pid: int, leader: int) -> str:
    return (
        f"its process group leader pid {leader} is gone and nothing marks it as that job's worker "
        f"(a backgrounded job? a fork-mode child?); `reclaim --pid {pid}` ends exactly it"
    )


CASES = [
    # --- issue 28: the seed's case and in-process elastic agents
    Case(
        "the seed's case: a login shell's job SIGKILLed, its two spawn workers left, the shell still open",
        (SHELL, spawned(601, 1), spawned(602, 1)),
        "orphaned",
        LEFTOVER_SPAWN,
    ),
    Case(
        "the seed's case after logout too",
        (spawned(601, 1), spawned(602, 1)),
        "orphaned",
        LEFTOVER_SPAWN,
    ),
    Case(
        "a spawn worker whose main was killed under `systemd --user` (a subreaper) adopts it",
        (session(40, 1, "/lib/systemd/systemd --user", comm="systemd"), spawned(601, 40)),
        "orphaned",
        "a multiprocessing spawn worker left behind: its parent is gone: re-parented to pid 40 (systemd)",
    ),
    Case(
        "a spawn worker whose parent is no longer listed at all",
        (SHELL, spawned(601, 600)),
        "orphaned",
        "a multiprocessing spawn worker left behind: its parent pid 600 exited",
    ),
    Case(
        "a forkserver's child, main killed and the forkserver left behind with it",
        (forkserved(610, 1), forkserved(611, 610)),
        "orphaned",
        "a multiprocessing forkserver process left behind: its parent pid 610 (python3) is left behind "
        f"too: {REPARENTED}",
    ),
    Case(
        "a DataLoader worker whose training script was killed while its owner is still logged in",
        (SHELL, proc(401, 1, comm="pt_data_worker", pgid=400)),
        "orphaned",
        f"a DataLoader worker left behind: {REPARENTED}",
    ),
    Case(
        "accelerate launch SIGKILLed: its elastic workers left, the shell still open",
        (SHELL, rank(701, 1), rank(702, 1)),
        "orphaned",
        LEFTOVER_RANK,
    ),
    Case(
        "a worker of a live `accelerate launch` (the elastic agent runs in-process)",
        (SHELL, job(700, 50, ACCELERATE, comm="accelerate"), rank(701, 700), rank(702, 700)),
        "torchrun",
        "part of the live torchelastic job of its agent pid 700 (accelerate)",
    ),
    Case(
        "a worker of a live deepspeed launcher, started from a script with nohup",
        (
            proc(700, 1, "/usr/bin/python3 -m deepspeed.launcher.launch train.py", ignores_hup=True),
            rank(701, 700),
        ),
        "torchrun",
        "part of the live torchelastic job of its agent pid 700 (python3)",
    ),
    Case(
        "a worker of a live agent that runs in a container under tini (the agent, not tini, is its parent)",
        (
            session(900, 1, "tini -- python launch.py", comm="tini"),
            proc(901, 900, pgid=901, sid=900),
            rank(902, 901),
        ),
        "torchrun",
        "part of the live torchelastic job of its agent pid 901 (python)",
    ),
    # --- issue 28: no marker, group leader gone: kept, with the way to end exactly it
    Case(
        "`run.sh` put `python train.py &` in the background and exited (`ssh host ./run.sh`)",
        (proc(801, 1, pgid=800, sid=800),),
        "attached",
        hint(801, 800),
    ),
    Case(
        "a fork-mode child whose main process was killed, the shell still open",
        (SHELL, proc(401, 1, pgid=400)),
        "attached",
        hint(401, 400),
    ),
    Case(
        "the second command of a pipeline whose first command finished",
        (SHELL, proc(401, 50, pgid=400)),
        "attached",
        hint(401, 400),
    ),
    Case(
        "a worker whose job leader and login shell are both gone",
        (proc(401, 1, pgid=400),),
        "attached",
        hint(401, 400),
    ),
    Case(
        "a service's child after its main process was restarted",
        (proc(72, 1, "inferd-worker", pgid=71, sid=71, unit="inferd.service"),),
        "attached",
        hint(72, 71),
    ),
    # --- live jobs
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
    Case(
        "a spawn worker of a live script",
        (SHELL, job(600, 50), spawned(601, 600)),
        "attached",
        "a multiprocessing spawn worker of the live pid 600 (python)",
    ),
    Case(
        "a forkserver's child while the script runs",
        (SHELL, job(600, 50), forkserved(610, 600), forkserved(611, 610)),
        "attached",
        "a multiprocessing forkserver process of the live pid 610 (python3)",
    ),
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
        (SHELL, job(400, 50), proc(401, 400, comm="pt_data_worker", pgid=400)),
        "attached",
        "a DataLoader worker of the live pid 400 (python)",
    ),
    Case(
        "a member of a live job that nothing marks",
        (SHELL, job(400, 50), proc(401, 400, pgid=400)),
        "attached",
        "its process group leader pid 400 (python) is alive",
    ),
    # --- other leftovers
    Case(
        "torchrun SIGKILLed: rank 0 left behind",
        (rank(301, 1), rank(302, 1)),
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
        "a defunct leader whose threads run on",
        (job(200, 50, state="Z"),),
        "orphaned",
        "zombie: its main thread exited, other threads still hold the GPU",
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
    member = proc(401, 1, pgid=400, sid=400)
    assert reclaim.classify(member, lookup(dead_main, member)).reason == hint(401, 400)
    worker = spawned(402, 400, sid=400, pgid=400)
    assert reclaim.classify(worker, lookup(dead_main, worker)) == Classification(
        "orphaned", "a multiprocessing spawn worker left behind: its parent pid 400 exited"
    )


def test_only_multiprocessing_s_own_command_lines_mark_a_worker() -> None:
    grep = proc(401, 1, "grep -r --multiprocessing-fork-x spawn_main .", pgid=400)
    assert reclaim.worker_kind(grep) is None
    assert reclaim.classify(grep, lookup(grep)).reason == hint(401, 400)


def test_leaders_are_followed_one_step_only() -> None:
    # A leader whose own group is elsewhere (not possible on Linux, possible in bad data) ends the walk.
    a, b = proc(100, 1, pgid=101, sid=101), proc(101, 1, pgid=100, sid=100)
    assert reclaim.classify(a, lookup(a, b)) == Classification(
        "attached", "its process group leader pid 101 (python) is alive"
    )
