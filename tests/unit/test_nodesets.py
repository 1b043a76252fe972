"""Node sets (rig/nodesets.py): ClusterShell's NodeSet where installed, the fallback where not, the same
strings from both; `--limit` takes node sets beside globs; group sources need the library.

The library's behaviour recorded here is ClusterShell 1.10's (github.com/cea-hpc/clustershell,
lib/ClusterShell/NodeSet.py): patterns sorted, numbers by width then value, unpadded numbers running on
across widths (`a[9-10]`), padded ones keeping their width (`n[099-100]`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mgpu_provision.errors import ProvisionError
from mgpu_provision.rig import load_rig, nodesets, select_hosts

needs_library = pytest.mark.skipif(not nodesets.clustershell(), reason="the clush extra is not installed")

CASES = [
    ([f"gpu-{n:03d}" for n in range(1, 63)], "gpu-[001-062]"),
    (["gpu-001", "gpu-002", "gpu-004", "login", "gpu-005"], "gpu-[001-002,004-005], login"),
    (["n9", "n10", "n01"], "n[9,01,10]"),
    (["n099", "n100"], "n[099-100]"),
    (["b2", "a1", "a2", "c"], "a[1-2], b2, c"),
    (["n1b", "n2b", "hgx-7"], "hgx-7, n[1-2]b"),
]


@pytest.fixture
def without_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodesets, "clustershell", lambda: False)


@needs_library
@pytest.mark.parametrize(("names", "folded"), CASES)
def test_the_library_folds(names: list[str], folded: str) -> None:
    assert nodesets.clustershell()
    assert nodesets.fold(names) == folded


@pytest.mark.parametrize(("names", "folded"), CASES)
def test_the_fallback_folds_the_same(names: list[str], folded: str, without_library: None) -> None:
    assert nodesets.fold(names) == folded


def random_names(seed: int) -> list[str]:
    pick = random.Random(seed)
    names = []
    for _ in range(pick.randint(1, 8)):
        prefix = pick.choice(["gpu-", "gpu", "n", "login", "x-", "gpu-a"])
        width = pick.choice([0, 0, 2, 3])
        number = pick.randint(0, 120 if width == 3 else 12)
        names.append(prefix + (f"{number:0{width}d}" if width else str(number)) + pick.choice(["", "b"]))
    return names


@needs_library
def test_library_and_fallback_agree_on_a_thousand_fleets(monkeypatch: pytest.MonkeyPatch) -> None:
    from ClusterShell.NodeSet import NodeSet

    fleets = [random_names(seed) for seed in range(1000)]
    library = [nodesets.fold(names) for names in fleets]
    monkeypatch.setattr(nodesets, "clustershell", lambda: False)
    assert [nodesets.fold(names) for names in fleets] == library
    for folded in library:  # and each single-bracket pattern expands alike
        for term in nodesets.split_terms(folded.replace(", ", ",")):
            if term.count("[") == 1:
                assert nodesets.expand(term) == list(NodeSet(term)), term


@pytest.mark.parametrize("library", [pytest.param(True, marks=needs_library), False])
def test_expand_and_bad_sets(library: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not library:
        monkeypatch.setattr(nodesets, "clustershell", lambda: False)
    assert nodesets.expand("gpu-[001-003,7]") == ["gpu-7", "gpu-001", "gpu-002", "gpu-003"]
    with pytest.raises(nodesets.NodeSetError, match=r"^--limit: 'gpu-\[001-' "):
        nodesets.expand("gpu-[001-")
    with pytest.raises(nodesets.NodeSetError, match=r"^--limit: 'gpu-\[9-3\]' is not a node set"):
        nodesets.expand("gpu-[9-3]")


def test_group_sources_need_the_library(without_library: None) -> None:
    with pytest.raises(nodesets.NodeSetError, match=r"'@st:drain' is a ClusterShell group; pip install"):
        nodesets.expand("@st:drain")


@needs_library
def test_group_source_unresolved_says_where_to_configure() -> None:
    with pytest.raises(nodesets.NodeSetError, match=r"'@nosuchsource:x'.*groups\.conf\.d"):
        nodesets.expand("@nosuchsource:x")


@needs_library
def test_group_source_resolves_through_clustershell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Slurm-like source as ClusterShell's groups.conf.d/slurm.conf.example writes one (map = a command),
    here printing what `sinfo -h -o "%N" -p gpu` would."""
    from ClusterShell import NodeSet, NodeUtils

    conf = tmp_path / "groups.conf"
    conf.write_text("[sp]\nmap: echo 'gpu-[002-003]'\nlist: echo gpu\n")
    monkeypatch.setattr(NodeSet, "RESOLVER_STD_GROUP", NodeUtils.GroupResolverConfig([str(conf)]))
    assert nodesets.expand("@sp:gpu") == ["gpu-002", "gpu-003"]


FLEET = """\
hosts:
  - {name: gpu-001, rig: pair}
  - {name: gpu-002, rig: pair}
  - {name: gpu-003, rig: pair}
  - {name: login, rig: pair, connection: local}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
"""


@pytest.mark.parametrize("library", [pytest.param(True, marks=needs_library), False])
def test_limit_takes_node_sets(library: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not library:
        monkeypatch.setattr(nodesets, "clustershell", lambda: False)
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    loaded = load_rig(path)
    assert [h.name for h in select_hosts(loaded, "gpu-[001,003],login")] == ["gpu-001", "gpu-003", "login"]
    assert [h.name for h in select_hosts(loaded, "!gpu-[002-099]")] == ["gpu-001", "login"]
    assert [h.name for h in select_hosts(loaded, "gpu-*3,log?n")] == ["gpu-003", "login"]  # globs as before
    with pytest.raises(ProvisionError, match=r"--limit: 'gpu-\[100-120\]' matches no host"):
        select_hosts(loaded, "gpu-[100-120]")
