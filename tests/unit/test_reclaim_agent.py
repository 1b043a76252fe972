"""Node side of reclaim on fake /proc data: reading /proc, classifying holders, and what policy decides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mgpu_provision.node import procs, reclaim
from mgpu_provision.node.errors import AgentFailure
from mgpu_provision.node.procs import ProcInfo
from mgpu_provision.node.reclaim import Classification
from mgpu_provision.protocol import BadRequest, check_args


def proc(pid: int, ppid: int, argv: str = "python train.py", **kw: object) -> ProcInfo:
    fields: dict[str, object] = {
        "pid": pid,
        "ppid": ppid,
        "state": "S",
        "comm": os.path.basename(argv.split()[0]) if argv else "x",
        "argv": argv.split(),
        "uid": 1000,
        "start_ticks": 1000 + pid,
        "sid": 50,
        "unit": "session-3.scope",
        "alive": True,
    }
    fields.update(kw)
    return ProcInfo(**fields)  # type: ignore[arg-type]


INIT = proc(1, 0, "/sbin/init", comm="systemd", sid=1, unit="init.scope")
SHELL = proc(50, 1, "-bash", comm="bash", sid=50)


def table(*listed: ProcInfo) -> procs.Lookup:
    by_pid = {p.pid: p for p in (INIT, SHELL, *listed)}
    return by_pid.get


# ---------------------------------------------------------------------------------------------- classify


def test_child_of_pid_1_is_orphaned() -> None:
    worker = proc(100, 1)
    why = reclaim.classify(worker, table(worker))
    assert why == Classification(
        "orphaned", "re-parented to pid 1 (systemd): the process that started it is gone"
    )


def test_child_of_a_subreaper_is_orphaned() -> None:
    user_systemd = proc(20, 1, "/lib/systemd/systemd --user", comm="systemd", sid=20, unit="init.scope")
    worker = proc(100, 20)
    why = reclaim.classify(worker, table(user_systemd, worker))
    assert why.kind == "orphaned"
    assert "re-parented to pid 20 (systemd)" in why.reason


def test_service_main_process_is_not_orphaned() -> None:
    daemon = proc(70, 1, "/usr/bin/inferd --port 9000", sid=70, unit="inferd.service")
    why = reclaim.classify(daemon, table(daemon))
    assert why == Classification("attached", "a service (inferd.service) run by pid 1 (systemd)")


def test_session_leader_outside_a_service_is_still_an_orphan() -> None:
    # torchrun starts binary workers with start_new_session=True: leading a session alone is no service.
    worker = proc(100, 1, sid=100, unit="session-3.scope")
    assert reclaim.classify(worker, table(worker)).kind == "orphaned"


def test_live_parent_keeps_a_process_attached() -> None:
    worker = proc(100, 50)
    assert reclaim.classify(worker, table(worker)) == Classification(
        "attached", "its parent pid 50 (bash) is alive"
    )


@pytest.mark.parametrize(
    "launcher",
    [
        "/opt/venv/bin/python3 /opt/venv/bin/torchrun --nproc-per-node 2 train.py",
        "torchrun --standalone train.py",
        "python -m torch.distributed.run --nnodes 2 train.py",
        "python3 -m torch.distributed.launch train.py",
        "python -m torchelastic.distributed.launch train.py",
    ],
)
def test_descendant_of_a_live_torchrun_is_part_of_its_job(launcher: str) -> None:
    agent = proc(60, 50, launcher)
    spawn = proc(61, 60, "python -c from multiprocessing.spawn import spawn_main")
    worker = proc(100, 61)
    why = reclaim.classify(worker, table(agent, spawn, worker))
    assert why.kind == "torchrun"
    assert why.reason.startswith("part of the live torchrun job of pid 60 (")


def test_a_script_merely_named_like_torchrun_is_no_launcher() -> None:
    assert not reclaim.is_torchrun_agent(proc(60, 50, "python train.py --notes torchrun"))
    assert not reclaim.is_torchrun_agent(proc(60, 50, "python -m"))


def test_defunct_leader_with_live_threads_is_a_zombie_orphan() -> None:
    worker = proc(100, 50, state="Z")
    assert reclaim.classify(worker, table(worker)) == Classification(
        "orphaned", "zombie: its main thread exited, other threads still hold the GPU"
    )


def test_gone_parent_is_orphaned() -> None:
    worker = proc(100, 77)
    assert reclaim.classify(worker, table(worker)) == Classification("orphaned", "its parent pid 77 is gone")


def test_parent_outside_the_pid_namespace_is_attached() -> None:
    worker = proc(100, 0)
    assert reclaim.classify(worker, table(worker)).reason == "its parent is outside this pid namespace"


def test_ancestors_stop_at_a_loop() -> None:
    a, b = proc(100, 101), proc(101, 100)
    assert [p.pid for p in procs.ancestors(a, table(a, b))] == [101]


# ---------------------------------------------------------------------------------------------- decide

ORPHAN = Classification("orphaned", "its parent pid 77 is gone")
ATTACHED = Classification("attached", "its parent pid 50 (bash) is alive")
AGENT = {500: "the agent itself", 400: "an ancestor of the agent"}


def decide(
    info: ProcInfo,
    why: Classification,
    policy: str = "orphans",
    patterns: tuple[str, ...] = (),
    used_mib: int | None = 1200,
) -> reclaim.Decision:
    compiled = reclaim.compile_patterns(policy, list(patterns))
    return reclaim.decide(info, used_mib, why, policy, compiled, AGENT)


def test_orphans_policy_ends_orphans_and_keeps_the_rest() -> None:
    assert decide(proc(100, 77), ORPHAN) == ("end", "orphaned: its parent pid 77 is gone")
    assert decide(proc(100, 50), ATTACHED) == ("keep", "its parent pid 50 (bash) is alive")


def test_never_policy_keeps_even_orphans() -> None:
    assert decide(proc(100, 77), ORPHAN, "never") == ("keep", "policy is never; its parent pid 77 is gone")


def test_patterns_select_live_processes_by_command_line() -> None:
    hog = proc(100, 50, "python leak.py --gpu 0")
    assert decide(hog, ATTACHED, "orphans+patterns", ("leak\\.py",)) == (
        "end",
        "command matches 'leak\\\\.py'",
    )
    assert decide(hog, ATTACHED, "orphans+patterns", ("^train",)).action == "keep"


@pytest.mark.parametrize(
    ("info", "message"),
    [
        (proc(1, 0, "/sbin/init"), "refusing to end pid 1 (init)"),
        (proc(30, 1, "/usr/sbin/sshd -D", comm="sshd"), "refusing to end pid 30 (sshd)"),
        (proc(31, 30, "sshd: alice@pts/0", comm="sshd-session"), "refusing to end pid 31 (sshd)"),
        (proc(500, 400, "python3 agent.pyz reclaim"), "refusing to end pid 500 (the agent itself)"),
        (proc(400, 31, "sudo -n python3 agent.pyz"), "refusing to end pid 400 (an ancestor of the agent)"),
    ],
)
def test_a_pattern_selecting_a_protected_process_is_refused(info: ProcInfo, message: str) -> None:
    assert decide(info, ATTACHED, "orphans+patterns", (".",)) == ("refused", message)


def test_an_orphan_holding_no_gpu_memory_is_refused() -> None:
    assert decide(proc(100, 77), ORPHAN, used_mib=0) == (
        "refused",
        "refusing to end pid 100 (it holds no GPU memory)",
    )


def test_unknown_memory_use_still_counts_as_holding() -> None:
    assert decide(proc(100, 77), ORPHAN, used_mib=None).action == "end"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"policy": "orphans", "patterns": ["x"]}, "patterns are only used with policy orphans+patterns"),
        (
            {"policy": "orphans+patterns", "patterns": ["(unclosed"]},
            "pattern '(unclosed' is not a valid regular",
        ),
    ],
)
def test_arguments_that_do_not_fit_together_are_refused(args: dict[str, object], message: str) -> None:
    with pytest.raises(AgentFailure) as err:
        reclaim.run(args, backend=None)  # type: ignore[arg-type]
    assert err.value.kind == "bad-request"
    assert message in err.value.message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"policy": "everything"},
            "reclaim: `policy` must be one of never, orphans, orphans+patterns, got 'everything'",
        ),
        ({"patterns": "python"}, "reclaim: `patterns` must be a list of strings, got 'python'"),
        ({"grace_s": -1}, "reclaim: `grace_s` must be a number from 0 to 600, got -1"),
        ({"grace_s": True}, "reclaim: `grace_s` must be a number from 0 to 600, got True"),
    ],
)
def test_mistyped_arguments_are_refused_at_the_door(args: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequest) as err:
        check_args("reclaim", args)
    assert str(err.value) == message


# ---------------------------------------------------------------------------------------------- read_proc


def fake_proc(
    root: Path,
    pid: int,
    stat: str,
    cmdline: bytes = b"",
    uid: int = 1000,
    cgroup: str = "0::/user.slice/session-3.scope\n",
    tasks: dict[int, str] | None = None,
) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "stat").write_text(stat)
    (base / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (base / "cmdline").write_bytes(cmdline)
    (base / "cgroup").write_text(cgroup)
    for tid, tstat in (tasks or {pid: stat}).items():
        (base / "task" / str(tid)).mkdir(parents=True)
        (base / "task" / str(tid) / "stat").write_text(tstat)


def stat_line(pid: int, comm: str, state: str, ppid: int, sid: int, start: int) -> str:
    rest = ["0"] * 40
    rest[0], rest[1], rest[2], rest[3], rest[19] = state, str(ppid), str(pid), str(sid), str(start)
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


def test_read_proc_parses_stat_status_cmdline_and_cgroup(tmp_path: Path) -> None:
    fake_proc(
        tmp_path,
        4242,
        stat_line(4242, "py (worker) 1", "S", 1, 4242, 987654),
        cmdline=b"python\0train.py\0--lr\x000.1\0",
        cgroup="12:name=systemd:/system.slice/train.service\n0::/system.slice/train.service\n",
    )
    info = procs.read_proc(4242, str(tmp_path))
    assert info == ProcInfo(
        4242,
        1,
        "S",
        "py (worker) 1",
        ["python", "train.py", "--lr", "0.1"],
        1000,
        987654,
        4242,
        "train.service",
        True,
    )
    assert info.command == "python train.py --lr 0.1"
    assert procs.read_proc(4243, str(tmp_path)) is None


def test_zombie_leader_is_alive_while_a_thread_runs(tmp_path: Path) -> None:
    zombie = stat_line(10, "python3", "Z", 1, 5, 100)
    fake_proc(tmp_path, 10, zombie, tasks={10: zombie, 11: stat_line(11, "python3", "S", 1, 5, 101)})
    fake_proc(tmp_path, 20, stat_line(20, "dead", "Z", 1, 5, 100))
    live, dead = procs.read_proc(10, str(tmp_path)), procs.read_proc(20, str(tmp_path))
    assert live is not None and live.alive and live.state == "Z"
    assert dead is not None and not dead.alive
    assert dead.command == "[dead]"


def test_boot_time_and_owner(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1764400000\nprocesses 5\n")
    assert procs.boot_time(str(tmp_path)) == 1764400000.0
    assert procs.owner_name(0) == "root"
    assert procs.owner_name(None) is None
    assert procs.owner_name(987654321) == "987654321"
