"""Smoke measured as nccl-tests measure and checked as a fleet gate checks: sizes by what joins the GPUs,
nccl-tests' iterations and busbw, the transport read from NCCL's own log (an NVLink rig whose ranks talk
via SHM or NET fails, quoting the line), the GPUs read while busy, and default floors where a public
figure exists."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    assert found is not None and found["slow_line"] is None
    assert (found["intra_node"], found["inter_node"]) == (["P2P/IPC/read"], ["NET/Socket/3"])
    assert found["inter_lines"]["NET/Socket/3"].endswith(
        "Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3"
    )
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


def network_verdict(tmp_path: Path, log: str, local: set[int], **ddp: Any) -> list[str]:
    """The problems of a two-node group whose first node logged `log` (a recorded NCCL log), under a rig
    whose ddp section adds `ddp` (fabric, gpudirect_rdma)."""
    path = rig_file(tmp_path, HOSTS[:2])
    document = yaml.safe_load(path.read_text())
    document["rigs"]["pair"]["ddp"].update(ddp)
    path.write_text(yaml.safe_dump(document))
    loaded = load_rig(path)
    parts = control.plan_smoke(loaded, [loaded.host("gpu-a"), loaded.host("gpu-b")], "run-1")
    links = transport((NCCL / log).read_text(), local)
    outcomes = {"gpu-a": ok_outcome(0, transport=links), "gpu-b": ok_outcome(1)}
    return control.build_report("run-1", parts, outcomes, None).groups[0].problems


def test_an_infiniband_fabric_fails_when_nccl_fell_back_to_sockets(tmp_path: Path) -> None:
    problems = network_verdict(tmp_path, "rank-log-two-nodes.log", set(range(8, 16)), fabric="infiniband")
    assert problems == [
        "gpu-a: the rig's fabric is infiniband, but NCCL fell back to sockets between nodes (no usable HCA, "
        "or NCCL_IB_DISABLE / NCCL_NET set?): <cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> "
        "6[6] [send] via NET/Socket/3"
    ]
    assert network_verdict(tmp_path, "rank-log-two-nodes.log", set(range(8, 16)), fabric="ethernet") == []
    assert network_verdict(tmp_path, "rank-log-ib-no-gdrdma.log", set(range(32, 40)), fabric="roce") == []


def test_gpudirect_rdma_is_judged_from_the_channel_lines(tmp_path: Path) -> None:
    with_gdr = network_verdict(
        tmp_path, "rank-log-ib-gdrdma.log", {0, 1}, fabric="infiniband", gpudirect_rdma=True
    )
    assert with_gdr == []
    without = network_verdict(
        tmp_path, "rank-log-ib-no-gdrdma.log", set(range(32, 40)), fabric="infiniband", gpudirect_rdma=True
    )
    assert len(without) == 1 and without[0].startswith("gpu-a: the rig expects GPUDirect RDMA, but NCCL's")
    assert without[0].endswith(
        ": hostname-test:984:1257 [4] NCCL INFO Channel 06/0 : 36[4] -> 20[4] [send] via NET/IBext_v8/3"
    )


def test_default_floors_of_gb200_only_where_the_public_figure_is(tmp_path: Path) -> None:
    # azurehpc-health-checks conf/nd128isr_ndr_gb200_v6.conf: check_nccl_allreduce 432.0 on 4 GB200s.
    assert control.default_floor("NVIDIA GB200", "nvswitch", 4) == 380.0
    assert control.default_floor("NVIDIA GB200", "nvswitch", 8) is None
    assert control.default_floor("NVIDIA B200", "nvswitch", 8) is None  # no public figure found
