"""The node's torch probe imports torch once per install: later facts calls reuse the answer (issue 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_provision.node.host import torch_probe
from mgpu_provision.node.host.torch_probe import probe_torch

# A stand-in torch that counts its imports in the file named by TORCH_IMPORTS.
FAKE_TORCH = """
import os
with open(os.environ["TORCH_IMPORTS"], "a") as log:
    log.write("imported\\n")
__version__ = "2.13.0"
class cuda:
    is_available = staticmethod(lambda: False)
    device_count = staticmethod(lambda: 0)
"""


@pytest.fixture
def torch_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    monkeypatch.setenv("TORCH_IMPORTS", str(tmp_path / "imports.log"))
    return package / "__init__.py"


def imports(tmp_path: Path) -> int:
    log = tmp_path / "imports.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


EXPECTED = {
    "python": sys.executable,
    "ok": True,
    "version": "2.13.0",
    "cuda_build": None,  # the stand-in has no torch.version: a CPU-only build
    "cuda_available": False,
    "cuda_warning": None,
    "device_count": 0,
}


def test_second_probe_does_not_import_torch_again(torch_install: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache" / "torch-probe.json")
    assert probe_torch(sys.executable, cache_file=cache) == EXPECTED
    assert probe_torch(sys.executable, cache_file=cache) == EXPECTED
    assert imports(tmp_path) == 1
    stored = json.loads(Path(cache).read_text())
    assert stored[sys.executable]["answer"]["version"] == "2.13.0"


def test_an_upgraded_torch_is_probed_again(torch_install: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "torch-probe.json")
    probe_torch(sys.executable, cache_file=cache)
    torch_install.write_text(FAKE_TORCH.replace("2.13.0", "2.14.0"))
    later = os.stat(torch_install).st_mtime_ns + 5_000_000_000
    os.utime(torch_install, ns=(later, later))
    assert probe_torch(sys.executable, cache_file=cache)["version"] == "2.14.0"
    assert imports(tmp_path) == 2


def test_a_changed_node_state_probes_again(
    torch_install: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = str(tmp_path / "torch-probe.json")
    probe_torch(sys.executable, cache_file=cache)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # as a driver reload or a reboot would
    probe_torch(sys.executable, cache_file=cache)
    assert imports(tmp_path) == 2


def test_failures_are_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open')\n")
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    cache = tmp_path / "torch-probe.json"
    probe = probe_torch(sys.executable, cache_file=str(cache))
    assert probe["error"] == f"import torch failed in {sys.executable}: libcudart.so.12: cannot open"
    assert not cache.exists()


def test_unwritable_or_corrupt_cache_still_answers(torch_install: Path, tmp_path: Path) -> None:
    corrupt = tmp_path / "torch-probe.json"
    corrupt.write_text("{not json")
    assert probe_torch(sys.executable, cache_file=str(corrupt)) == EXPECTED
    blocked = tmp_path / "file" / "torch-probe.json"
    (tmp_path / "file").write_text("a file where the cache folder should be")
    assert probe_torch(sys.executable, cache_file=str(blocked)) == EXPECTED
    assert probe_torch(sys.executable, cache_file=str(blocked)) == EXPECTED
    assert imports(tmp_path) == 3


def test_default_cache_lives_in_the_agent_cache_of_the_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/ops")
    assert torch_probe.torch_cache_file() == "/home/ops/.cache/mgpu-provision/torch-probe.json"


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every python the probe starts."""
    started: list[list[str]] = []
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: started.append(list(argv)) or run(argv, **kw))
    return started


def test_an_unchanged_python_answers_without_starting_it(
    torch_install: Path, tmp_path: Path, starts: list[list[str]]
) -> None:
    """Issue 32: the second interpreter was most of a facts call; an unchanged python needs none."""
    cache = str(tmp_path / "torch-probe.json")
    assert probe_torch(sys.executable, cache_file=cache) == EXPECTED
    assert probe_torch(sys.executable, cache_file=cache) == EXPECTED
    assert probe_torch(sys.executable, cache_file=cache) == EXPECTED
    assert len(starts) == 1 and imports(tmp_path) == 1


def test_a_torch_installed_earlier_on_the_path_after_the_first_probe_is_seen(
    torch_install: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, starts: list[list[str]]
) -> None:
    """Never stale: pip putting another torch into a folder that python searches first changes that
    folder, and the next probe asks the python again."""
    first = tmp_path / "first"
    first.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{first}{os.pathsep}{torch_install.parents[1]}")
    cache = str(tmp_path / "torch-probe.json")
    assert probe_torch(sys.executable, cache_file=cache)["version"] == "2.13.0"
    assert probe_torch(sys.executable, cache_file=cache)["version"] == "2.13.0"
    (first / "torch").mkdir()
    (first / "torch" / "__init__.py").write_text(FAKE_TORCH.replace("2.13.0", "2.99.0"))
    assert probe_torch(sys.executable, cache_file=cache)["version"] == "2.99.0"
    assert probe_torch(sys.executable, cache_file=cache)["version"] == "2.99.0"
    assert len(starts) == 2 and imports(tmp_path) == 2


def test_a_pth_file_or_a_moved_path_is_asked_again(
    torch_install: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, starts: list[list[str]]
) -> None:
    cache = str(tmp_path / "torch-probe.json")
    probe_torch(sys.executable, cache_file=cache)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{elsewhere}{os.pathsep}{torch_install.parents[1]}")
    probe_torch(sys.executable, cache_file=cache)
    pth = torch_install.parents[1] / "extra.pth"
    pth.write_text(str(elsewhere) + "\n")
    probe_torch(sys.executable, cache_file=cache)
    later = os.stat(pth).st_mtime_ns + 5_000_000_000
    os.utime(pth, ns=(later, later))  # an edited .pth: its folder's mtime stays, the file's does not
    probe_torch(sys.executable, cache_file=cache)
    probe_torch(sys.executable, cache_file=cache)
    assert len(starts) == 4


def test_a_wrapper_script_python_is_always_asked(
    torch_install: Path, tmp_path: Path, starts: list[list[str]]
) -> None:
    """A wrapper (pyenv's shim, a script) may pick another interpreter on every start."""
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    cache = str(tmp_path / "torch-probe.json")
    assert probe_torch(str(wrapper), cache_file=cache)["version"] == "2.13.0"
    assert probe_torch(str(wrapper), cache_file=cache)["version"] == "2.13.0"
    assert len(starts) == 2 and imports(tmp_path) == 1
