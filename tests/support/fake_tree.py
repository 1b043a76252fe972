"""A fake tree for unit tests of `--via clush --topology`: ClusterShell's real tree (the head's task, each
gateway's channel and its own task, gateways on this machine's python) over tests/support/fake_ssh.py, each
host a HOME of its own, every connection one line of a log. The real sshd case is
tests/e2e/test_clush_tree_e2e.py."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu_provision.fleet import clush
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.targets import HostTarget
from tests.support.fake_ssh import write_fake_ssh
from tests.support.hosts import fake_agent

# gw1 and gw2 reach two nodes each.
TOPOLOGY = "[routes]\nhead: gw[1-2]\ngw1: gpu-[001-002]\ngw2: gpu-[003-004]\n"
NODES = [f"gpu-{n:03d}" for n in range(1, 5)]


class Tree:
    """The fake fleet: the head's HOME, each host's, and the connections made."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "ssh.log"
        self.homes = tmp_path / "homes"
        self.head = tmp_path / "head"
        self.topology = tmp_path / "topology.conf"
        self.topology.write_text(TOPOLOGY)

    def connections(self) -> collections.Counter[str]:
        """How many ssh connections each host got since the last call."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.write_text("")
        return collections.Counter(line.split()[0] for line in lines)

    def records(self) -> list[Path]:
        return list((self.head / ".cache/mgpu-provision/clush").glob(f"*/{clush.TREE_RECORD}"))

    def record(self) -> Path:
        (record,) = self.records()
        return record

    def gateway_folders(self, gateway: str) -> list[Path]:
        return list((self.homes / gateway / ".cache/mgpu-provision/clush").glob("*"))


def fake_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tree]:
    """The fake fleet under `tmp_path`, for a fixture to yield from: the head's HOME, ClusterShell's ssh the
    stand-in, its gateways this python."""
    from ClusterShell.Defaults import DEFAULTS
    from ClusterShell.Task import task_self

    fleet = Tree(tmp_path)
    script = write_fake_ssh(tmp_path / "ssh", fleet.log, fleet.homes)
    fleet.head.mkdir()
    monkeypatch.setenv("HOME", str(fleet.head))  # the head's own copy and its record go under it
    monkeypatch.setenv("CLUSTERSHELL_GW_PYTHON_EXECUTABLE", sys.executable)
    monkeypatch.setenv("CLUSTERSHELL_GW_LOG_DIR", str(tmp_path))
    # Every tree run ends its task (clush._run): the next one's starts from ClusterShell's defaults. The
    # gateways get it with the task's other infos.
    monkeypatch.setitem(DEFAULTS._task_info, "ssh_path", str(script))
    task_self().set_info("ssh_path", str(script))
    yield fleet
    task_self().set_info("ssh_path", None)


def target(name: str, limit: float) -> HostTarget:
    return HostTarget(
        name=name, address="127.0.0.9", port=2222, user="root", identity_file=None, jump=None,
        become=False, python=sys.executable, connection="ssh", simulate=None, connect_timeout_s=5.0,
        command_timeout_s=limit,
    )  # fmt: skip


def facts(tree: Tree, names: list[str], limit: float = 60) -> dict[str, clush.Outcome]:
    options = FleetOptions(topology=tree.topology, known_hosts=tree.head / "known_hosts")
    hosts = [target(n, limit) for n in names]
    return clush.call_many_clush(hosts, "facts", {n: {} for n in names}, options, fake_agent())


def statuses(outcomes: dict[str, clush.Outcome]) -> dict[str, str]:
    return {name: outcome.status for name, outcome in outcomes.items()}
