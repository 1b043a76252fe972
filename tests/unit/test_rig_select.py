"""LoadedRig's questions (host, rig, DDP group and rank, visible devices, paths) and `--limit` selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.errors import ProvisionError
from mgpu_provision.rig import LoadedRig, load_rig, select_hosts
from mgpu_provision.rig.models import Host

FLEET = """\
hosts:
  - {name: gpu-b, rig: pair, groups: [lab]}
  - {name: gpu-a, address: 10.0.0.11, rig: pair, groups: [lab]}
  - {name: a100-1, rig: quad}
  - {name: a100-2, address: 10.0.1.12, rig: quad}
  - {name: solo, rig: single, connection: local}
groups:
  rack2: [a100-1, a100-2]
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
    ddp: {master: gpu-a}
  quad:
    gpus: {model: "NVIDIA A100 80GB PCIe", count: 4}
    visible_devices: [3, GPU-aaaa1111, MIG-GPU-bbbb2222/1/0]
    ddp: {master: a100-2}
  single:
    gpus: {model: "NVIDIA RTX A6000", count: 1}
"""


@pytest.fixture
def fleet(tmp_path: Path) -> LoadedRig:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return load_rig(path)


def names(hosts: list[Host]) -> list[str]:
    return [host.name for host in hosts]


def test_host_and_rig_lookup(fleet: LoadedRig) -> None:
    host = fleet.host("a100-1")
    assert fleet.rig_of(host).gpus.count == 4
    with pytest.raises(ProvisionError, match="no host named 'gpu-z'"):
        fleet.host("gpu-z")


def test_ddp_group_puts_master_first_then_file_order(fleet: LoadedRig) -> None:
    assert names(fleet.ddp_group(fleet.host("gpu-b"))) == ["gpu-a", "gpu-b"]
    assert names(fleet.ddp_group(fleet.host("a100-1"))) == ["a100-2", "a100-1"]


def test_rendezvous_is_the_groups_with_this_hosts_node_rank(fleet: LoadedRig) -> None:
    a, b = (fleet.rendezvous(fleet.host(n)) for n in ("gpu-a", "gpu-b"))
    assert a is not None and b is not None
    assert (a.node_rank, b.node_rank) == (0, 1)
    assert a.members == b.members == ("gpu-a", "gpu-b")
    assert (b.master, b.master_addr, b.port, b.endpoint) == ("gpu-a", "10.0.0.11", 29500, "10.0.0.11:29500")
    assert (b.nnodes, b.nproc_per_node, b.world_size) == (2, 2, 4)
    assert (b.backend, b.rdzv_backend, b.rdzv_id) == ("nccl", "static", "mgpu-gpu-a")
    quad = fleet.rendezvous(fleet.host("a100-1"))
    assert quad is not None and (quad.node_rank, quad.nproc_per_node, quad.world_size) == (1, 3, 6)


def test_host_without_ddp_trains_alone(fleet: LoadedRig) -> None:
    assert names(fleet.ddp_group(fleet.host("solo"))) == ["solo"]
    assert fleet.rendezvous(fleet.host("solo")) is None


def test_visible_indices(fleet: LoadedRig) -> None:
    assert fleet.visible_indices(fleet.host("gpu-a")) is None
    uuids = ["GPU-0000", "GPU-bbbb2222-x", "GPU-cccc", "GPU-aaaa1111-y"]
    assert fleet.visible_indices(fleet.host("a100-1"), uuids) == [3, 3, 1]
    with pytest.raises(ProvisionError, match="visible device GPU-aaaa1111 matches no single GPU"):
        fleet.visible_indices(fleet.host("a100-1"))


def test_resolve_is_relative_to_the_rig_file(fleet: LoadedRig, tmp_path: Path) -> None:
    assert fleet.base_dir == tmp_path.resolve()
    assert fleet.resolve("twins/a.yaml") == tmp_path.resolve() / "twins/a.yaml"
    assert fleet.resolve("/etc/x") == Path("/etc/x")
    assert fleet.resolve("~/x") == Path.home() / "x"


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, ["gpu-b", "gpu-a", "a100-1", "a100-2", "solo"]),
        ("gpu-a", ["gpu-a"]),
        ("a100-2,gpu-b", ["gpu-b", "a100-2"]),  # file order, not limit order
        ("lab", ["gpu-b", "gpu-a"]),  # a host's own groups
        ("rack2", ["a100-1", "a100-2"]),  # a group of `groups`
        ("quad", ["a100-1", "a100-2"]),  # a rig type
        ("gpu-*", ["gpu-b", "gpu-a"]),
        ("*,!rack2", ["gpu-b", "gpu-a", "solo"]),
        ("!lab", ["a100-1", "a100-2", "solo"]),  # only exclusions: from the whole fleet
        (" gpu-a , ", ["gpu-a"]),
    ],
)
def test_select_hosts(fleet: LoadedRig, limit: str | None, expected: list[str]) -> None:
    assert names(select_hosts(fleet, limit)) == expected


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ("gpu-z", "--limit: 'gpu-z' matches no host, group or rig"),
        ("gpu-a,!gpu-q*", "--limit: 'gpu-q*' matches no host"),
        ("gpu-a,!gpu-a", "--limit 'gpu-a,!gpu-a' leaves no hosts"),
        (" , ", "--limit is empty"),
    ],
)
def test_select_hosts_refuses_typos(fleet: LoadedRig, limit: str, message: str) -> None:
    with pytest.raises(ProvisionError, match=message.replace("*", r"\*")):
        select_hosts(fleet, limit)
