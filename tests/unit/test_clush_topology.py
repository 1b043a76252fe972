"""`--via clush --topology FILE`: ClusterShell's topology.conf read and checked against the rig before any
host is asked; each problem is one line naming the file, the line and what to change (ClusterShell's own
parser says "Invalid configuration file" and names no line or host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.cli import main
from mgpu_provision.errors import ProvisionError
from mgpu_provision.fleet.clush_tree import read_topology
from mgpu_provision.rig import nodesets

pytestmark = pytest.mark.skipif(not nodesets.clustershell(), reason="the clush extra is not installed")

HOSTS = [f"gpu-{n:03d}" for n in range(1, 9)]
ENTRIES = "".join(f"  - {{name: {h}, address: 10.0.0.{i}, rig: pair}}\n" for i, h in enumerate(HOSTS, 1))
RIG = "hosts:\n" + ENTRIES
RIG += 'rigs:\n  pair:\n    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}\n'


def topology(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topology.conf"
    path.write_text(text)
    return path


def test_a_good_topology_names_each_hosts_gateway_and_the_levels(tmp_path: Path) -> None:
    path = topology(
        tmp_path,
        "# racks\n[routes]\nadmin: gw[1-2]\ngw1: gpu-[001-004]\n"
        "gw2: gpu-[005-006],sub1\nsub1: gpu-[007-008]\n",
    )
    tree = read_topology(path, HOSTS)
    assert tree.head == "admin"
    assert tree.route("gpu-002") == "gw1" and tree.route("gpu-008") == "sub1" and tree.route("gw1") is None
    assert tree.gateway_levels(["gpu-001", "gpu-008"]) == [["gw1", "gw2"], ["sub1"]]
    assert tree.gateway_levels(["gpu-001"]) == [["gw1"]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[routes]\nadmin: gw1\ngw1: gpu-[001-004]\ngw1: gpu-099\n", "line 4: gpu-099 is not a host of"),
        ("[routes]\nadmin: gw1\ngw1 gpu-[001-004]\n", "line 3: 'gw1 gpu-[001-004]' is not a route"),
        ("[routes]\nadmin: gw1\ngw1: gpu-[001-004\n", "line 3: "),
        ("[Main]\nadmin: gw1\n", "no routes: the topology file needs a [routes] section"),
        ("[routes]\nadmin: gw1\ngw1: admin\n", "exactly one head"),
        ("[routes]\na: gw1\nb: gw2\ngw1: gpu-001\ngw2: gpu-002\n", "exactly one head"),
        ("[routes]\nadmin: gw[1-2]\ngw1: gpu-001\ngw2: gpu-001\n", "may be reached from one router"),
    ],
)
def test_bad_topologies_name_the_file_the_line_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    path = topology(tmp_path, text)
    with pytest.raises(ProvisionError) as raised:
        read_topology(path, HOSTS)
    assert str(raised.value).startswith(str(path)), raised.value
    assert message in str(raised.value), raised.value
    assert "\n" not in str(raised.value)


def test_the_cli_checks_the_topology_before_any_host_and_wants_via_clush(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG)
    path = topology(tmp_path, "[routes]\nadmin: gw1\ngw1: gpu-[001-008],gpu-x\n")
    assert main(["facts", str(rig), "--via", "clush", "--topology", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"{path}, line 3: gpu-x is not a host of the rig: "
        "remove it from the topology or add it to the rig's hosts"
    ), err
    assert main(["plan", str(rig), "--topology", str(path)]) == 1
    assert "--topology names ClusterShell's gateways: add --via clush" in capsys.readouterr().err
