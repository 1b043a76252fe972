"""Node side of reclaim on fake /proc data: reading /proc, what policy decides, the pid-namespace refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.host import procs
from mgpu_provision.node.host.procs import ProcInfo
from mgpu_provision.node.verbs import reclaim
from mgpu_provision.node.verbs.reclaim import Classification
from mgpu_provision.protocol import BadRequest, check_args
from tests.support.factories import INIT, SHELL, proc


def table(*listed: ProcInfo) -> procs.Lookup:
    by_pid = {p.pid: p for p in (INIT, SHELL, *listed)}
    return by_pid.get


# ------------------------------------------------------------------- classify (the cases: test_reclaim_cases)


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


def test_ancestors_stop_at_a_loop() -> None:
    a, b = proc(100, 101), proc(101, 100)
    assert [p.pid for p in procs.ancestors(a, table(a, b))] == [101]


# ---------------------------------------------------------------------------------------------- decide

ORPHAN = Classification("orphaned", "its process group and session leaders (pid 77) are gone")
ATTACHED = Classification("attached", "its session leader pid 50 (bash) is alive")
AGENT = {500: "the agent itself", 400: "an ancestor of the agent"}


def decide(
    info: ProcInfo,
    why: Classification,
    policy: str = "orphans",
    patterns: tuple[str, ...] = (),
    used_mib: int | None = 1200,
    owner: reclaim.Owner | None = None,
    pids: tuple[int, ...] = (),
) -> reclaim.Decision:
    compiled = reclaim.compile_patterns(policy, list(patterns))
    return reclaim.decide(info, used_mib, why, policy, compiled, AGENT, owner, pids)


def test_orphans_policy_ends_orphans_and_keeps_the_rest() -> None:
    assert decide(proc(100, 77), ORPHAN) == (
        "end",
        "orphaned: its process group and session leaders (pid 77) are gone",
    )
    assert decide(proc(100, 50), ATTACHED) == ("keep", "its session leader pid 50 (bash) is alive")


def test_never_policy_keeps_even_orphans() -> None:
    assert decide(proc(100, 77), ORPHAN, "never") == (
        "keep",
        "policy is never; its process group and session leaders (pid 77) are gone",
    )


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
        (proc(32, 1, "/usr/lib/xorg/Xorg vt1 -displayfd 3"), "refusing to end pid 32 (Xorg)"),
        (proc(33, 1, "/usr/bin/X :0"), "refusing to end pid 33 (X)"),
        (
            proc(34, 1, "/usr/bin/nvidia-persistenced --user nvpd", comm="nvidia-persiste"),
            "refusing to end pid 34 (nvidia-persistenced)",
        ),
        # The kernel cuts comm to 15 characters; a daemon that rewrote its argv is still known by it.
        (proc(35, 1, "fabric manager", comm="nv-fabricmanage"), "refusing to end pid 35 (nv-fabricmanager)"),
        (proc(36, 1, "/usr/bin/nv-hostengine -n"), "refusing to end pid 36 (nv-hostengine)"),
        # MPS: the server every client runs through, and its control daemon (same 15-letter comm).
        (
            proc(38, 39, "nvidia-cuda-mps-server", comm="nvidia-cuda-mps"),
            "refusing to end pid 38 (nvidia-cuda-mps-server)",
        ),
        (
            proc(39, 1, "/usr/bin/nvidia-cuda-mps-control -d", comm="nvidia-cuda-mps"),
            "refusing to end pid 39 (nvidia-cuda-mps-control)",
        ),
        (
            proc(42, 1, "/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg"),
            "refusing to end pid 42 (nvidia-imex)",
        ),
        (proc(37, 1, "/usr/bin/dcgm-exporter -f /etc/dcgm.csv"), "refusing to end pid 37 (dcgm)"),
        (proc(500, 400, "python3 agent.pyz reclaim"), "refusing to end pid 500 (the agent itself)"),
        (proc(400, 31, "sudo -n python3 agent.pyz"), "refusing to end pid 400 (an ancestor of the agent)"),
    ],
)
def test_a_pattern_selecting_a_protected_process_is_refused(info: ProcInfo, message: str) -> None:
    assert decide(info, ATTACHED, "orphans+patterns", (".",)) == ("refused", message)


def test_pid_selects_exactly_the_named_processes_whatever_their_classification() -> None:
    assert decide(proc(100, 50), ATTACHED, pids=(100,)) == (
        "end",
        "named by --pid; its session leader pid 50 (bash) is alive",
    )
    assert decide(proc(101, 77), ORPHAN, pids=(100,)) == (
        "keep",
        "not named by --pid; its process group and session leaders (pid 77) are gone",
    )
    mps = proc(38, 39, "nvidia-cuda-mps-server", comm="nvidia-cuda-mps")
    assert decide(mps, ATTACHED, pids=(38,)) == ("refused", "refusing to end pid 38 (nvidia-cuda-mps-server)")
    assert decide(proc(100, 50, uid=0), ATTACHED, pids=(100,), owner=reclaim.Owner(1000, "alice")) == (
        "keep",
        "owned by root, not alice",
    )
    assert decide(proc(100, 50), ATTACHED, "never", pids=(100,)).action == "keep"


def test_a_program_merely_named_like_a_daemon_is_not_protected() -> None:
    assert reclaim.protected_program(proc(40, 1, "python Xorg_bench.py")) is None
    assert reclaim.protected_program(proc(41, 1, "/opt/Xtrain/run")) is None


def test_user_limits_reclaim_to_one_owner() -> None:
    alice = reclaim.Owner(1000, "alice")
    assert decide(proc(100, 77), ORPHAN, owner=alice) == (
        "end",
        "orphaned: its process group and session leaders (pid 77) are gone",
    )
    assert decide(proc(101, 77, uid=0), ORPHAN, owner=alice) == ("keep", "owned by root, not alice")
    patterned = decide(proc(102, 50, uid=0), ATTACHED, "orphans+patterns", (".",), owner=alice)
    assert patterned == ("keep", "owned by root, not alice")


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
        ({"user": "no-such-user-xq"}, "user 'no-such-user-xq' does not exist on this node"),
    ],
)
def test_arguments_that_do_not_fit_together_are_refused(args: dict[str, object], message: str) -> None:
    with pytest.raises(AgentFailure) as err:
        reclaim.run(protocol.check_args("reclaim", args), backend=None)  # type: ignore[arg-type]
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
        ({"user": ""}, "reclaim: `user` must be a user name or null, got ''"),
        ({"user": "al ice"}, "reclaim: `user` must be a user name or null, got 'al ice'"),
        ({"user": 1000}, "reclaim: `user` must be a user name or null, got 1000"),
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
    sig_ignored: str = "0000000000001000",
    environ: bytes = b"HOME=/root\0",
) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "stat").write_text(stat)
    (base / "status").write_text(
        f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nSigBlk:\t0000000000000001\nSigIgn:\t{sig_ignored}\n"
    )
    (base / "environ").write_bytes(environ)
    (base / "cmdline").write_bytes(cmdline)
    (base / "cgroup").write_text(cgroup)
    for tid, tstat in (tasks or {pid: stat}).items():
        (base / "task" / str(tid)).mkdir(parents=True)
        (base / "task" / str(tid) / "stat").write_text(tstat)


def stat_line(pid: int, comm: str, state: str, ppid: int, sid: int, start: int, pgid: int = 0) -> str:
    rest = ["0"] * 40
    rest[0], rest[1], rest[2], rest[3], rest[19] = state, str(ppid), str(pgid or pid), str(sid), str(start)
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


def test_read_proc_parses_stat_status_cmdline_and_cgroup(tmp_path: Path) -> None:
    fake_proc(
        tmp_path,
        4242,
        stat_line(4242, "py (worker) 1", "S", 1, 4000, 987654, pgid=4100),
        cmdline=b"python\0train.py\0--lr\x000.1\0",
        cgroup="12:name=systemd:/system.slice/train.service\n0::/system.slice/train.service\n",
        sig_ignored="0000000001001001",
        environ=b"LOCAL_RANK=0\0TORCHELASTIC_RUN_ID=abc123\0RANK=0\0",
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
        4000,
        "train.service",
        True,
        4100,
        True,
        "abc123",
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


def test_a_process_that_does_not_ignore_sighup_and_has_no_torchrun_run(tmp_path: Path) -> None:
    fake_proc(tmp_path, 7, stat_line(7, "python", "S", 1, 7, 100), environ=b"XTORCHELASTIC_RUN_ID=no\0")
    info = procs.read_proc(7, str(tmp_path))
    assert info is not None and not info.ignores_hup and info.torchrun_run is None


# ---------------------------------------------------------------------------------------------- pid namespace


class HostPids:
    """A backend whose pids are host pids (as real NVML's are) and that lists nobody."""

    reports_host_pids = True

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def device_count(self) -> int:
        return 0


def fake_namespace(root: Path, link: str) -> str:
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "pid").symlink_to(link)
    return str(root)


def test_outside_the_initial_pid_namespace_nothing_is_ended(tmp_path: Path) -> None:
    root = fake_namespace(tmp_path, "pid:[4026532301]")
    with pytest.raises(AgentFailure) as err:
        reclaim.run(protocol.check_args("reclaim", {"policy": "orphans", "dry_run": False}), HostPids(), root)  # type: ignore[arg-type]
    assert err.value.kind == "pid-namespace"
    assert err.value.message == (
        "refusing to reclaim: the agent runs in pid namespace pid:[4026532301], not the host's "
        "pid:[4026531836]. NVML reports host pids, which name other processes here or none; run the agent "
        "on the host (or in a container started with --pid=host)"
    )


def test_an_unreadable_pid_namespace_counts_as_foreign(tmp_path: Path) -> None:
    problem = procs.pid_namespace_problem(str(tmp_path))
    assert problem == "cannot tell which pid namespace the agent runs in (No such file or directory)"


def test_in_the_initial_pid_namespace_reclaim_runs(tmp_path: Path) -> None:
    root = fake_namespace(tmp_path, "pid:[4026531836]")
    assert procs.pid_namespace_problem(root) is None
    result = reclaim.run(protocol.check_args("reclaim", {"policy": "orphans"}), HostPids(), root)  # type: ignore[arg-type]
    assert result == {"processes": [], "freed_mib": 0, "not_holders": []}


def test_a_simulated_node_names_processes_as_the_agent_sees_them(tmp_path: Path) -> None:
    class Twin(HostPids):
        reports_host_pids = False

    root = fake_namespace(tmp_path, "pid:[4026532301]")
    result = reclaim.run(protocol.check_args("reclaim", {"policy": "orphans"}), Twin(), root)  # type: ignore[arg-type]
    assert result == {"processes": [], "freed_mib": 0, "not_holders": []}
