"""The agent fast path (issue 9): unpacked beside its zipapp so Python caches bytecode; bundles cached."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from mgpu_provision.fleet import bundle
from mgpu_provision.fleet.bundle import _sources_key, agent_files, build_agent
from mgpu_provision.fleet.session import agent_command
from mgpu_provision.node.__main__ import unpack_beside

ROOT = Path(__file__).resolve().parents[2]
TWIN = ROOT / "examples" / "twins" / "rtx3090-nvlink.yaml"
NODE_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
REQUEST = json.dumps({"args": {}, "simulate": str(TWIN)})


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home holding the uploaded agent, as `fleet` leaves it, with the control side's bundle cache apart."""
    bundle = build_agent(tmp_path / "bundles")
    cache = tmp_path / "home" / ".cache" / "mgpu-provision"
    cache.mkdir(parents=True)
    (cache / bundle.name).write_bytes(bundle.data)
    return tmp_path / "home"


def agent_name(home: Path) -> str:
    (pyz,) = (home / ".cache" / "mgpu-provision").glob("agent-*.pyz")
    return pyz.name


def run_command(home: Path, verb: str = "facts") -> subprocess.CompletedProcess[str]:
    command = agent_command(agent_name(home), NODE_PYTHON, verb, sudo=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.run(
        ["sh", "-c", command],
        input=REQUEST,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "HOME": str(home)},
        cwd="/",
    )


def test_first_run_unpacks_and_later_runs_use_the_folder_with_bytecode(home: Path) -> None:
    folder = home / ".cache" / "mgpu-provision" / agent_name(home).removesuffix(".pyz")
    first = run_command(home)
    assert first.returncode == 0, first.stderr
    assert (folder / "__main__.py").is_file()
    assert not list(folder.rglob("*.pyc"))  # the first run was the zipapp's: nothing compiled there
    second = run_command(home)
    assert second.returncode == 0, second.stderr
    assert list((folder / "mgpu_provision" / "node" / "verbs" / "__pycache__").glob("facts.*.pyc"))
    assert json.loads(second.stdout)["result"]["gpus"] == json.loads(first.stdout)["result"]["gpus"]
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name, f"{folder.name}.pyz"]


def test_concurrent_first_runs_all_answer_and_leave_one_folder(home: Path) -> None:
    command = agent_command(agent_name(home), NODE_PYTHON, "facts", sudo=False)
    env = {**os.environ, "HOME": str(home)}
    runs = [
        subprocess.Popen(
            ["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(4)
    ]
    answers = [run.communicate(REQUEST, timeout=120)[0] for run in runs]
    assert all(json.loads(answer)["ok"] for answer in answers)
    cache = home / ".cache" / "mgpu-provision"
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1  # no half-unpacked leftovers


def test_where_it_cannot_unpack_the_zipapp_keeps_answering(home: Path) -> None:
    cache = home / ".cache" / "mgpu-provision"
    blocker = cache / agent_name(home).removesuffix(".pyz")
    blocker.write_text("not a folder: as good as a read-only home for the rename")
    for _ in range(2):
        done = run_command(home)
        assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stderr
    assert unpack_beside(str(cache / agent_name(home))) is None
    assert sorted(p.name for p in cache.iterdir()) == sorted([blocker.name, agent_name(home)])


def test_unpack_needs_a_pyz_name(tmp_path: Path) -> None:
    assert unpack_beside(str(tmp_path / "agent.zip")) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files away needs root")
def test_under_sudo_the_folder_belongs_to_the_login_user(home: Path) -> None:
    pyz = home / ".cache" / "mgpu-provision" / agent_name(home)
    os.chown(pyz, 1000, 1000)
    folder = Path(unpack_beside(str(pyz)) or "")
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [folder, *folder.rglob("*")]}
    assert owners == {(1000, 1000)}


def test_bundle_comes_from_the_cache_while_the_sources_are_the_same(tmp_path: Path) -> None:
    built = build_agent(tmp_path)
    (cached,) = tmp_path.glob("*.pyz")
    assert cached.read_bytes() == built.data
    cached.write_bytes(b"what the cache holds")
    again = build_agent(tmp_path)
    assert again.data == b"what the cache holds"
    assert again.name.startswith("agent-") and again.name.endswith(".pyz")


def test_unusable_bundle_cache_still_builds(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("where the cache folder should be")
    assert build_agent(tmp_path / "file" / "bundles").data == build_agent(tmp_path / "ok").data


def test_sources_key_follows_content_and_names() -> None:
    files = agent_files()
    topology = "mgpu_provision/catalog/topology.py"
    changed = dict(files, **{topology: files[topology] + b"\n"})
    renamed = {("x/" + k if k == "pynvml.py" else k): v for k, v in files.items()}
    assert len({_sources_key(files), _sources_key(changed), _sources_key(renamed)}) == 3


def test_an_unchanged_install_names_its_agent_without_reading_the_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: reading and hashing ~1 MB of sources to name the zipapp was ~5 ms of every SSH run; a stamp
    of their sizes and modification times finds it, and an edited source builds a new one."""
    protocol = tmp_path / "protocol.py"
    protocol.write_bytes((bundle.PACKAGE_DIR / "protocol.py").read_bytes())
    shipped = bundle._agent_sources()
    sources = [
        (name, str(protocol) if name == "mgpu_provision/protocol.py" else path) for name, path in shipped
    ]
    monkeypatch.setattr(bundle, "_agent_sources", lambda: sources)
    cache = tmp_path / "bundles"
    first = build_agent(cache)
    reads: list[str] = []
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self.name) or read_bytes(self))
    again = build_agent(cache)
    assert again == first
    assert len(reads) == 1 and reads[0].endswith(".pyz")  # the zipapp only, none of the sources
    protocol.write_bytes(protocol.read_bytes() + b"\n")
    reads.clear()
    edited = build_agent(cache)
    assert edited.name != first.name and "protocol.py" in reads
