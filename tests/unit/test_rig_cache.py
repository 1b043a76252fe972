"""The commands' rig cache (issue 32): a rig file that loaded once loads from the cache, and never stale.

Guards, not timings: a hit is proven by what the run did not import or call; a miss by the loader's own
answer (a changed topology file's new problem, an edited rig file's new host).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_provision.errors import ProvisionError, SpecError
from mgpu_provision.rig import cache, loader
from mgpu_provision.rig.cache import check_rig, load_rig
from tests.support.hosts import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "tests" / "unit" / "rigs" / "topo-2x-rtx3090.txt"
RIG = """\
hosts:
  - {name: gpu-a, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
    bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4, topology_file: captured.txt}
"""


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A private cache, and every fresh load the loader makes (a hit makes none)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    loads: list[Path] = []
    fresh = loader.load_rig
    monkeypatch.setattr(loader, "load_rig", lambda path: loads.append(Path(path)) or fresh(path))
    return loads


@pytest.fixture
def rig(tmp_path: Path) -> Path:
    (tmp_path / "captured.txt").write_text(TOPOLOGY.read_text())
    path = tmp_path / "rig.yaml"
    path.write_text(RIG)
    return path


def test_a_second_load_comes_from_the_cache_and_equals_the_first(counted: list[Path], rig: Path) -> None:
    first = load_rig(rig)
    second = load_rig(rig)
    assert len(counted) == 1
    assert second.spec == first.spec and second.topologies == first.topologies
    assert second.path == first.path and second.base_dir == first.base_dir
    assert check_rig(rig) == ((("gpu-a", "pair"),), 1) and len(counted) == 1


def test_an_edited_rig_file_is_loaded_again(counted: list[Path], rig: Path) -> None:
    load_rig(rig)
    rig.write_text(
        RIG.replace(
            "  - {name: gpu-a, rig: pair}", "  - {name: gpu-a, rig: pair}\n  - {name: gpu-b, rig: pair}"
        )
    )
    assert [h.name for h in load_rig(rig).spec.hosts] == ["gpu-a", "gpu-b"]
    assert len(counted) == 2


def test_a_changed_topology_file_is_loaded_again(counted: list[Path], rig: Path) -> None:
    load_rig(rig)
    (rig.parent / "captured.txt").write_text("not a matrix\n")
    with pytest.raises(SpecError, match=r"captured\.txt is not `nvidia-smi topo -m` output"):
        load_rig(rig)
    with pytest.raises(SpecError):  # a rig with problems is never cached: they are reported every time
        check_rig(rig)
    assert len(counted) == 3


def test_another_home_or_working_folder_is_another_entry(
    counted: list[Path], rig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`~` and relative paths in a rig file resolve against HOME and the working folder."""
    load_rig(rig)
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    load_rig(rig)
    monkeypatch.chdir(tmp_path)
    load_rig(rig)
    load_rig(rig)
    assert len(counted) == 3


def test_a_changed_loader_is_a_miss(
    counted: list[Path], rig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any edit of the code that loads rigs (here a stand-in for one of its files) invalidates the cache."""
    code = tmp_path / "rules.py"
    code.write_text("# v1\n")
    monkeypatch.setattr(cache, "_CODE", (code,))
    load_rig(rig)
    code.write_text("# version 2\n")
    load_rig(rig)
    load_rig(rig)
    assert len(counted) == 2


def test_a_rig_with_an_inventory_is_never_cached(counted: list[Path], tmp_path: Path) -> None:
    """An inventory is folders, variable files and plugins: no short key covers it."""
    (tmp_path / "hosts.ini").write_text("[gpu]\ngpu-a ansible_host=10.0.0.11\n")
    path = tmp_path / "rig.yaml"
    path.write_text(
        "inventory: hosts.ini\nrig_groups: {gpu: pair}\n"
        'rigs:\n  pair:\n    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}\n'
    )
    if importlib.util.find_spec("ansible") is None:  # an optional extra of the tool, in the test extra
        skip_or_fail("ansible-core is not installed", "the inventory tests need ansible-core")
    load_rig(path)
    load_rig(path)
    assert len(counted) == 2
    assert not list((tmp_path / "xdg").rglob("*.pickle"))


def test_a_corrupt_or_foreign_entry_is_a_miss(counted: list[Path], rig: Path) -> None:
    load_rig(rig)
    (entry,) = (Path(os.environ["XDG_CACHE_HOME"]) / "mgpu-provision" / "rigs").glob("*.pickle")
    entry.write_bytes(b"\x80\x04 not a pickle")
    assert load_rig(rig).spec.hosts[0].name == "gpu-a"
    entry.write_bytes(pickle.dumps(("another digest", {}, ((), 9), b"")))
    assert check_rig(rig) == ((("gpu-a", "pair"),), 1)
    assert len(counted) == 3


def test_hosts_are_found_by_name_through_one_index(rig: Path) -> None:
    """Issue 32: plan asks for every host by name; a scan per question was quadratic in the fleet
    (benchmarks/results/paper-fleet.md at 10,000 hosts)."""
    loaded = loader.load_rig(rig)
    assert loaded.host("gpu-a") is loaded.spec.hosts[0]
    index = vars(loaded)["_hosts_by_name"]  # made once, at the first question
    assert loaded.host("gpu-a") is index["gpu-a"] and vars(loaded)["_hosts_by_name"] is index
    with pytest.raises(ProvisionError, match="no host named 'gpu-z'"):
        loaded.host("gpu-z")


def test_entries_not_written_for_a_month_are_removed_at_the_next_store(
    counted: list[Path], rig: Path
) -> None:
    folder = Path(os.environ["XDG_CACHE_HOME"]) / "mgpu-provision" / "rigs"
    folder.mkdir(parents=True)
    stale, recent = folder / "stale.pickle", folder / "recent.pickle"
    for path in (stale, recent):
        path.write_bytes(b"")
    month = 31 * 24 * 3600
    os.utime(stale, (stale.stat().st_atime - month, stale.stat().st_mtime - month))
    load_rig(rig)
    assert not stale.exists() and recent.exists()
    assert len(list(folder.glob("*.pickle"))) == 2  # the recent one and the new entry


def test_the_fingerprint_covers_every_module_that_loading_a_rig_imports() -> None:
    """An edit to any module the loader runs (a rule's table of package names, the judge's default Xids) must
    make a cached rig a miss; a module the fingerprint missed would serve yesterday's verdict."""
    probe = (
        "import sys; from mgpu_provision.rig import load_rig; import mgpu_provision.rig.rig; "
        "print('\\n'.join(m.__file__ for n, m in sys.modules.items() "
        "if n.startswith('mgpu_provision') and getattr(m, '__file__', None)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = {Path(line).resolve() for line in done.stdout.split()}
    covered = {path.resolve() for path in cache.code_files()}
    assert loaded and loaded <= covered, sorted(str(p) for p in loaded - covered)


def test_an_edited_agent_installer_leaves_cached_rigs_valid() -> None:
    """Loading a rig runs the catalog's tables, not the agent: an edit to `node/packages/apt.py` must not
    make every cached rig a miss (it did while the rules read package names from node/packages/)."""
    files = {path.resolve() for path in cache.code_files()}
    package = Path(cache.__file__).resolve().parents[1]
    assert package / "catalog" / "names.py" in files
    assert not [path for path in files if (package / "node") in path.parents]
