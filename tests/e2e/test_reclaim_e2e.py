"""`mgpu-provision reclaim` end to end on real sshd test hosts.

Real processes started in each host's namespaces are listed in its twin as GPU memory holders. Live jobs: a
nohup'd job whose shell exited, a container's main process under a process named `tini`, a worker of a
live job, a worker of a live torchrun. Leftovers: the two ranks of a real torchrun (CPU torch, Gloo) whose
agent was SIGKILLed, a real DataLoader worker whose training script was SIGKILLed, and a multiprocessing
worker that ignores SIGTERM. Reclaim must end exactly the leftovers, leave every live job running, and find
nothing to do the second time.

Issue 28's cases follow, with plain Python programs (tests/support/reclaim_programs.py): the seed's own case
(a job-control shell, a script's two spawn workers, the script SIGKILLed, the shell still open), an in-process
elastic agent named `accelerate`, a job a wrapper script put in the background, `--pid`, and an MPS server
with a client under a pattern that matches the server.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.cli import main
from mgpu_provision.node.host.procs import read_proc
from tests.support.hosts import HostFactory, TestHost
from tests.support.reclaim_programs import (
    ELASTIC_AGENT,
    IGNORE_TERM,
    SLEEP,
    SPAWN_MAIN,
    alive,
    background,
    parent_of,
    pids_in,
    script,
    spawn_leftovers,
    twin_with,
    wait_until,
)

pytestmark = pytest.mark.e2e

FAKE_TORCHRUN = (
    "import subprocess; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); p.wait()\n"
)
# docker run --init: the init (tini, docker-init) puts the container's main process in a process group of
# its own and waits for it.
FAKE_TINI = (
    "import os, sys\npid = os.fork()\nif pid == 0:\n    os.setpgid(0, 0)\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\nprint(pid, flush=True)\nos.waitpid(pid, 0)\n"
)
# One rank of a DDP job: join the Gloo group, prove it with an all_reduce, write its pid, then train (sleep).
RANK = """import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
assert total.item() == dist.get_world_size()
with open(os.path.join(sys.argv[1], "rank%s" % dist.get_rank()), "w") as f:
    f.write(str(os.getpid()))
time.sleep(300)
"""
# A training script whose one DataLoader worker is busy fetching (stuck, as workers that hold GPU memory are).
DATALOADER = """import os, sys, time
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, index):
        with open(sys.argv[1], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)
        return index
for batch in DataLoader(Slow(), num_workers=1):
    pass
"""


def detached(host: TestHost, command: str) -> int:
    """Start `command` in the background of a shell that leads a session of its own and exits at once."""
    out = host.run_in_ns(f"setsid sh -c '{command} </dev/null >/dev/null 2>&1 & echo $!'")
    return int(out.stdout)


def pid_in(path: Path) -> int:
    wait_until(f"{path}", lambda: path.exists() and bool(path.read_text().strip()))
    return int(path.read_text())


def child_of_live_job(host: TestHost, tmp: Path) -> int:
    pid_file = tmp / f"{host.name}-child.pid"
    background(host, f"setsid sh -c 'sleep 300 & echo $! > {pid_file}; wait'")
    return pid_in(pid_file)


def under_tini(host: TestHost, tmp: Path) -> tuple[int, int]:
    tini = script(tmp, "tini", FAKE_TINI)
    pid_file = tmp / f"{host.name}-main.pid"
    init = background(host, f"setsid sh -c 'exec {tini} sleep 300 > {pid_file}'")
    return init, pid_in(pid_file)


def live_torchrun_worker(host: TestHost, tmp: Path) -> int:
    launcher = script(tmp, "torchrun", FAKE_TORCHRUN)
    pid_file = tmp / f"{host.name}-worker.pid"
    background(host, f"setsid sh -c 'exec {launcher} > {pid_file}'")
    return pid_in(pid_file)


def ignores_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    return bool(int(next(s.split()[1] for s in status.splitlines() if s.startswith("SigIgn:")), 16) & 1 << 14)


def reclaim(
    rig: Path, factory: HostFactory, capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["reclaim", str(rig), "--known-hosts", str(factory.known_hosts), "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def rows(report: Any) -> dict[tuple[str, int], dict[str, Any]]:
    return {(name, p["pid"]): p for name, host in report["hosts"].items() for p in host["processes"]}


def actions(report: Any) -> dict[tuple[str, int], str]:
    return {key: row["action"] for key, row in rows(report).items()}


def test_reclaim_ends_exactly_the_leftovers(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = test_hosts.start("gpu-a"), test_hosts.start("gpu-b")
    started: list[int] = []
    try:
        # The two torch programs first: they take seconds to import torch, the rest starts meanwhile.
        ranks_dir = tmp_path / "ranks"
        ranks_dir.mkdir()
        rank = script(tmp_path, "rank.py", RANK)
        torchrun = background(
            b,
            # The host's name (gpu-b) resolves nowhere: torchrun's store listens on loopback instead.
            # TMPDIR: torchrun SIGKILLed here cannot remove its torchelastic folder; the test's tmp_path will.
            f"TMPDIR={tmp_path} setsid {sys.executable} -m torch.distributed.run --standalone "
            "--local-addr 127.0.0.1 "
            f"--nproc-per-node 2 {rank} {ranks_dir}",
        )
        worker_file = tmp_path / "dataloader-worker.pid"
        trainer = background(
            a, f"setsid {sys.executable} {script(tmp_path, 'train.py', DATALOADER)} {worker_file}"
        )
        started = [torchrun, trainer]

        nohup = detached(a, "nohup sleep 300")  # no job control here: only the ignored SIGHUP says "keep me"
        tini, container_main = under_tini(a, tmp_path)
        a_child = child_of_live_job(a, tmp_path)
        _, (stubborn,) = spawn_leftovers(a, tmp_path, "stubborn", IGNORE_TERM, 1)
        b_worker = live_torchrun_worker(b, tmp_path)
        started += [nohup, tini, container_main, a_child, stubborn, b_worker]
        wait_until("the SIGTERM handler", lambda: ignores_sigterm(stubborn))

        rank0, rank1 = pid_in(ranks_dir / "rank0"), pid_in(ranks_dir / "rank1")
        dataloader = pid_in(worker_file)
        started += [rank0, rank1, dataloader]
        for killed in (torchrun, trainer):
            b.run_in_ns(f"kill -9 {killed}")
        wait_until(
            "the ranks and the worker to lose their parents",
            lambda: not alive(torchrun) and not alive(trainer),
        )

        a.set_twin(
            twin_with(
                [
                    (nohup, 0, 1000),
                    (container_main, 0, 2000),
                    (a_child, 1, 3000),
                    (stubborn, 1, 400),
                    (dataloader, 0, 500),
                ]
            )
        )
        b.set_twin(twin_with([(rank0, 0, 6000), (rank1, 1, 6000), (b_worker, 1, 700)]))
        rig = test_hosts.write_rig(tmp_path / "rig.yaml", [a, b], reclaim={"policy": "orphans", "grace_s": 1})
        live = {("gpu-a", nohup), ("gpu-a", container_main), ("gpu-a", a_child), ("gpu-b", b_worker)}
        leftovers = {("gpu-a", stubborn), ("gpu-a", dataloader), ("gpu-b", rank0), ("gpu-b", rank1)}

        code, dry = reclaim(rig, test_hosts, capsys)
        assert code == 2, dry
        assert actions(dry) == {**{k: "keep" for k in live}, **{k: "would-end" for k in leftovers}}
        reasons = {key: row["reason"] for key, row in rows(dry).items()}
        assert reasons[("gpu-a", nohup)] == "it ignores SIGHUP: started with nohup to outlive its shell"
        assert reasons[("gpu-a", container_main)].startswith("leads its own process group")
        assert reasons[("gpu-a", a_child)].startswith("its process group leader pid ")
        assert reasons[("gpu-b", b_worker)].startswith("part of the live torchrun job of pid ")
        assert reasons[("gpu-b", rank0)].startswith("orphaned: a torchelastic worker (run ")
        assert " left behind: its parent is gone: re-parented to pid 1 (" in reasons[("gpu-b", rank0)]
        assert reasons[("gpu-a", dataloader)].startswith(
            "orphaned: a DataLoader worker left behind: its parent is gone: re-parented to pid 1 ("
        )
        assert all(row["owner"] == "root" for row in rows(dry).values())
        assert all(alive(pid) for pid in started if pid not in (torchrun, trainer))

        capsys.readouterr()
        assert main(["reclaim", str(rig), "--known-hosts", str(test_hosts.known_hosts), "--pid", "5"]) == 1
        assert "--pid names processes of one host, and 2 are chosen (gpu-a, gpu-b)" in capsys.readouterr().err

        code, others = reclaim(rig, test_hosts, capsys, "--yes", "--user", "nobody")
        assert code == 0, others
        assert set(actions(others).values()) == {"keep"}
        assert {row["reason"] for row in rows(others).values()} == {"owned by root, not nobody"}
        assert all(alive(pid) for _, pid in leftovers)

        code, done = reclaim(rig, test_hosts, capsys, "--yes")
        assert code == 0, done
        assert actions(done) == {**{k: "keep" for k in live}, **{k: "ended" for k in leftovers}}
        assert rows(done)[("gpu-a", stubborn)]["reason"].endswith(
            "ended by SIGKILL after the 1s grace period"
        )
        assert done["freed_mib"] == 400 + 500 + 6000 + 6000
        assert not any(alive(pid) for _, pid in leftovers)
        assert all(alive(pid) for _, pid in live) and alive(tini)

        code, again = reclaim(rig, test_hosts, capsys, "--yes")
        assert code == 0, again
        assert actions(again) == {k: "keep" for k in live}
        assert again["freed_mib"] == 0
    finally:
        for pid in started:
            if alive(pid):
                a.run_in_ns(f"kill -9 {pid}", check=False)


def job_control_shell(host: TestHost, tmp: Path, command: str) -> tuple[int, int]:
    """`command` run as a job of a shell with job control on (`set -m`: the job leads its own process group
    in the shell's session), the shell kept open: (the shell's pid, the job's pid)."""
    job_file, body = tmp / f"{host.name}-job.pid", tmp / f"{host.name}-shell.sh"
    body.write_text(f"set -m\n{command} &\necho $! > {job_file}\nwhile :; do sleep 1; done\n")
    shell = background(host, f"setsid bash {body}")
    return shell, pid_in(job_file)


def test_reclaim_the_seed_case_elastic_agents_wrapped_jobs_pid_and_mps(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = test_hosts.start("gpu-c")
    started: list[int] = []
    try:
        # The seed's case: a training script's spawn workers, the script SIGKILLed, its shell still open.
        seed_file = tmp_path / "seed.pids"
        shell, script_pid = job_control_shell(
            host, tmp_path, f"{script(tmp_path, 'train.py', SPAWN_MAIN)} {shlex.quote(SLEEP)} 2 {seed_file}"
        )
        seed = pids_in(seed_file)
        started += [shell, script_pid, *seed]
        assert all(read_proc(w).pgid == script_pid and read_proc(w).sid == shell for w in seed)  # type: ignore[union-attr]
        host.run_in_ns(f"kill -9 {script_pid}")
        wait_until(
            "the spawn workers to lose their parent", lambda: all(parent_of(w) != script_pid for w in seed)
        )

        # An in-process elastic agent: the launcher's comm is `accelerate`, not torchrun.
        agent_file = tmp_path / "agent.pids"
        agent = background(
            host, f"setsid {script(tmp_path, 'accelerate', ELASTIC_AGENT)} launch {agent_file}"
        )
        elastic = pids_in(agent_file)
        started += [agent, *elastic]
        assert read_proc(agent).comm == "accelerate"  # type: ignore[union-attr]

        # A job a wrapper script put in the background (as `ssh host ./run.sh` does), the wrapper gone.
        wrapped_file = tmp_path / "wrapped.pid"
        wrapper = tmp_path / "run.sh"
        background_job = f"{sys.executable} -c {shlex.quote(SLEEP)} </dev/null >/dev/null 2>&1 &"
        wrapper.write_text(f"{background_job}\necho $! > {wrapped_file}\n")
        host.run_in_ns(f"setsid sh {wrapper}")
        wrapped = pid_in(wrapped_file)
        started.append(wrapped)

        # An MPS server (its control daemon started it), and a live client running through it.
        mps_program = tmp_path / "nvidia-cuda-mps-server"
        mps_program.symlink_to("/bin/sleep")
        mps_server = detached(host, f"{mps_program} 300")
        client = detached(host, "sleep 300")
        started += [mps_server, client]

        holders = [(seed[0], 0, 3000), (seed[1], 1, 3000), (elastic[0], 0, 5000), (elastic[1], 1, 5000)]
        holders += [(wrapped, 0, 700), (mps_server, 1, 300), (client, 1, 900)]
        host.set_twin(twin_with(holders, mps=(client,)))
        rig = test_hosts.write_rig(tmp_path / "rig.yaml", [host], reclaim={"policy": "orphans", "grace_s": 1})
        key = "gpu-c"

        code, dry = reclaim(rig, test_hosts, capsys)
        assert code == 2, dry
        found = rows(dry)
        assert {pid: found[(key, pid)]["action"] for pid in seed} == {
            seed[0]: "would-end",
            seed[1]: "would-end",
        }
        assert found[(key, seed[0])]["reason"].startswith(
            "orphaned: a multiprocessing spawn worker left behind: its parent is gone: re-parented to pid 1 ("
        )
        for worker in elastic:
            assert found[(key, worker)]["action"] == "keep"
            assert (
                found[(key, worker)]["reason"]
                == f"part of the live torchelastic job of its agent pid {agent} (accelerate)"
            )
            assert found[(key, worker)]["torchrun_job"]
        assert found[(key, wrapped)]["action"] == "keep"
        assert found[(key, wrapped)]["reason"].endswith(f"; `reclaim --pid {wrapped}` ends exactly it")
        assert (
            found[(key, client)]["mps_server"] == mps_server
            and found[(key, mps_server)]["mps_server"] is None
        )

        code, done = reclaim(rig, test_hosts, capsys, "-y")
        assert code == 0, done
        assert {pid for (_, pid), action in actions(done).items() if action == "ended"} == set(seed)
        assert not any(alive(w) for w in seed) and alive(shell)
        assert all(alive(pid) for pid in (agent, *elastic, wrapped, mps_server, client))

        # The agent SIGKILLed: now its workers are left behind.
        host.run_in_ns(f"kill -9 {agent}")
        wait_until(
            "the elastic workers to lose their agent", lambda: all(parent_of(w) != agent for w in elastic)
        )
        code, done = reclaim(rig, test_hosts, capsys, "--yes")
        assert code == 0, done
        assert {pid for (_, pid), action in actions(done).items() if action == "ended"} == set(elastic)
        assert rows(done)[(key, elastic[0])]["reason"].startswith(
            "orphaned: a torchelastic worker (run e2e-run) left behind: its parent is gone: "
            "re-parented to pid 1 ("
        )
        assert not any(alive(w) for w in elastic)

        # --pid ends exactly the named process, after the same checks.
        code, named = reclaim(rig, test_hosts, capsys, "--pid", str(wrapped), "--yes", "--limit", key)
        assert code == 0, named
        assert actions(named) == {(key, wrapped): "ended", (key, mps_server): "keep", (key, client): "keep"}
        assert rows(named)[(key, wrapped)]["reason"].startswith(
            "named by --pid; its process group leader pid "
        )
        assert not alive(wrapped) and alive(mps_server) and alive(client)

        # A pattern that matches the MPS server: refused, the server and its client keep running.
        rig = test_hosts.write_rig(
            tmp_path / "rig.yaml",
            [host],
            reclaim={"policy": "orphans+patterns", "patterns": ["mps"], "grace_s": 1},
        )
        code, refused = reclaim(rig, test_hosts, capsys, "--yes")
        assert code == 2, refused
        assert rows(refused)[(key, mps_server)]["action"] == "refused"
        assert (
            rows(refused)[(key, mps_server)]["reason"]
            == f"refusing to end pid {mps_server} (nvidia-cuda-mps-server)"
        )
        assert alive(mps_server) and alive(client)
    finally:
        for pid in started:
            if alive(pid):
                host.run_in_ns(f"kill -9 {pid}", check=False)
