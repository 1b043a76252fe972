"""node.py: the request, the torchrun command, log diagnoses, and real local runs without SSH.

The real runs start torchrun with this venv's torch on loopback (gloo): two "nodes" are two `run` calls in
parallel. Every failure case checks the diagnosis names the endpoint, that it came before the deadline, and
that no process of the run is left and no port is held.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import protocol
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.host import files
from mgpu_provision.node.verbs import smoke as node
from mgpu_provision.protocol import BadRequest, check_args
from tests.support.factories import FAKE_TORCH
from tests.support.smoke_helpers import (
    FAIL_TIMEOUT_S,
    free_port,
    listening,
    node_args,
    processes_of_run,
    run_id,
)


def request(**over: Any) -> node.Request:
    return node.Request(protocol.check_args("smoke", {**node_args("r1", 29500, 0), **over}))


# ---- the request -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"python": ""}, "smoke: `python` must be a non-empty one-line string, got ''"),
        ({"nnodes": 0}, "smoke: `nnodes` must be an integer >= 1, got 0"),
        ({"master_port": 70000}, "smoke: `master_port` must be an integer from 1 to 65535, got 70000"),
        ({"backend": "mpi"}, "smoke: `backend` must be one of nccl, gloo, got 'mpi'"),
        ({"rdzv_backend": "etcd"}, "smoke: `rdzv_backend` must be one of static, c10d"),
        ({"timeout_s": 0}, "smoke: `timeout_s` must be a positive number, got 0"),
        ({"sizes_mib": [1, -2]}, "smoke: `sizes_mib` must be a list of positive numbers"),
        ({"env": {"A": 1}}, "smoke: `env` must be a mapping of names to strings"),
        (
            {"path_prepend": {"PATH": "/a"}},
            "smoke: `path_prepend` must be a mapping of names to lists of strings",
        ),
        ({"master_addr": "a\nb"}, "smoke: `master_addr` must be a non-empty one-line string"),
        ({"rdzv_id": None}, "smoke: `rdzv_id` must be a non-empty one-line string, got None"),
        ({"launcher": 7}, "smoke: `launcher` must be a string or null, got 7"),
        (
            {"files": [{"role": "launcher", "path": "/x", "content": "y"}]},
            "smoke: `files` must be a list of objects with the strings role, path, content, mode",
        ),
    ],
)
def test_bad_request_names_the_field(over: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        check_args("smoke", {**node_args("r1", 29500, 0), **over})


def test_a_missing_argument_is_named() -> None:
    args = node_args("r1", 29500, 0)
    del args["python"]
    with pytest.raises(BadRequest, match="smoke: `python` is missing; it must be a non-empty one-line"):
        check_args("smoke", args)


def test_node_rank_must_be_below_nnodes() -> None:
    with pytest.raises(AgentFailure) as info:
        request(node_rank=2)
    assert info.value.kind == "bad-request"
    assert "node_rank 2 must be below nnodes 2" in info.value.message


def test_timeouts_leave_room_before_the_deadline() -> None:
    for total in (5.0, 30.0, 180.0):
        rendezvous, group = node.timeouts(total)
        assert rendezvous < total and group < total
    assert node.timeouts(180.0) == (45, 90.0)


def test_static_command_passes_node_rank_master_and_rendezvous_timeout() -> None:
    command = node.torchrun_command(request(timeout_s=30), "/t/p.py", "/t/c.json")
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    text = " ".join(command)
    assert (
        "--nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29500 "
        "--rdzv-id r1 --max_restarts 0 --rdzv_conf timeout=7" in text
    )
    assert command[-2:] == ["/t/p.py", "/t/c.json"]


def test_installed_launcher_gets_only_what_smoke_adds() -> None:
    command = node.torchrun_command(request(timeout_s=30, launcher="/usr/local/bin/mgpu-torchrun"), "p", "c")
    assert command == [
        "/usr/local/bin/mgpu-torchrun",
        "--max_restarts",
        "0",
        "--rdzv_conf",
        "timeout=7",
        "p",
        "c",
    ]


def test_c10d_command_uses_the_endpoint_and_join_timeout() -> None:
    text = " ".join(node.torchrun_command(request(rdzv_backend="c10d", timeout_s=30), "p", "c"))
    assert "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29500" in text
    assert "join_timeout=7,read_timeout=7" in text and "--node-rank" not in text


def test_child_environment_marks_the_run_and_keeps_threads_low() -> None:
    env = node.child_environment(request(env={"NCCL_DEBUG": "WARN"}), {"PATH": "/bin"})
    assert env[node.MARKER_ENV] == "r1/0"
    assert env["OMP_NUM_THREADS"] == "1" and env["NCCL_DEBUG"] == "WARN" and env["PATH"] == "/bin"
    assert node.child_environment(request(env={"OMP_NUM_THREADS": "4"}), {})["OMP_NUM_THREADS"] == "4"
    # Through the launcher the env files set the variables, not smoke.
    assert "NCCL_DEBUG" not in node.child_environment(request(env={"NCCL_DEBUG": "WARN"}), {}, rig_env=False)


def test_child_environment_prepends_as_the_profile_script_does() -> None:
    req = request(path_prepend={"PATH": ["/usr/local/cuda/bin", "/bin"], "LD_LIBRARY_PATH": ["/cuda/lib64"]})
    env = node.child_environment(req, {"PATH": "/usr/bin:/bin"})
    # /bin is already there and stays where it is; an unset variable gets the entries alone, no ':'
    assert env["PATH"] == "/usr/local/cuda/bin:/usr/bin:/bin" and env["LD_LIBRARY_PATH"] == "/cuda/lib64"
    # Through the launcher the profile script prepends, not smoke.
    assert node.child_environment(req, {"PATH": "/usr/bin"}, rig_env=False)["PATH"] == "/usr/bin"


# ---- the installed launcher and env files --------------------------------------------------------------

LAUNCHER = '#!/bin/sh\nset -eu\nnode_rank=1\nexec python3 -m torch.distributed.run "$@"\n'


def installed(tmp_path: Path, content: str = LAUNCHER, mode: int = 0o755) -> dict[str, str]:
    path = tmp_path / "mgpu-torchrun"
    path.write_text(content)
    path.chmod(mode)
    return {"role": "launcher", "path": str(path), "content": LAUNCHER, "mode": "0755"}


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        (LAUNCHER, 0o755, None),
        (LAUNCHER, 0o644, "launcher {path} is not executable (mode 0644): run apply"),
        (
            LAUNCHER.replace("node_rank=1", "node_rank=0"),
            0o755,
            "launcher {path} is stale: run apply (line 3 is `node_rank=0`, the rig file renders "
            "`node_rank=1`)",
        ),
        (
            LAUNCHER + "echo extra\n",
            0o755,
            "launcher {path} is stale: run apply (line 5 `echo extra` is not in the rig file's version)",
        ),
        (
            LAUNCHER.rsplit("exec", 1)[0],
            0o755,
            "launcher {path} is stale: run apply (line 4 `exec python3 -m "
            'torch.distributed.run "$@"` is missing)',
        ),
        (LAUNCHER, 0o775, "launcher {path} has mode 0775, apply writes 0755: run apply"),
    ],
)
def test_installed_file_problems_name_the_file_and_the_line(
    tmp_path: Path, content: str, mode: int, message: str | None
) -> None:
    want = installed(tmp_path, content, mode)
    problem = files.installed_problem(want["role"], want["path"], want["content"], want["mode"])
    assert problem == (message.format(path=want["path"]) if message else None)


def test_missing_or_stale_files_fail_the_node_before_anything_starts(tmp_path: Path) -> None:
    stale = installed(tmp_path, LAUNCHER.replace("node_rank=1", "node_rank=0"))
    gone = {"role": "env file", "path": str(tmp_path / "profile.sh"), "content": "x\n", "mode": "0644"}
    # The interpreter leaves a mark if anything runs it (the torch probe, torchrun): the files are checked
    # first. A mark, not a stopwatch: under a loaded machine a timing bound fails a correct run.
    started = tmp_path / "python-ran"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntouch {started}\n")
    python.chmod(0o755)
    result = node.run(
        protocol.check_args(
            "smoke",
            node_args(
                run_id(), free_port(), 1, python=str(python), launcher=stale["path"], files=[stale, gone]
            ),
        )
    )
    assert not started.exists()
    assert (result["ok"], result["kind"], result["ranks"]) == (False, "not-applied", [])
    assert result["diagnosis"] == (
        f"launcher {stale['path']} is stale: run apply (line 3 is `node_rank=0`, the rig file renders "
        f"`node_rank=1`); env file {gone['path']} is missing: run apply"
    )


# ---- diagnoses from real torch log lines --------------------------------------------------------------

LOGS = {
    "rendezvous-unreachable": (
        "torch.distributed.DistNetworkError: The client socket has timed out after 5000ms while trying to "
        "connect to (10.0.0.11, 29500).",
        "rendezvous endpoint 10.0.0.11:29500 unreachable: no answer within 5 s",
    ),
    "rendezvous-timeout": (
        "torch.distributed.DistStoreError: Timed out after 6 seconds waiting for clients. "
        "1/2 clients joined.",
        "timed out waiting for peers at 127.0.0.1:29500: 1 of 2 nodes joined within 6 s",
    ),
    "port-in-use": (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
        "address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
        "rendezvous port 29500 on 127.0.0.1 is already in use",
    ),
    "torch-missing": ("/usr/bin/python3: No module named torch", "torch is not installed in"),
    "nccl": (
        "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\nframe #0: x",
        "NCCL error: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
    ),
}


@pytest.mark.parametrize("kind", sorted(LOGS))
def test_diagnose_names_the_cause(kind: str) -> None:
    log, message = LOGS[kind]
    got_kind, got = node.diagnose(log, request(), 1, False)
    assert got_kind == kind
    assert message in got


def test_diagnose_reset_during_rendezvous() -> None:
    log = "static_tcp_rendezvous.py ...\ntorch.distributed.DistNetworkError: Connection reset by peer"
    assert node.diagnose(log, request(), 1, False) == (
        "rendezvous-unreachable",
        "rendezvous endpoint 127.0.0.1:29500 refused or dropped the connection",
    )


def test_diagnose_crash_and_hang_quote_the_last_useful_lines() -> None:
    log = 'starting\nTraceback (most recent call last):\n  File "x.py"\nframe #3: noise\nsegfault\n'
    assert node.diagnose(log, request(), 1, False) == (
        "crash",
        "torchrun exited with code 1; last lines: starting | segfault",
    )
    kind, message = node.diagnose("waiting\n", request(timeout_s=9), None, True)
    assert kind == "timeout"
    assert message == "no result within 9 s (hung; rendezvous at 127.0.0.1:29500); last lines: waiting"


def test_a_crash_names_the_ranks_exception_not_torchrun_s_summary() -> None:
    log = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "program.py", line 80, in main\n'
        "[rank1]: RuntimeError: Gloo connectFullMesh failed with [127.0.0.2]:51234: Connection refused\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "============================================================\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "============================================================\n"
    )
    assert node.diagnose(log, request(), 1, False) == (
        "crash",
        "torchrun exited with code 1: RuntimeError: Gloo connectFullMesh failed with [127.0.0.2]:51234: "
        "Connection refused",
    )


def rank(r: int, ok: bool = True, error: str | None = None) -> dict[str, Any]:
    return {"rank": r, "ok": ok, "error": error, "checks": [{"name": "ddp_step", "ok": ok, "detail": "d"}]}


def test_judge_passes_only_with_every_local_rank_ok() -> None:
    req = request()
    assert node.judge(req, [rank(0), rank(1)], 0, False, "")["ok"] is True
    assert node.judge(req, [rank(0)], 0, False, "") == {
        "ok": False,
        "kind": "missing-ranks",
        "diagnosis": "1 of 2 local ranks reported a result",
    }
    assert node.judge(req, [rank(0), rank(1, ok=False)], 0, False, "") == {
        "ok": False,
        "kind": "check-failed",
        "diagnosis": "rank 1 ddp_step: d",
    }
    crashed = node.judge(req, [rank(0, False, "RuntimeError: peer gone")], 1, False, "junk")
    assert crashed["kind"] == "crash" and crashed["diagnosis"] == "rank 0: RuntimeError: peer gone"


def test_judge_goes_by_the_results_however_torchrun_ended_after_them() -> None:
    """Exit code None: smoke ended torchrun in its exit barrier; -6: a rank aborted after its result."""
    req = request()
    for exit_code in (None, -6, 1):
        assert node.judge(req, [rank(0), rank(1)], exit_code, False, "junk")["ok"] is True
    assert node.judge(req, [rank(0), rank(1, ok=False)], None, False, "")["kind"] == "check-failed"


# ---- the program travels inside the zipapp -----------------------------------------------------------


def test_program_source_is_read_from_the_zipapp(tmp_path: Path) -> None:
    from mgpu_provision.fleet.bundle import build_agent

    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(build_agent().data)
    with zipfile.ZipFile(pyz) as archive:
        expected = archive.read("mgpu_provision/node/verbs/smoke_program.py")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from mgpu_provision.node.verbs import smoke as node; "
        "assert 'zip' in type(node.__loader__).__name__.lower(); "
        "sys.stdout.buffer.write(node.program_source())"
    )
    out = subprocess.run([sys.executable, "-c", code, str(pyz)], capture_output=True, check=True).stdout
    assert out == expected and b"def main(argv" in out


# ---- cleanup -----------------------------------------------------------------------------------------


def test_cleanup_ends_marked_processes_even_when_they_ignore_sigterm() -> None:
    rid = run_id()
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    env = {node.MARKER_ENV: node.marker(rid, 1)}
    proc = subprocess.Popen([sys.executable, "-c", stubborn], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    other = subprocess.Popen(["sleep", "60"], env={node.MARKER_ENV: node.marker(rid, 0)})
    try:
        started = time.monotonic()
        answer = node.cleanup({"run_id": rid, "node_rank": 1})
        assert answer == {"marker": f"{rid}/1", "leftover_pids": []}
        assert proc.wait(timeout=5) == -9  # needed SIGKILL
        assert time.monotonic() - started < node.GRACE_S * 2 + 2
        assert other.poll() is None  # another node's part of the same run is not this node's to end
    finally:
        other.kill()
        other.wait()


# ---- real runs ---------------------------------------------------------------------------------------


def assert_clean(rid: str, port: int, tmp: Path | None = None) -> None:
    assert processes_of_run(rid) == []
    assert not listening(port)
    if tmp is not None:  # the work folder, and torchrun's torchelastic_* log folder inside it
        assert sorted(p.name for p in tmp.iterdir()) == []


@pytest.fixture
def node_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder of the node's own (TMPDIR), to see what a run leaves in it."""
    folder = tmp_path / "node-tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches the folder it chose first
    return folder


@pytest.mark.torch
def test_two_nodes_of_two_ranks_pass_with_per_rank_results(node_tmp: Path) -> None:
    rid, port = run_id(), free_port()
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(lambda r: node.run(protocol.check_args("smoke", node_args(rid, port, r))), [0, 1])
        )
    for node_rank, result in enumerate(results):
        assert result["ok"], result
        assert result["node_rank"] == node_rank and result["leftover_pids"] == []
        assert [r["rank"] for r in result["ranks"]] == [2 * node_rank, 2 * node_rank + 1]
        for r in result["ranks"]:
            assert r["world_size"] == 4 and r["backend"] == "gloo" and r["node_rank"] == node_rank
            names = [c["name"] for c in r["checks"] if c["ok"]]
            assert names == ["world_size", "all_reduce", "sampler_shards", "ddp_step"]
            assert [b["size_mib"] for b in r["bandwidth"]] == [0.0625, 0.25]
            for b in r["bandwidth"]:
                assert b["busbw_gbps"] == pytest.approx(b["algbw_gbps"] * 1.5, abs=2e-4)  # 2(n-1)/n, n=4
    checksums = {r["param_checksum"] for result in results for r in result["ranks"]}
    assert len(checksums) == 1
    assert_clean(rid, port, node_tmp)


def test_torch_missing_names_interpreter_and_node() -> None:
    result = node.run(
        protocol.check_args(
            "smoke", node_args(run_id(), free_port(), 1, python="/usr/bin/python3", node="gpu-b")
        )
    )
    assert result["ok"] is False and result["kind"] == "torch-missing"
    assert result["diagnosis"] == "torch is not installed in /usr/bin/python3 on gpu-b"


def test_missing_interpreter_is_named() -> None:
    result = node.run(
        protocol.check_args(
            "smoke", node_args(run_id(), free_port(), 0, python="/nonexistent/python3", node="gpu-a")
        )
    )
    assert (result["kind"], result["diagnosis"]) == (
        "python-missing",
        "/nonexistent/python3 does not exist on gpu-a",
    )


@pytest.mark.torch
def test_nccl_with_a_torch_that_cannot_use_cuda_fails_the_node_before_anything_starts() -> None:
    """No usable CUDA here (CI has no GPU): the rig's nccl must not become a quiet Gloo run on the CPU."""
    args = node_args(run_id(), free_port(), 0, backend="nccl", node="gpu-a")
    result = node.run(protocol.check_args("smoke", args), simulated=False)
    assert (result["ok"], result["kind"], result["ranks"]) == (False, "no-cuda", [])
    assert result["backend"] == "nccl" and result["simulated"] is False
    assert result["diagnosis"].startswith("the rig says nccl, but torch 2.")
    # "it is a CPU-only build" with the CPU wheel; with the CUDA wheel on a box without a GPU, torch's reason.
    assert f"in {sys.executable} on gpu-a cannot use CUDA: " in result["diagnosis"]


@pytest.mark.parametrize(
    ("probe", "why"),
    [
        (
            {
                "cuda_build": "12.8",
                "cuda_available": False,
                "cuda_warning": "CUDA initialization: The NVIDIA "
                "driver on your system is too old (found version 11040).",
            },
            "cannot use CUDA: CUDA initialization: The NVIDIA driver on your system is too old (found "
            "version 11040).",
        ),
        (
            {"cuda_build": "12.8", "cuda_available": False, "cuda_warning": None},
            "cannot use CUDA: torch.cuda.is_available() is False",
        ),
        (
            {"cuda_build": "12.8", "cuda_available": True, "device_count": 1},
            "the rig says nccl with 2 processes per node, but torch 2.13.0 in /p on gpu-a sees 1 GPU(s) "
            "(CUDA_VISIBLE_DEVICES=3)",
        ),
    ],
)
def test_why_nccl_cannot_run_is_said(
    monkeypatch: pytest.MonkeyPatch, probe: dict[str, Any], why: str
) -> None:
    answer = {"python": "/p", "ok": True, "version": "2.13.0", **probe}
    monkeypatch.setattr(node.torch_probe, "probe_torch", lambda *a, **k: answer)
    args = node_args(
        "r1", 29500, 0, backend="nccl", python="/p", node="gpu-a", env={"CUDA_VISIBLE_DEVICES": "3"}
    )
    refused = node.probe_torch(node.Request(protocol.check_args("smoke", args)))
    assert refused is not None and refused["kind"] == "no-cuda"
    assert refused["diagnosis"].endswith(why), refused["diagnosis"]
    assert (
        node.probe_torch(node.Request(protocol.check_args("smoke", args), simulated=True)) is None
    )  # a twin's GPUs: Gloo, said in the report


def test_sizes_reach_the_bus_plateau_on_gpus_and_stay_small_on_the_cpu() -> None:
    without = {k: v for k, v in node_args("r1", 29500, 0).items() if k != "sizes_mib"}
    assert (
        node.Request(protocol.check_args("smoke", {**without, "backend": "nccl"})).sizes_mib
        == node.GPU_SIZES_MIB
    )
    assert max(node.GPU_SIZES_MIB) >= 128
    assert (
        node.Request(protocol.check_args("smoke", {**without, "backend": "nccl"}), simulated=True).sizes_mib
        == node.CPU_SIZES_MIB
    )
    assert (
        node.Request(protocol.check_args("smoke", {**without, "backend": "gloo"})).sizes_mib
        == node.CPU_SIZES_MIB
    )
    assert node.Request(protocol.check_args("smoke", {**without, "sizes_mib": [8]})).sizes_mib == [8.0]


@pytest.mark.torch
def test_rendezvous_port_held_by_another_program_fails_fast_naming_it(node_tmp: Path) -> None:
    rid, port = run_id(), free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        started = time.monotonic()
        result = node.run(protocol.check_args("smoke", node_args(rid, port, 0, timeout_s=FAIL_TIMEOUT_S)))
        elapsed = time.monotonic() - started
    assert result["kind"] == "port-in-use", result
    assert result["diagnosis"] == f"rendezvous port {port} on 127.0.0.1 is already in use"
    assert elapsed < FAIL_TIMEOUT_S  # torch's own bind error (the kind above), not the deadline
    assert_clean(rid, port, node_tmp)


@pytest.mark.torch
def test_master_where_nothing_listens_fails_within_the_rendezvous_timeout() -> None:
    rid, port = run_id(), free_port()
    started = time.monotonic()
    result = node.run(protocol.check_args("smoke", node_args(rid, port, 1, timeout_s=FAIL_TIMEOUT_S)))
    assert time.monotonic() - started < FAIL_TIMEOUT_S
    assert result["kind"] == "rendezvous-unreachable", result
    assert result["diagnosis"].startswith(f"rendezvous endpoint 127.0.0.1:{port} unreachable")
    assert_clean(rid, port)


@pytest.mark.torch
def test_peer_that_never_starts_fails_the_master_within_its_timeout() -> None:
    rid, port = run_id(), free_port()
    started = time.monotonic()
    result = node.run(protocol.check_args("smoke", node_args(rid, port, 0, timeout_s=FAIL_TIMEOUT_S)))
    assert time.monotonic() - started < FAIL_TIMEOUT_S
    assert result["kind"] == "rendezvous-timeout", result
    assert f"timed out waiting for peers at 127.0.0.1:{port}: 1 of 2 nodes joined" in result["diagnosis"]
    assert_clean(rid, port)


@pytest.mark.torch
def test_hang_is_killed_at_the_deadline_leaving_nothing_behind() -> None:
    rid, port = run_id(), free_port()
    with socket.socket() as silent:  # accepts connections (backlog) but never answers the store protocol
        silent.bind(("127.0.0.1", port))
        silent.listen()
        started = time.monotonic()
        result = node.run(protocol.check_args("smoke", node_args(rid, port, 1, timeout_s=8)))
        elapsed = time.monotonic() - started
        assert processes_of_run(rid) == []
    assert result["kind"] == "timeout" and result["timed_out"] is True, result
    assert f"rendezvous at 127.0.0.1:{port}" in result["diagnosis"]
    assert 8 <= elapsed < 8 + 2 * node.GRACE_S + 3
    assert_clean(rid, port)


PYTHON38 = Path("/root/.pyenv/versions/3.8.18/bin/python3.8")


@pytest.mark.torch
@pytest.mark.skipif(not PYTHON38.exists(), reason="needs a Python 3.8 interpreter to run the agent with")
def test_agent_zipapp_on_python38_runs_a_one_node_smoke(tmp_path: Path) -> None:
    """The node side as shipped: the agent zipapp's `smoke` verb on the oldest supported python3."""
    from mgpu_provision.fleet.bundle import build_agent

    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(build_agent().data)
    rid = run_id()
    args = node_args(rid, free_port(), 0, nnodes=1, nproc_per_node=1, node="gpu-a", backend="nccl")
    del args["sizes_mib"]  # the node picks them: small, since a simulated node runs Gloo on the CPU
    twin = Path(__file__).parents[2] / "examples" / "twins" / "rtx3090-nvlink.yaml"
    done = subprocess.run(
        [str(PYTHON38), str(pyz), "smoke"],
        input=json.dumps({"args": args, "simulate": str(twin)}),
        capture_output=True,
        text=True,
        timeout=args["timeout_s"] + 30,
    )
    answer = json.loads(done.stdout)
    assert answer["ok"] is True, answer
    result = answer["result"]
    assert result["ok"] is True, result
    assert [(r["rank"], r["world_size"]) for r in result["ranks"]] == [(0, 1)]
    assert (result["backend"], result["requested_backend"], result["simulated"]) == ("gloo", "nccl", True)
    rank = result["ranks"][0]
    assert (rank["backend"], rank["device"], rank["simulated"]) == ("gloo", "cpu", True)
    assert [b["size_mib"] for b in rank["bandwidth"]] == node.CPU_SIZES_MIB
    assert processes_of_run(rid) == []


# The rendezvous gets 30 s of it (a quarter): both agents import torch at once on two busy cores.
BARRIER_TEST_TIMEOUT_S = 120
ABORT_AFTER_RESULT = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("smoke_program", sys.argv[1])
program = importlib.util.module_from_spec(spec)
spec.loader.exec_module(program)
program.main(sys.argv[1:])
os.abort()  # the Gloo teardown crash after a passing result: this torchrun then skips its exit barrier
"""


@pytest.mark.torch
def test_peer_agent_that_leaves_without_its_exit_barrier_costs_seconds_not_the_deadline(
    tmp_path: Path,
) -> None:
    """Node 1's ranks pass, then abort while exiting, so its torchrun agent fails and leaves without the
    exit barrier in which node 0's agent then waits 300 s. Node 0 is judged by its ranks' results instead."""
    rid, port = run_id(), free_port()
    config = tmp_path / "config.json"
    settings = node.program_config(request(timeout_s=BARRIER_TEST_TIMEOUT_S), str(tmp_path))
    config.write_text(json.dumps(settings))
    wrapper = tmp_path / "abort_after_result.py"
    wrapper.write_text(ABORT_AFTER_RESULT)
    program = Path(node.__file__).with_name("smoke_program.py")
    peer_request = node.Request(
        protocol.check_args("smoke", node_args(rid, port, 1, timeout_s=BARRIER_TEST_TIMEOUT_S))
    )
    peer = subprocess.Popen(
        [*node.torchrun_command(peer_request, str(wrapper), str(program)), str(config)],
        env=dict(node.child_environment(peer_request, dict(os.environ)), TMPDIR=str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        started = time.monotonic()
        result = node.run(
            protocol.check_args("smoke", node_args(rid, port, 0, timeout_s=BARRIER_TEST_TIMEOUT_S))
        )
        elapsed = time.monotonic() - started
        peer_log = peer.communicate(timeout=BARRIER_TEST_TIMEOUT_S)[0].decode(errors="replace")
    finally:
        peer.kill()
        peer.wait()
    assert peer.returncode != 0 and "SIGABRT" in peer_log, peer_log[-2000:]
    assert sorted(p.name for p in tmp_path.glob("rank-*.json")) == ["rank-2.json", "rank-3.json"]
    assert result["ok"], {k: v for k, v in result.items() if k != "ranks"}
    # The old way ended at the deadline with kind "timeout"; now: the run's own time plus EXIT_GRACE_S.
    assert result["timed_out"] is False and elapsed < BARRIER_TEST_TIMEOUT_S - 30, elapsed
    assert_clean(rid, port)


# ---- the DataParallel check: one process, after every rank has ended ----------------------------------

# Stand-ins for what a CUDA node runs (no GPU here): a launcher whose two "ranks" write passing results,
# rank 1 lingering afterwards in a session of its own as torchrun's workers do; and a python that, asked
# for `--data-parallel`, records its argv, its environment and which processes of the run were alive when it
# began.
FAKE_LAUNCHER = """#!{python}
import json, os, subprocess, sys, time
config = json.load(open(sys.argv[-1]))
rank = '''
import json, os, sys, time
out, r, linger = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
check = {{"name": "ddp_step", "ok": True, "detail": "d"}}
result = {{"rank": int(r), "ok": True, "error": None, "checks": [check]}}
json.dump(result, open(os.path.join(out, "rank-%s.json.tmp" % r), "w"))
os.replace(os.path.join(out, "rank-%s.json.tmp" % r), os.path.join(out, "rank-%s.json" % r))
if linger:
    time.sleep(60)
'''
workers = [
    subprocess.Popen([sys.executable, "-c", rank, config["out_dir"], str(r), str(r)], start_new_session=True)
    for r in (0, 1)
]
workers[0].wait()
"""

FAKE_PYTHON = """#!{python}
import json, os, sys, time
if "--data-parallel" not in sys.argv:
    sys.exit("the stand-in python only plays the DataParallel process: %r" % sys.argv)
mark = ("{marker_env}=" + os.environ["{marker_env}"]).encode()
alive = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if int(pid) != os.getpid() and mark in open("/proc/%s/environ" % pid, "rb").read().split(b"\\0"):
            alive.append(int(pid))
    except OSError:
        pass
record = {{"argv": sys.argv, "alive": alive, "at": time.time(), "NCCL_DEBUG": os.environ.get("NCCL_DEBUG")}}
open({record!r}, "a").write(json.dumps(record) + "\\n")
if os.environ.get("FAKE_DP") == "hang":
    time.sleep(60)
config = json.load(open(sys.argv[-1]))
row = {{"name": "data_parallel", "ok": True, "detail": "batch 4 over 2 GPUs, output on cuda:1",
       "gpus": 2, "device_ids": [0, 1], "output_device": 1, "batch": config["batch_size"]}}
json.dump(row, open(os.path.join(config["out_dir"], "data-parallel.json"), "w"))
"""


@pytest.fixture
def cuda_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], Path]:
    """Smoke arguments for a one-node nccl run through the stand-ins, torch's probe answering 2 GPUs."""
    answer = {"python": "p", "ok": True, "version": "2.13.0", "cuda_build": "12.8", "cuda_available": True,
              "device_count": 2}  # fmt: skip
    monkeypatch.setattr(node.torch_probe, "probe_torch", lambda *a, **k: answer)
    record = tmp_path / "dp-record.jsonl"
    scripts = {
        "mgpu-torchrun": FAKE_LAUNCHER.format(python=sys.executable),
        "python": FAKE_PYTHON.format(python=sys.executable, marker_env=node.MARKER_ENV, record=str(record)),
    }
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    args = node_args(
        run_id(), free_port(), 0, nnodes=1, backend="nccl", python=str(tmp_path / "python"),
        launcher=str(tmp_path / "mgpu-torchrun"), env={"NCCL_DEBUG": "WARN"}, timeout_s=30,
    )  # fmt: skip
    return args, record


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_data_parallel_runs_alone_after_every_rank_has_ended(cuda_node: tuple[dict[str, Any], Path]) -> None:
    """Beside live ranks DataParallel cannot open its contexts under EXCLUSIVE_PROCESS: the node runs it as
    one process once torchrun and every rank (even one lingering after its result) are gone."""
    args, record = cuda_node
    result = node.run(protocol.check_args("smoke", args))
    assert result["ok"], result
    [dp] = records(record)
    assert dp["alive"] == []  # no rank, no torchrun: the lingering rank 1 was ended before it started
    program, flag, config = dp["argv"][1:]
    assert (Path(program).name, flag, Path(config).name) == (
        "mgpu_smoke_program.py",
        "--data-parallel",
        "config.json",
    )
    assert dp["NCCL_DEBUG"] == "WARN"  # the env files' variables, as the launcher gives them
    assert result["data_parallel"]["ok"] is True
    assert {k: result["data_parallel"][k] for k in ("device_ids", "output_device", "batch")} == {
        "device_ids": [0, 1],
        "output_device": 1,
        "batch": 4,
    }
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert processes_of_run(args["run_id"]) == []


def test_data_parallel_is_not_run_on_gloo(cuda_node: tuple[dict[str, Any], Path]) -> None:
    args, record = cuda_node
    result = node.run(
        protocol.check_args("smoke", args), simulated=True
    )  # a twin's GPUs: the ranks run Gloo on the CPU
    assert result["ok"] and result["backend"] == "gloo", result
    assert (result["data_parallel"], records(record)) == (None, [])


def test_a_data_parallel_process_that_hangs_fails_the_node_and_is_ended(
    cuda_node: tuple[dict[str, Any], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    args, record = cuda_node
    monkeypatch.setattr(protocol, "DATA_PARALLEL_TIMEOUT_S", 1.0)
    monkeypatch.setenv("FAKE_DP", "hang")
    result = node.run(protocol.check_args("smoke", args))
    assert (result["ok"], result["kind"]) == (False, "check-failed"), result
    assert result["diagnosis"].startswith("data_parallel: no result within 1 s")
    assert result["data_parallel"]["ok"] is False and len(records(record)) == 1
    assert processes_of_run(args["run_id"]) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_agent_ends_its_run_and_removes_its_folder(
    tmp_path: Path, node_tmp: Path, signum: int
) -> None:
    """A SIGTERM to the agent's process group (a service manager, a cancelled CI job) or a SIGHUP used to
    end the agent at once: the ranks, in a session of their own, ran on to their deadline and the work folder
    stayed. Now the verb unwinds as it does on Ctrl-C."""
    python = tmp_path / "torch-python"  # answers the torch probe; the run is the launcher's
    python.write_text(FAKE_TORCH)
    python.chmod(0o755)
    launcher = tmp_path / "launcher"
    launcher.write_text("#!/bin/sh\nexec sleep 120\n")
    launcher.chmod(0o755)
    rid = run_id()
    args = node_args(rid, free_port(), 0, python=str(python), launcher=str(launcher), timeout_s=120)
    code = (
        "import json, sys\nfrom mgpu_provision.node.verbs import smoke\nsmoke.run(json.loads(sys.argv[1]))\n"
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(protocol.check_args("smoke", args))],
        env={**os.environ, "TMPDIR": str(node_tmp)},
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        while not processes_of_run(rid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_of_run(rid), "the launcher never started"
        (folder,) = node_tmp.iterdir()
        assert folder.name.startswith(f"mgpu-smoke-{rid}-0-")
        agent.send_signal(signum)
        assert agent.wait(timeout=30) == 128 + signum
    finally:
        agent.kill()
        for pid in processes_of_run(rid):
            os.kill(pid, signal.SIGKILL)
    assert processes_of_run(rid) == []
    assert list(node_tmp.iterdir()) == []
