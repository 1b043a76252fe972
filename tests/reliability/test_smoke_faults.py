"""A node lost in the middle of a smoke run: the others must fail within the timeout and nothing may remain.

Three test hosts form one DDP group and start `smoke` through their installed launchers. Once gpu-1's ranks
run, gpu-1 is cut off: its torchrun agent SIGKILLed (the ranks are orphaned in sessions of their own), or its
sshd sessions killed (the control side loses the connection; the agent runs on, orphaned). Every node must
then fail with a reason within the timeout, and no process, work folder or port of the run may be left.
"""

from __future__ import annotations

import glob
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgpu_provision.node.verbs.smoke import MARKER_ENV
from tests.support import smoke_helpers as helpers
from tests.support.hosts import HostFactory, TestHost
from tests.support.nodes import (
    agent_pids,
    finish,
    session_sshds,
    signal_all,
    start_cli,
    wait_for,
)
from tests.support.trial import Trial

# Beyond the node deadline: the torch probe, the kill grace periods, SSH and the CLI's own start.
MARGIN_S = 45


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def smoke_processes(host: TestHost) -> dict[int, str]:
    """pid -> command line of the smoke processes started on `host` (its mount namespace, the marker)."""
    assert host.process is not None
    namespace = os.readlink(f"/proc/{host.process.pid}/ns/mnt")
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") != namespace:
                continue
        except OSError:
            continue
        if any(var.startswith(MARKER_ENV.encode() + b"=") for var in _environ(pid)):
            found[pid] = _cmdline(pid)
    return found


def ranks_running(host: TestHost) -> bool:
    """Both ranks of `host` run the program (torchrun's own command line names the program too)."""
    commands = smoke_processes(host).values()
    workers = [
        c for c in commands if "smoke_program" in c and "torch.distributed.run" not in c and "sh " not in c
    ]
    return len(workers) == 2


def smoke_cut_off(
    factory: HostFactory, tmp_path: Path, trial: Trial, cut_off: Callable[[TestHost], None]
) -> tuple[list[TestHost], dict[str, Any]]:
    """Start smoke on three hosts, cut gpu-1 off once its ranks run, and check the verdict came in time
    with a reason for every node; the hosts and the report."""
    hosts = helpers.start_hosts(factory, 3)
    torch_path = helpers.site_packages()
    rig = helpers.smoke_rig(factory, tmp_path / "rig.yaml", hosts, helpers.FAIL_TIMEOUT_S, torch_path)
    helpers.apply_env_files(factory, rig)
    started = time.monotonic()
    # --no-isolate: the time to the verdict is what is measured, not the search for the bad node after it.
    proc = start_cli("smoke", str(rig), "--json", "--no-isolate", "--known-hosts", str(factory.known_hosts))
    try:
        wait_for(lambda: ranks_running(hosts[1]), "gpu-1's ranks", timeout=helpers.FAIL_TIMEOUT_S)
    except AssertionError:
        proc.kill()
        raise AssertionError(f"gpu-1's ranks never ran: {finish(proc).err[-1500:]}") from None
    cut_off(hosts[1])
    run = finish(proc, timeout=helpers.FAIL_TIMEOUT_S + MARGIN_S)
    elapsed = time.monotonic() - started
    assert run.code == 2, run.err[-2000:]
    report = run.json()
    nodes = {n["host"]: n for n in report["groups"][0]["nodes"]}
    trial.figures.update(
        hosts=3,
        seconds_to_verdict=round(elapsed, 1),
        verdicts=", ".join(f"{name} {node['kind'] or 'pass'}" for name, node in nodes.items()),
        gpu_1=(nodes["gpu-1"]["diagnosis"] or "")[:120],
    )
    assert elapsed < helpers.FAIL_TIMEOUT_S + MARGIN_S
    assert not report["groups"][0]["ok"] and not nodes["gpu-1"]["ok"] and nodes["gpu-1"]["diagnosis"], nodes
    return hosts, report


def check_nothing_left(trial: Trial, report: dict[str, Any], factory: HostFactory) -> None:
    run_id, endpoint = report["run_id"], report["groups"][0]["endpoint"]
    gone = lambda: not helpers.processes_of_run(run_id)  # noqa: E731
    wait_for(gone, f"the processes of {run_id} to end", timeout=MARGIN_S)
    assert factory.node_tmp.is_dir()  # the nodes' TMPDIR, where their work folders go
    for tmp in (factory.node_tmp, Path("/tmp")):
        assert not glob.glob(f"{tmp}/mgpu-smoke-{run_id}-*"), f"a work folder of the run was left in {tmp}"
    assert not helpers.listening(int(endpoint.rsplit(":", 1)[1]))
    trial.figures["left behind"] = "nothing"


def kill_torchrun(host: TestHost) -> None:
    agents = [pid for pid, command in smoke_processes(host).items() if "torch.distributed.run" in command]
    assert len(agents) == 1, smoke_processes(host)
    os.kill(agents[0], signal.SIGKILL)


def kill_sshd_sessions(host: TestHost) -> None:
    sshds = session_sshds(host)
    assert sshds
    signal_all(sshds, signal.SIGKILL)


def test_one_nodes_torchrun_sigkilled_mid_smoke(
    test_hosts: HostFactory, tmp_path: Path, trial: Trial
) -> None:
    trial.area, trial.tried = "fault", "smoke: one node's torchrun SIGKILLed while its ranks run (3 hosts)"
    trial.expect = "every node fails with a reason within the timeout; no process, work folder or port left"
    _, report = smoke_cut_off(test_hosts, tmp_path, trial, kill_torchrun)
    nodes = report["groups"][0]["nodes"]
    assert nodes[1]["kind"] == "crash" and "code -9" in nodes[1]["diagnosis"], nodes[1]
    assert all(not node["ok"] and node["diagnosis"] for node in nodes), nodes  # their peer's ranks vanished
    check_nothing_left(trial, report, test_hosts)


def test_one_nodes_sshd_killed_mid_smoke(test_hosts: HostFactory, tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "fault", "smoke: one node's sshd sessions SIGKILLed mid-run (3 hosts)"
    trial.expect = (
        "the group fails within the timeout naming the lost node; its orphaned run ends; nothing left"
    )
    hosts, report = smoke_cut_off(test_hosts, tmp_path, trial, kill_sshd_sessions)
    # Its agent runs on without the connection, so the ranks may still finish: the others' parts can pass,
    # but nobody can vouch for the lost node, and smoke's cleanup call ends what it left.
    lost = report["groups"][0]["nodes"][1]
    assert lost["kind"] == "failed" and "gpu-1" in lost["diagnosis"], lost
    wait_for(lambda: not agent_pids(hosts[1], "smoke"), "gpu-1's orphaned agent to end", timeout=MARGIN_S)
    check_nothing_left(trial, report, test_hosts)
