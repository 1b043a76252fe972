"""program.py: nccl-tests arithmetic, exact all_reduce values, and a failed check recorded by a real rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_provision.node.verbs import smoke_program as program
from tests.support.smoke_helpers import free_port


@pytest.mark.parametrize(("world", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_busbw_is_algbw_times_2_n_minus_1_over_n(world: int, factor: float) -> None:
    assert program.bus_bandwidth(10.0, world) == pytest.approx(10.0 * factor)


def test_nccl_runs_on_the_ranks_gpu_and_never_falls_back_to_the_cpu() -> None:
    assert program.device_of("nccl", True, 1) == "cuda:1"
    assert program.device_of("gloo", True, 1) == "cpu"
    with pytest.raises(RuntimeError, match="backend nccl needs CUDA"):
        program.device_of("nccl", False, 0)


def test_allreduce_pattern_sums_to_the_expected_values() -> None:
    world, n = 5, 20
    summed = [
        sum(values) for values in zip(*(program.allreduce_pattern(r, n) for r in range(world)), strict=True)
    ]
    assert summed == program.expected_allreduce(world, n)
    assert program.expected_allreduce(world, n) != program.expected_allreduce(world - 1, n)


def test_checksum_tells_parameters_apart() -> None:
    assert program.checksum([1.0, 2.0]) == program.checksum([1.0, 2.0])
    assert program.checksum([1.0, 2.0]) != program.checksum([1.0, 2.0000001])
    assert -(2**63) <= program.checksum([0.5]) < 2**63


@pytest.mark.torch
def test_a_failed_check_is_recorded_and_the_rank_still_reports(tmp_path: Path) -> None:
    """One rank told to expect two: the world-size check fails with its numbers, the rest still runs."""
    config = {
        "out_dir": str(tmp_path),
        "expected_world_size": 2,
        "backend": "gloo",
        "requested_backend": "nccl",
        "simulated": True,
        "batch_size": 2,
        "sizes_mib": [0.0625],
        "iters": 1,
        "pg_timeout_s": 20,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    # TMPDIR: torchrun leaves its torchelastic folder behind; here it lands in the test's own folder.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "TMPDIR": str(tmp_path)}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        program.__file__, str(tmp_path / "config.json"),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "rank-0.json").read_text())
    assert result["ok"] is False and result["error"] is None
    assert (result["backend"], result["requested_backend"], result["simulated"]) == ("gloo", "nccl", True)
    assert (result["device"], result["gpu"]) == ("cpu", None)
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["world_size"] == {"name": "world_size", "ok": False, "detail": "1 ranks joined, expected 2"}
    assert checks["all_reduce"]["ok"] and checks["ddp_step"]["ok"]
    assert result["bandwidth"][0]["busbw_gbps"] == 0.0  # one rank moves nothing over a bus


@pytest.mark.torch
def test_an_exception_is_written_and_fails_the_rank(tmp_path: Path) -> None:
    config = {"out_dir": str(tmp_path), "expected_world_size": 1, "backend": "gloo", "batch_size": 1,
              "sizes_mib": [1], "iters": 1, "pg_timeout_s": 5}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "bad"}
    done = subprocess.run(
        [sys.executable, program.__file__, str(tmp_path / "config.json")],
        env=env,
        capture_output=True,
        timeout=50,
    )
    assert done.returncode == 1
    result = json.loads((tmp_path / "rank-0.json").read_text())
    assert result["ok"] is False and result["rank"] == 0
    assert "MASTER_PORT" in result["error"] or "bad" in result["error"]


def test_the_ranks_no_longer_run_data_parallel() -> None:
    """Beside the other ranks' CUDA contexts it fails under EXCLUSIVE_PROCESS: the node runs it after them."""
    assert not hasattr(program.Rank, "check_data_parallel")


@pytest.mark.parametrize(
    "argv", [["p.py", "--data-parallel"], ["p.py", "--data-parallel", "a.json", "b.json"]]
)
def test_data_parallel_entry_point_wants_exactly_one_config(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert program.main(argv) == 2
    assert capsys.readouterr().err == "usage: p.py --data-parallel CONFIG.json\n"


@pytest.mark.torch
def test_data_parallel_refuses_to_run_without_cuda(tmp_path: Path) -> None:
    """The CPU torch here: the row fails saying why, never a DataParallel run on the CPU."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"out_dir": str(tmp_path), "batch_size": 4}))
    done = subprocess.run(
        [sys.executable, program.__file__, "--data-parallel", str(config)], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads((tmp_path / "data-parallel.json").read_text())
    assert (row["name"], row["ok"], row["batch"]) == ("data_parallel", False, 4)
    assert row["detail"].startswith("DataParallel needs CUDA, and torch 2.")
    assert row["detail"].endswith("cannot use it in this process (torch.cuda.is_available() is False)")
    assert not list(tmp_path.glob("rank-*.json"))


@pytest.mark.parametrize(
    ("error", "detail"),
    [
        (
            "CUDA error: all CUDA-capable devices are busy or unavailable\nCUDA kernel errors might be ...",
            "cuda:1 (NVIDIA H200) refused a CUDA context: its compute mode is PROHIBITED, or a process "
            "outside the smoke holds it in EXCLUSIVE_PROCESS mode "
            "(nvidia-smi -q -d COMPUTE,PIDS shows which)",
        ),
        (
            "CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA",
            "cuda:1 (NVIDIA H200) refused a CUDA context: CUDA error: out of memory",
        ),
    ],
)
def test_a_refused_context_names_the_gpu_and_the_compute_mode(error: str, detail: str) -> None:
    assert program.refused_context(1, "NVIDIA H200", error) == detail
