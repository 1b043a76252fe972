"""The node's interfaces and cores, read from /sys as the agent reads them (a fake /sys, and the real one)."""

from __future__ import annotations

from pathlib import Path

from mgpu_provision.facts import CpuInfo, NetInterface
from mgpu_provision.node.host import hostenv


def test_interfaces_are_up_by_their_iff_up_flag(tmp_path: Path) -> None:
    for name, flags in (("lo", "0x9"), ("eth0", "0x1003"), ("eth1", "0x1002"), ("odd", "zz")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "flags").write_text(flags + "\n")
    assert hostenv.interfaces(str(tmp_path)) == [
        {"name": "eth0", "up": True},
        {"name": "eth1", "up": False},
        {"name": "lo", "up": True},
        {"name": "odd", "up": False},
    ]
    assert hostenv.interfaces(str(tmp_path / "missing")) == []


def test_cores_count_each_physical_core_once(tmp_path: Path) -> None:
    usable = hostenv.cpu()["logical"]
    assert usable is not None and usable >= 1
    for index in range(usable):  # every usable CPU is a hyperthread sibling of CPU 0's core
        topology = tmp_path / f"cpu{index}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text("0\n")
    assert hostenv.cpu(str(tmp_path)) == {"logical": usable, "cores": 1}
    assert hostenv.cpu(str(tmp_path / "missing")) == {"logical": usable, "cores": None}


def test_the_real_node_answers_in_the_facts_shape() -> None:
    for interface in hostenv.interfaces():
        NetInterface.model_validate(interface)
    assert any(i["name"] == "lo" and i["up"] for i in hostenv.interfaces())
    CpuInfo.model_validate(hostenv.cpu())
