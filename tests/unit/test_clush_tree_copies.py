"""`--via clush --topology`: the run's ssh_config and known_hosts reach a gateway once, not every run.

The head records which gateways hold a run's content-addressed folder and copies only to the others; a
gateway whose copy went since says so before it starts ClusterShell's gateway, and the head copies to it
and runs its hosts once more. Run here through ClusterShell's real tree (the head's task, the gateway's
channel and its own task), with ssh replaced by tests/support/fake_ssh.py: each command runs on this
machine in a HOME of its host's own, one log line per connection (the real sshd case is
tests/e2e/test_clush_tree_e2e.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu_provision.fleet import clush
from mgpu_provision.rig import nodesets
from tests.support.fake_tree import NODES, Tree, facts, fake_tree, statuses

pytestmark = pytest.mark.skipif(not nodesets.clustershell(), reason="the clush extra is not installed")

# With DEAD, a third gateway that refuses every connection (tests/support/fake_ssh.py).
DEAD = "[routes]\nhead: gw[1-2],dead\ngw1: gpu-[001-002]\ngw2: gpu-[003-004]\ndead: gpu-005\n"


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tree]:
    yield from fake_tree(tmp_path, monkeypatch)


def test_a_gateway_gets_the_runs_files_once_and_again_where_the_record_lacks_it(tree: Tree) -> None:
    first = facts(tree, NODES)
    assert statuses(first) == dict.fromkeys(NODES, "ok"), first
    # First contact: the copy, then the request, the agent's upload and the request again, each a round.
    assert tree.connections() == {"gw1": 4, "gw2": 4, **dict.fromkeys(NODES, 3)}
    assert json.loads(tree.record().read_text()) == ["gw1", "gw2"]

    # Recorded: the run goes straight through the gateways, one connection each (it was two: the copy).
    assert statuses(facts(tree, NODES)) == dict.fromkeys(NODES, "ok")
    assert tree.connections() == {"gw1": 1, "gw2": 1, **dict.fromkeys(NODES, 1)}

    # A gateway the record does not name gets the copy, the other does not.
    tree.record().write_text('["gw1"]')
    assert statuses(facts(tree, NODES)) == dict.fromkeys(NODES, "ok")
    assert tree.connections() == {"gw1": 1, "gw2": 2, **dict.fromkeys(NODES, 1)}
    assert json.loads(tree.record().read_text()) == ["gw1", "gw2"]

    # A record that does not read (cut short, not JSON, not a list of names) is no record: copy to all.
    for corrupt in ('["gw1", "gw', "\xff\xfe", '{"gw1": true}', "[1, 2]"):
        tree.record().write_bytes(corrupt.encode("latin-1"))
        assert statuses(facts(tree, NODES)) == dict.fromkeys(NODES, "ok"), corrupt
        assert tree.connections() == {"gw1": 2, "gw2": 2, **dict.fromkeys(NODES, 1)}, corrupt
        assert json.loads(tree.record().read_text()) == ["gw1", "gw2"], corrupt

    # Another run's files (here: another known_hosts) are another folder, copied once in its own right.
    (tree.head / "known_hosts").write_text("gpu-001 ssh-ed25519 AAAA\n")
    assert statuses(facts(tree, NODES)) == dict.fromkeys(NODES, "ok")
    assert tree.connections() == {"gw1": 2, "gw2": 2, **dict.fromkeys(NODES, 1)}
    assert len(tree.records()) == 2 and len(tree.gateway_folders("gw1")) == 2


def age(folder: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(folder, (then, then))


def test_run_folders_unused_for_two_weeks_go_on_the_head_and_the_gateways_the_runs_own_stays(
    tree: Tree,
) -> None:
    """Every change of the hosts or of known_hosts is a new folder; without pruning they pile up under each
    home. A tree run marks its own folder as used and removes the others no run used for STALE_AFTER_S, on
    the head and on each gateway it goes through; a fresh one (another run's) stays."""
    assert statuses(facts(tree, NODES)) == dict.fromkeys(NODES, "ok")
    (own,) = tree.gateway_folders("gw1")
    (own2,) = tree.gateway_folders("gw2")
    (head_own,) = (r.parent for r in tree.records())
    stale = clush.STALE_AFTER_S + 3600
    planted = {}
    for home in (tree.head, tree.homes / "gw1", tree.homes / "gw2"):
        old, fresh = (
            home / ".cache/mgpu-provision/clush/old0123456789ab",
            home / ".cache/mgpu-provision/clush/new0123456789ab",
        )
        for folder in (old, fresh):
            (folder / ".up.XXXXXX").mkdir(parents=True)  # with what an interrupted upload left
            (folder / "ssh_config").write_text("Host gone\n")
        age(old, stale)
        age(fresh, clush.STALE_AFTER_S - 3600)
        planted[home] = (old, fresh)
    for folder in (own, own2, head_own):
        age(folder, stale)  # this run's own, unused as long: used again now, so kept
    assert statuses(facts(tree, NODES)) == dict.fromkeys(NODES, "ok")
    for home, (old, fresh) in planted.items():
        assert not old.exists(), home
        assert fresh.is_dir(), home
    for folder in (own, own2, head_own):
        assert (folder / "ssh_config").is_file()
        assert time.time() - folder.stat().st_mtime < 600
    # A file or a link beside the folders is nobody's run folder: left alone.
    stray = tree.head / ".cache/mgpu-provision/clush/notes.txt"
    stray.write_text("mine")
    age(stray, stale)
    clush.prune_beside(head_own)
    assert stray.read_text() == "mine"


def test_a_gateway_that_lost_its_copy_gets_it_again_and_its_hosts_run_once_more(tree: Tree) -> None:
    facts(tree, NODES)
    tree.connections()
    for folder in tree.gateway_folders("gw1"):
        shutil.rmtree(folder)  # gw1's cache wiped; the head's record still names it

    again = facts(tree, NODES)
    assert statuses(again) == dict.fromkeys(NODES, "ok"), again
    # gw1: the run (refused: no files), the copy, the run again; its nodes are asked once, in the rerun.
    assert tree.connections() == {"gw1": 3, "gw2": 1, **dict.fromkeys(NODES, 1)}
    assert tree.gateway_folders("gw1") and json.loads(tree.record().read_text()) == ["gw1", "gw2"]
    assert statuses(facts(tree, NODES)) == dict.fromkeys(NODES, "ok")
    assert tree.connections() == {"gw1": 1, "gw2": 1, **dict.fromkeys(NODES, 1)}


def test_two_levels_of_gateways_first_contact_a_wiped_sub_gateway_and_one_behind_a_wiped_gateway(
    tree: Tree,
) -> None:
    """head → gw1 → sub1 → nodes. gw1 starts sub1 with the same gateway code (it once ran ClusterShell's
    own there: set on the worker after it had opened its channels, so sub1 mixed up its workers' input and
    a host's agent upload waited for the command limit, and a sub1 lacking its files was not noticed); a
    sub1 that refuses ends its hosts with GATEWAY_LOST and its words, not gw1 (ClusterShell's own raised
    there, ending gw1 and all behind it)."""
    tree.topology.write_text("[routes]\nhead: gw1\ngw1: sub1\nsub1: gpu-[001-002]\n")
    names = ["gpu-001", "gpu-002"]
    first = facts(tree, names, limit=10)
    assert statuses(first) == dict.fromkeys(names, "ok"), first
    assert tree.connections() == {"gw1": 5, "sub1": 4, "gpu-001": 3, "gpu-002": 3}  # the copy twice

    for folder in tree.gateway_folders("sub1"):
        shutil.rmtree(folder)
    again = facts(tree, names, limit=10)
    assert statuses(again) == dict.fromkeys(names, "ok"), again
    # sub1: the refused run, the copy, the run again (each through gw1).
    assert tree.connections() == {"gw1": 3, "sub1": 3, "gpu-001": 1, "gpu-002": 1}

    # gw1 wiped and sub1 not recorded: the copy to sub1, refused by gw1 on the way, starts again at gw1.
    for folder in tree.gateway_folders("gw1"):
        shutil.rmtree(folder)
    tree.record().write_text('["gw1"]')
    again = facts(tree, names, limit=10)
    assert statuses(again) == dict.fromkeys(names, "ok"), again
    assert tree.connections() == {"gw1": 4, "sub1": 2, "gpu-001": 1, "gpu-002": 1}
    assert json.loads(tree.record().read_text()) == ["gw1", "sub1"]


def test_a_gateway_failing_otherwise_stays_lost_with_its_own_words_and_is_not_retried(tree: Tree) -> None:
    tree.topology.write_text(DEAD)
    names = [*NODES, "gpu-005"]
    refused = (
        "cannot reach gpu-005 (127.0.0.9:2222) through gateway dead: "
        "ssh: connect to host 127.0.0.9 port 22: Connection refused"
    )
    # Not recorded: the copy finds it gone and its host ends before the run.
    outcomes = facts(tree, names)
    assert statuses(outcomes) == {**dict.fromkeys(NODES, "ok"), "gpu-005": "unreachable"}, outcomes
    assert outcomes["gpu-005"].error == refused
    assert tree.connections()["dead"] == 1
    assert json.loads(tree.record().read_text()) == ["gw1", "gw2"]

    # Recorded (it went since): the run finds it gone, in the same words, and does not try it again.
    tree.record().write_text('["dead", "gw1", "gw2"]')
    outcomes = facts(tree, names)
    assert statuses(outcomes) == {**dict.fromkeys(NODES, "ok"), "gpu-005": "unreachable"}, outcomes
    assert outcomes["gpu-005"].error == refused
    assert tree.connections() == {"dead": 1, "gw1": 1, "gw2": 1, **dict.fromkeys(NODES, 1)}


def test_a_gateway_without_the_runs_files_says_so_and_never_starts(tmp_path: Path) -> None:
    """What the head recognises: the gateway's marker line and a failed exit, before ClusterShell's gateway
    starts (here it could not: stdin is no channel)."""
    command = clush.invoke_gateway("~/.cache/mgpu-provision/clush/0123456789abcdef")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert done.stderr.splitlines() == [
        f"{clush.TREE_FILES_MISSING} (~/.cache/mgpu-provision/clush/0123456789abcdef)"
    ], done.stderr
