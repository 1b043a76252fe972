"""The node's CPU layout, memory and Slurm's view of it (node/host/machine.py), real /sys-shaped and twin."""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.catalog.cpulist import parse_cpu_list
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.host import machine
from tests.support.factories import facts_from_twin, write_twin

DEEPOPS_TOPOLOGY = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\t0-3,8-11\t0
GPU1\tNV4\t X \t4-7,12-15\t1
"""


def _sys_tree(
    root: Path, layout: dict[int, tuple[int, int]], numa: dict[int, str]
) -> tuple[Path, Path, Path]:
    cpu_dir, node_dir = root / "cpu", root / "node"
    for cpu, (socket, core) in layout.items():
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{socket}\n")
        (topology / "core_id").write_text(f"{core}\n")
    (cpu_dir / "online").write_text(f"0-{max(layout)}\n")
    for node, cpus in numa.items():
        (node_dir / f"node{node}").mkdir(parents=True)
        (node_dir / f"node{node}" / "cpulist").write_text(cpus + "\n")
    meminfo = root / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\nMemFree:  1 kB\n")
    return cpu_dir, node_dir, meminfo


def test_machine_reads_every_cpu_with_socket_core_and_numa_node(tmp_path: Path) -> None:
    # 2 sockets x 2 cores x 2 threads, with core ids that skip (as real Xeons' do).
    layout = {0: (0, 0), 1: (0, 4), 2: (1, 0), 3: (1, 4), 4: (0, 0), 5: (0, 4), 6: (1, 0), 7: (1, 4)}
    found = machine.machine(*_sys_tree(tmp_path, layout, {0: "0-1,4-5", 1: "2-3,6-7"}))
    assert found is not None and found["memory_mib"] == 64000
    assert [(t["cpu"], t["socket"], t["core"], t["numa"]) for t in found["threads"]][:4] == [
        (0, 0, 0, 0),
        (1, 0, 4, 0),
        (2, 1, 0, 1),
        (3, 1, 4, 1),
    ]


def test_machine_is_none_where_sys_has_no_topology(tmp_path: Path) -> None:
    (tmp_path / "online").write_text("0-1\n")
    assert machine.machine(str(tmp_path), str(tmp_path / "none"), str(tmp_path / "none")) is None


def test_cpu_lists_as_the_kernel_prints_them() -> None:
    assert parse_cpu_list("0-3,8-11\n") == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parse_cpu_list("5") == [5]
    assert parse_cpu_list("") == []


def test_simulated_machine_numbers_smt_siblings_after_every_first_thread() -> None:
    threads = machine.simulated_machine(2, 4, 2, 1000)["threads"]
    by_cpu = {t["cpu"]: (t["socket"], t["core"]) for t in threads}
    assert len(threads) == 16
    assert by_cpu[0] == by_cpu[8] == (0, 0)
    assert by_cpu[4] == by_cpu[12] == (1, 0)


def test_key_values_keep_a_reason_with_spaces() -> None:
    line = (
        "NodeName=n1 Arch=x86_64 Gres=gpu:rtx_3090:2(S:0-1) State=IDLE+DRAIN Reason=mgpu: GPU 1 lost [root@x]"
    )
    pairs = machine.parse_key_values(line)
    assert pairs["Gres"] == "gpu:rtx_3090:2(S:0-1)"
    assert pairs["Reason"] == "mgpu: GPU 1 lost [root@x]"


def test_twin_machine_minor_numbers_and_affinity_reach_the_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine, "slurm", lambda *args: None)  # no slurmd of this machine is asked
    twin = write_twin(
        tmp_path,
        DEEPOPS_TOPOLOGY,
        2,
        machine={"sockets": 2, "cores_per_socket": 4, "threads_per_core": 2, "memory_mib": 128000},
    )
    data = json.loads(twin.read_text())
    data["gpus"][1]["minor"] = 3
    twin.write_text(json.dumps(data))
    facts = facts_from_twin(twin, slurm=True)  # the CPU layout is for Slurm's files only
    assert [g.minor_number for g in facts.gpus] == [0, 3]
    assert [g.cpu_affinity for g in facts.gpus] == ["0-3,8-11", "4-7,12-15"]
    assert facts.machine is not None and facts.machine.memory_mib == 128000
    assert len(facts.machine.threads) == 16
    assert facts_from_twin(twin).machine is None  # not asked


def test_facts_read_the_cpu_layout_only_for_a_rig_with_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: every CPU's socket, core, L3 and NUMA node (~800 /sys reads on a 256-thread box) are for
    gres.conf and slurm.conf only: a facts request without `slurm` reads none of them. A twin without a
    `machine` section reads this machine's /sys (read only), as a real node does."""
    twin = write_twin(tmp_path, None, 1)
    monkeypatch.setattr(machine, "slurm", lambda *args: None)  # no slurmd of this machine is asked
    read: list[str] = []
    real_open = builtins.open

    def recording_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", recording_open)
    layout = ("/sys/devices/system/cpu/online", "/cache/index3/id", "/sys/devices/system/node/")

    def layout_reads() -> list[str]:
        return [path for path in read if any(part in path for part in layout)]

    assert facts_from_twin(twin).machine is None
    assert layout_reads() == []
    if not os.path.exists("/sys/devices/system/cpu/online"):
        pytest.skip("no /sys/devices/system/cpu here to read with slurm")
    assert facts_from_twin(twin, slurm=True).machine is not None
    assert layout_reads()  # the same request with `slurm` reads the layout


def test_a_twin_machine_without_its_sizes_is_named(tmp_path: Path) -> None:
    twin = write_twin(tmp_path, None, 1, machine={"sockets": 2})
    with pytest.raises(AgentFailure, match=r"machine\.cores_per_socket must be an integer"):
        facts_from_twin(twin)


def _fake_tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_slurm_facts_from_slurmd_and_the_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, "slurmd", 'echo "NodeName=n1 CPUs=16 Boards=1 SocketsPerBoard=2 CoresPerSocket=4"\n')
    _fake_tool(tmp_path, "scontrol", 'echo "NodeName=$4 State=IDLE Gres=gpu:rtx_3090:2(S:0-1)"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    (tmp_path / "nvidia0").touch()
    found = machine.slurm("ignored", [0, 7, None], dev_dir=str(tmp_path))
    assert found is not None and found["error"] is None
    assert found["missing_devices"] == [str(tmp_path / "nvidia7")]
    assert found["registers"]["CoresPerSocket"] == "4"
    assert found["controller"] == {"NodeName": "n1", "State": "IDLE", "Gres": "gpu:rtx_3090:2(S:0-1)"}


def test_an_unreachable_controller_is_an_error_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_tool(tmp_path, "slurmd", 'echo "NodeName=n1 CPUs=2"\n')
    _fake_tool(
        tmp_path, "scontrol", 'echo "slurm_load_node error: Unable to contact slurm controller" >&2; exit 1\n'
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    found = machine.slurm("n1", [])
    assert found is not None and found["controller"] is None
    assert (
        found["error"] == "scontrol show node n1: slurm_load_node error: Unable to contact slurm controller"
    )
