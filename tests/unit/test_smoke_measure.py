"""Smoke measured as nccl-tests measure and checked as a fleet gate checks: sizes by what joins the GPUs,
nccl-tests' iterations and busbw, the transport read from NCCL's own log (an NVLink rig whose ranks talk
via SHM or NET fails, quoting the line), the GPUs read while busy, and default floors where a public
figure exists."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import protocol
from mgpu_provision.fleet.pool import HostOutcome
from mgpu_provision.jobs import smoke as control
from mgpu_provision.node.verbs import smoke as node
from mgpu_provision.node.verbs.smoke_program import bus_bandwidth, sizes_that_fit
from mgpu_provision.node.verbs.smoke_watch import LoadSampler, transport, transport_problem
from mgpu_provision.rig import load_rig
from tests.support.smoke_control import HOSTS, ok_outcome, plan, rig_file
from tests.support.smoke_helpers import node_args, processes_of_run, run_id

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def defaults(**over: Any) -> node.Request:
    """A request that leaves sizes and iterations to the node."""
    args = node_args("r", 1, 0, **over)
    del args["sizes_mib"], args["iters"]
    return node.Request(protocol.check_args("smoke", args))


def test_sizes_reach_4_gib_where_nvlink_or_nvswitch_joins_the_gpus() -> None:
    linked = defaults(backend="nccl", interconnect="nvswitch")
    pcie = defaults(backend="nccl", interconnect="pcie")
    assert max(linked.sizes_mib) == 4096 and max(pcie.sizes_mib) == 256
    assert (linked.iters, linked.warmup_iters) == (20, 5)  # nccl-tests' -n 20 -w 5
    cpu = defaults(interconnect="nvswitch")  # gloo: the CPU's sizes
    assert max(cpu.sizes_mib) == 4 and (cpu.iters, cpu.warmup_iters) == (5, 1)


def test_sizes_are_capped_by_the_free_memory_of_the_fullest_gpu() -> None:
    free = 8 * 1024**3  # 8 GiB free: 40% of it holds the 1 GiB tensor, not the 4 GiB one
    assert sizes_that_fit([256.0, 1024.0, 4096.0], free) == [256.0, 1024.0]
    assert sizes_that_fit([4096.0], None) == [4096.0]


def test_busbw_is_nccl_tests_all_reduce_factor() -> None:
    assert bus_bandwidth(100.0, 8) == pytest.approx(175.0)  # 2(n-1)/n
    assert bus_bandwidth(100.0, 2) == pytest.approx(100.0)


def test_nccl_runs_ask_for_nccl_s_transport_log_and_the_rig_s_setting_wins() -> None:
    req = node.Request(
        protocol.check_args("smoke", node_args("r", 1, 0, backend="nccl", env={"NCCL_DEBUG": "WARN"}))
    )
    env = node.child_environment(req, {})
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("WARN", "INIT,GRAPH")
    assert node.child_environment(req, {}, rig_env=False)["NCCL_DEBUG"] == "INFO"


def test_an_nvlink_rig_whose_ranks_talk_via_shm_fails_with_the_line() -> None:
    found = transport((NCCL / "rank-log-via-shm.log").read_text(), set(range(8)))
    assert found is not None and found["intra_node"] == ["SHM/direct/direct"]
    problem = transport_problem(found, "nvswitch")
    assert problem is not None and "joined by nvswitch" in problem
    assert problem.endswith("[7] NCCL INFO Channel 01 : 7[7] -> 2[2] via SHM/direct/direct")
    assert transport_problem(found, "pcie") is None  # PCIe boxes without P2P use SHM by design


def test_channels_to_other_nodes_may_use_the_network() -> None:
    found = transport((NCCL / "rank-log-two-nodes.log").read_text(), set(range(8, 16)))
    assert found == {"intra_node": ["P2P/IPC/read"], "inter_node": ["NET/Socket/3"], "slow_line": None}
    assert transport_problem(found, "nvswitch") is None
    assert transport("no channel lines", {0}) is None


FAKE_LAUNCHER = """#!{python}
import json, os, subprocess, sys
config = json.load(open(sys.argv[-1]))
sys.stdout.write(open({fixture!r}).read())
sys.stdout.flush()
for r in (0, 1):
    check = {{"name": "ddp_step", "ok": True, "detail": "d"}}
    path = os.path.join(config["out_dir"], "rank-%d.json" % r)
    json.dump({{"rank": r, "ok": True, "error": None, "checks": [check]}}, open(path + ".tmp", "w"))
    os.replace(path + ".tmp", path)
"""
FAKE_PYTHON = """#!{python}
import json, os, sys
config = json.load(open(sys.argv[-1]))
row = {{"name": "data_parallel", "ok": True, "detail": "fine"}}
json.dump(row, open(os.path.join(config["out_dir"], "data-parallel.json"), "w"))
"""


def test_a_node_whose_rank_log_shows_shm_on_an_nvlink_rig_fails_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = {"python": "p", "ok": True, "version": "2.13.0", "cuda_build": "12.8", "cuda_available": True,
              "device_count": 2}  # fmt: skip
    monkeypatch.setattr(node.torch_probe, "probe_torch", lambda *a, **k: answer)
    two_ranks = tmp_path / "rank-log.log"
    lines = (NCCL / "rank-log-via-shm.log").read_text().splitlines()
    # The fixture's 8-rank box cut to this node's two ranks: the line joining ranks 0 and 1.
    two_ranks.write_text("\n".join(line.replace("0[0] -> 4[4]", "0[0] -> 1[1]") for line in lines))
    for name, text in (("mgpu-torchrun", FAKE_LAUNCHER), ("python", FAKE_PYTHON)):
        (tmp_path / name).write_text(text.format(python=sys.executable, fixture=str(two_ranks)))
        (tmp_path / name).chmod(0o755)
    args = node_args(
        run_id(), 29999, 0, nnodes=1, backend="nccl", python=str(tmp_path / "python"),
        launcher=str(tmp_path / "mgpu-torchrun"), timeout_s=30, interconnect="nvlink",
    )  # fmt: skip
    result = node.run(protocol.check_args("smoke", args))
    assert (result["ok"], result["kind"]) == (False, "transport"), result
    assert result["diagnosis"].endswith("NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct")
    assert result["transport"]["intra_node"] == ["SHM/direct/direct"]
    assert processes_of_run(args["run_id"]) == []
    args["interconnect"] = "pcie"  # the same log on a PCIe box: SHM is how its GPUs talk
    assert node.run(protocol.check_args("smoke", args))["ok"]


class BusyGpus:
    """What a backend answers while the ranks run: GPU 1's riser trained to gen 3 of 4, GPU 0 brakes."""

    def __init__(self) -> None:
        self.opened = self.closed = 0

    def open(self) -> None:
        self.opened += 1

    def close(self) -> None:
        self.closed += 1

    def device_count(self) -> int:
        return 2

    def clock_event_reasons(self, gpu: int) -> int:
        return 0x80 if gpu == 0 else 0

    def pcie_link(self, gpu: int) -> dict[str, int]:
        return {"gen": 3 if gpu == 1 else 4, "width": 16, "max_gen": 4, "max_width": 16}


def test_the_sampler_keeps_the_highest_link_and_every_clock_event_seen() -> None:
    busy: Any = BusyGpus()
    sampler = LoadSampler(busy)
    sampler.sample()
    sampler.sample()
    readings = sampler.close()
    assert (busy.opened, busy.closed) == (1, 1)
    assert readings[0]["throttle"] == ["hw_power_brake"] and readings[0]["samples"] == 2
    assert (readings[1]["pcie_gen"], readings[1]["pcie_max_gen"], readings[1]["pcie_width"]) == (3, 4, 16)
    assert LoadSampler(None).close() == []


def test_a_link_trained_down_or_a_brake_under_load_fails_the_group(tmp_path: Path) -> None:
    loaded = load_rig(rig_file(tmp_path, HOSTS[:2]))
    parts = control.plan_smoke(loaded, list(loaded.spec.hosts), "run-1")
    under_load = [
        {"index": 0, "samples": 4, "throttle": ["hw_power_brake"], "pcie_gen": 4, "pcie_width": 16,
         "pcie_max_gen": 4, "pcie_max_width": 16},
        {"index": 1, "samples": 4, "throttle": ["sw_power_cap"], "pcie_gen": 3, "pcie_width": 16,
         "pcie_max_gen": 4, "pcie_max_width": 16},
    ]  # fmt: skip
    outcomes: dict[str, HostOutcome[dict[str, Any]]] = {
        "gpu-a": ok_outcome(0, under_load=under_load),
        "gpu-b": ok_outcome(1),
    }
    group = control.build_report("run-1", parts, outcomes, None).groups[0]
    assert group.problems == [
        "gpu-a GPU 0 was in HW power brake while busy: check its cooling and power (PSU, cables)",
        "gpu-a GPU 1's PCIe link trained to gen 3 under load, below the gen 4 card and slot allow: "
        "reseat the card, check the riser and slot",
    ]
    healthy = [dict(under_load[1], pcie_gen=4)]
    outcomes["gpu-a"] = ok_outcome(0, under_load=healthy)
    assert control.build_report("run-1", parts, outcomes, None).groups[0].ok


def test_default_floors_where_a_public_figure_exists(tmp_path: Path) -> None:
    assert control.default_floor("NVIDIA H100 80GB HBM3", "nvswitch") == 400.0
    assert control.default_floor("NVIDIA GeForce RTX 3090", "nvlink-bridge") is None
    assert control.interconnect("nvlink-bridge", 2) == "nvlink"
    assert control.interconnect("nvlink-bridge", 4) == "pcie"
    parts = plan(tmp_path, HOSTS[:2])  # two RTX 3090 nodes: no public figure, no floor
    assert parts[0].floor_gbps is None and parts[0].args["interconnect"] == "pcie"
