"""`--via clush` starts its OpenSSH clients with posix_spawn, on the head and on every gateway, never with
ClusterShell's Python-level fork of the whole interpreter (clush.py `_SPAWN`; at 256 hosts through two
gateways it was 4 ms of the gateways' CPU a host, docs/ARCHITECTURE.md). A client that cannot be started
still ends as ClusterShell's own path ends it: exit 255, the host unreachable. Run through ClusterShell's
real task and tree over tests/support/fake_ssh.py (tests/support/fake_tree.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu_provision.fleet import clush
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.rig import nodesets
from tests.support.fake_tree import NODES, Tree, facts, fake_tree, statuses, target
from tests.support.hosts import fake_agent

pytestmark = pytest.mark.skipif(not nodesets.clustershell(), reason="the clush extra is not installed")

# On the gateways' PYTHONPATH: a gateway process (the one that imported ClusterShell.Gateway) notes each
# os.fork it makes, as the head's test below notes its own.
_NOTE_FORKS = """\
import os, sys
_fork = os.fork
def fork():
    if "ClusterShell.Gateway" in sys.modules:
        with open(os.environ["MGPU_TEST_FORKS"], "a") as out:
            out.write("gateway fork\\n")
    return _fork()
os.fork = fork
"""


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tree]:
    yield from fake_tree(tmp_path, monkeypatch)


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every os.fork this process makes while the test runs."""
    made: list[str] = []
    real = os.fork

    def fork() -> int:
        made.append("head fork")
        return real()

    monkeypatch.setattr(os, "fork", fork)
    return made


def test_the_head_and_the_gateways_spawn_their_clients_without_a_fork(
    tree: Tree, forks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_NOTE_FORKS)
    noted = tmp_path / "forks"
    noted.write_text("")
    monkeypatch.setenv("MGPU_TEST_FORKS", str(noted))
    monkeypatch.setenv("PYTHONPATH", str(hook))  # passed on to the gateways (clush.invoke_gateway)

    assert statuses(facts(tree, NODES)) == dict.fromkeys(NODES, "ok")
    # Every connection was made: the head's two to its gateways, and each node's from its gateway.
    assert tree.connections() == {"gw1": 4, "gw2": 4, **dict.fromkeys(NODES, 3)}
    assert forks == []
    assert noted.read_text() == ""


def test_a_flat_run_spawns_its_clients_without_a_fork(tree: Tree, forks: list[str], tmp_path: Path) -> None:
    options = FleetOptions(known_hosts=tree.head / "known_hosts")
    hosts = [target(name, 60) for name in NODES]
    outcomes = clush.call_many_clush(hosts, "facts", {n: {} for n in NODES}, options, fake_agent())
    assert statuses(outcomes) == dict.fromkeys(NODES, "ok"), outcomes
    assert forks == []


def test_a_client_that_cannot_start_leaves_its_host_unreachable(
    tree: Tree, forks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ClusterShell.Defaults import DEFAULTS
    from ClusterShell.Task import task_self

    missing = str(tmp_path / "no-such-ssh")
    monkeypatch.setitem(DEFAULTS._task_info, "ssh_path", missing)
    task_self().set_info("ssh_path", missing)
    options = FleetOptions(known_hosts=tree.head / "known_hosts")
    outcomes = clush.call_many_clush([target("gpu-001", 60)], "facts", {"gpu-001": {}}, options, fake_agent())
    assert statuses(outcomes) == {"gpu-001": "unreachable"}, outcomes
    # posix_spawn refused it, and ClusterShell's own fork ran the exec that fails, as before.
    assert forks == ["head fork"]
