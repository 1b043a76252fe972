"""The node side of `smoke --via srun` (node/verbs/slurm_smoke.py): the one srun command line every node's
part starts from, and the job id read from srun's own words."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.node.verbs import slurm_smoke, smoke

ARGS = {
    "python": "/opt/venv/bin/python", "nnodes": 2, "node_rank": 0, "nproc_per_node": 2,
    "master_addr": "na", "master_port": 29500, "backend": "gloo", "rdzv_backend": "static",
    "rdzv_id": "mgpu", "run_id": "mgpu-smoke-abc", "timeout_s": 60, "batch_size": 4,
    "launcher": "/usr/local/bin/mgpu-torchrun",
}  # fmt: skip


def test_srun_bounds_the_wait_for_nodes_and_ends_the_step_when_a_rank_fails() -> None:
    req = smoke.Request(protocol.check_args("smoke", ARGS))
    command = slurm_smoke.srun_command("/usr/bin/srun", req, ["na", "nb"], ["--gres=gpu:2"])
    folder = slurm_smoke.workdir("mgpu-smoke-abc")
    assert command[:8] == [
        "/usr/bin/srun", "-v", "--immediate=10", "--kill-on-bad-exit=1", "-N2", "--ntasks-per-node=1",
        "-w", "na,nb",
    ]  # fmt: skip
    # Slurm's own time limit past smoke's 60 s, then the installed launcher, then the program and config at
    # one path on every node.
    assert command[9:12] == ["--time=2", "--gres=gpu:2", "/usr/local/bin/mgpu-torchrun"]
    assert command[-2:] == [f"{folder}/mgpu_smoke_program.py", f"{folder}/config.json"]


def test_the_job_id_is_read_from_srun_verbose_output() -> None:
    said = "srun: defined options\nsrun: jobid 17: nodes(2):`na,nb', cpu counts: 2(x2)\n"
    assert slurm_smoke.job_id(said) == "17"
    assert slurm_smoke.job_id("srun: launching StepId=23.0 on host na, 1 tasks: 0\n") == "23"
    assert slurm_smoke.job_id("srun: error: Unable to allocate resources") is None


def test_prepare_writes_the_program_and_config_where_the_step_finds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_smoke.tempfile, "gettempdir", lambda: str(tmp_path))
    assert slurm_smoke.run(protocol.check_args("slurm-smoke", {**ARGS, "action": "prepare"}))["ok"]
    folder = Path(slurm_smoke.workdir("mgpu-smoke-abc"))
    assert (folder / "mgpu_smoke_program.py").read_bytes() == smoke.program_source()
    (folder / "out" / "rank-1.json").write_text('{"rank": 1, "ok": true}')
    assert slurm_smoke.run(protocol.check_args("slurm-smoke", {**ARGS, "action": "collect"}))["ranks"] == [
        {"rank": 1, "ok": True}
    ]
    assert not folder.exists()


def test_a_step_past_the_deadline_is_ended_through_srun_and_reported_with_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in for srun that never ends by itself, and says what signal ended it (srun forwards SIGTERM
    # to the step's tasks on every node).
    fake = tmp_path / "srun"
    ended = tmp_path / "ended"
    fake.write_text(
        f"#!/bin/sh\ntrap 'echo TERM > {ended}; kill $!; exit 143' TERM\n"
        'echo "srun: jobid 5: nodes(2):\\`na,nb\', cpu counts: 2(x2)" >&2\nsleep 30 >/dev/null & wait\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(slurm_smoke, "find_tool", lambda name: str(fake))
    result = slurm_smoke.run(
        protocol.check_args("slurm-smoke", {**ARGS, "timeout_s": 1, "action": "run", "nodes": ["na", "nb"]})
    )
    assert (result["ok"], result["kind"], result["job_id"], result["exit_code"]) == (
        False,
        "timeout",
        "5",
        None,
    )
    assert result["diagnosis"] == "srun step 5 did not end within 1 s"
    assert ended.read_text() == "TERM\n"
    assert result["elapsed_s"] < 5


def test_nodes_that_share_tmp_prepare_the_same_folder_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_smoke.tempfile, "gettempdir", lambda: str(tmp_path))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(
                lambda _: slurm_smoke.run(protocol.check_args("slurm-smoke", {**ARGS, "action": "prepare"})),
                range(32),
            )
        )
    assert all(r["ok"] for r in results), results
    folder = Path(slurm_smoke.workdir("mgpu-smoke-abc"))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "mgpu_smoke_program.py", "out"]


def test_the_steps_temporary_files_go_into_the_runs_folder_that_collect_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun makes a torchelastic_* folder under TMPDIR on every node and never removes it: each
    `smoke --via srun` left one per node in /tmp. srun passes its environment on to the tasks, so the step
    gets TMPDIR set to the run's own folder, the one `collect` removes."""
    fake = tmp_path / "srun"
    seen = tmp_path / "tmpdir"
    fake.write_text(f'#!/bin/sh\nprintf %s "$TMPDIR" > {seen}\n')
    fake.chmod(0o755)
    monkeypatch.setattr(slurm_smoke, "find_tool", lambda name: str(fake))
    monkeypatch.setattr(slurm_smoke.tempfile, "tempdir", str(tmp_path))
    args = {**ARGS, "run_id": "mgpu-smoke-tmp"}
    assert slurm_smoke.run(protocol.check_args("slurm-smoke", {**args, "action": "prepare"}))["ok"]
    assert slurm_smoke.run(protocol.check_args("slurm-smoke", {**args, "action": "run", "nodes": ["na"]}))[
        "ok"
    ]
    folder = slurm_smoke.workdir("mgpu-smoke-tmp")
    assert seen.read_text() == folder and folder.startswith(str(tmp_path))
    slurm_smoke.run(protocol.check_args("slurm-smoke", {**args, "action": "collect"}))
    assert not Path(folder).exists()
