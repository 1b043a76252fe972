"""plan.py around the resource diffs: what facts a host's plan asks for, and a captured topology file that
went bad after the rig file was loaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.plan import host
from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.files import DesiredFile, ManagedFiles
from mgpu_provision.plan.host import facts_request, plan_host
from mgpu_provision.rig import LoadedRig, load_rig
from mgpu_provision.rig.models import Host
from tests.support.factories import TOPOLOGIES, case_facts

PAIR_BOX = {"box": {"topology": "2x-rtx3090-nvlink-bridge.txt", "model": "NVIDIA GeForce RTX 3090"}}
RIG = """
hosts:
  - {name: gpu-a, address: 10.0.0.11, rig: pair}
  - {name: win, address: 10.0.0.12, rig: pair, os: windows}
rigs:
  pair:
    gpus: {model: NVIDIA GeForce RTX 3090, count: 2}
    bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4, topology_file: captured.txt}
    sli: {mode: "Off"}
smoke: {python: /opt/venv/bin/python}
"""


@pytest.fixture
def loaded(tmp_path: Path) -> LoadedRig:
    shutil.copy(TOPOLOGIES / "2x-rtx3090-nvlink-bridge.txt", tmp_path / "captured.txt")
    (tmp_path / "rig.yaml").write_text(RIG)
    return load_rig(tmp_path / "rig.yaml")


def test_facts_request_names_managed_files_x_config_and_smoke_python(loaded: LoadedRig) -> None:
    request = facts_request(loaded, loaded.host("gpu-a"))
    assert request == {
        "files": [
            "/etc/profile.d/mgpu-provision.sh",
            "/etc/mgpu-provision/environment",
            "/etc/X11/xorg.conf.d/20-mgpu-provision.conf",
            # read also when the rig sets no GPU setting: a unit left from an earlier rig must be found
            "/etc/systemd/system/mgpu-provision-gpu-settings.service",
            # the node check's files, read too when the rig asks for none: one left behind is removed
            "/usr/local/lib/mgpu-provision/agent.pyz",
            "/etc/mgpu-provision/expectation.json",
            "/usr/local/bin/mgpu-provision-check",
            "/etc/systemd/system/mgpu-provision-check.service",
            "/etc/systemd/system/mgpu-provision-check.timer",
        ],
        "include_content": True,
        "python": "/opt/venv/bin/python",
        "xorg_paths": ["/etc/X11/xorg.conf.d/20-mgpu-provision.conf"],
        "xorg_layout_paths": [],  # SLI Off: no snippet, so no ServerLayout can hide one
        "units": ["mgpu-provision-gpu-settings"],
        "driver_repo": None,  # no driver.repo: no mirror to check
        "driver_packages": [],
        "nvidia_repository": False,  # no driver to install: no repository to look for
        "state_dir": "/var/lib/mgpu-provision",  # where the node keeps its health counter sample
        "slurm": False,  # the rig has no `slurm` section
        "containers": None,  # nor a `containers` one
    }


def test_windows_hosts_and_an_unmanaged_systemd_dir_ask_for_no_boot_unit(tmp_path: Path) -> None:
    (tmp_path / "rig.yaml").write_text(RIG + "files: {systemd_dir: null}\n")
    shutil.copy(TOPOLOGIES / "2x-rtx3090-nvlink-bridge.txt", tmp_path / "captured.txt")
    unmanaged = load_rig(tmp_path / "rig.yaml")
    request = facts_request(unmanaged, unmanaged.host("gpu-a"))
    assert (request["units"], [f for f in request["files"] if "systemd" in f]) == ([], [])
    (tmp_path / "rig.yaml").write_text(RIG)
    managed = load_rig(tmp_path / "rig.yaml")
    assert facts_request(managed, managed.host("win"))["units"] == []


def test_facts_request_looks_for_server_layouts_when_a_snippet_is_wanted(tmp_path: Path) -> None:
    (tmp_path / "rig.yaml").write_text(RIG.replace('sli: {mode: "Off"}', "sli: {mode: BaseMosaic}"))
    shutil.copy(TOPOLOGIES / "2x-rtx3090-nvlink-bridge.txt", tmp_path / "captured.txt")
    loaded = load_rig(tmp_path / "rig.yaml")
    request = facts_request(loaded, loaded.host("gpu-a"))
    assert request["xorg_layout_paths"] == ["/etc/X11/xorg.conf", "/etc/X11/xorg.conf.d"]


def test_facts_request_probes_torch_only_with_a_named_smoke_python(tmp_path: Path) -> None:
    (tmp_path / "rig.yaml").write_text(RIG.replace("smoke: {python: /opt/venv/bin/python}", "smoke: {}"))
    shutil.copy(TOPOLOGIES / "2x-rtx3090-nvlink-bridge.txt", tmp_path / "captured.txt")
    loaded = load_rig(tmp_path / "rig.yaml")
    assert facts_request(loaded, loaded.host("gpu-a"))["python"] is None


def test_facts_request_for_windows_manages_no_files(loaded: LoadedRig) -> None:
    request = facts_request(loaded, loaded.host("win"))
    assert request["files"] == [] and request["xorg_paths"] == []


def test_the_topology_file_is_read_once_when_the_rig_is_loaded(loaded: LoadedRig, tmp_path: Path) -> None:
    before = plan_host(loaded, loaded.host("gpu-a"), case_facts(PAIR_BOX))
    (tmp_path / "captured.txt").write_text("GPU0 GPU1\nnot a matrix\n")
    assert plan_host(loaded, loaded.host("gpu-a"), case_facts(PAIR_BOX)) == before
    (tmp_path / "captured.txt").unlink()
    assert plan_host(loaded, loaded.host("gpu-a"), case_facts(PAIR_BOX)) == before
    assert loaded.topologies["pair"].gpu_count == 2


def test_a_managed_file_is_one_registry_entry(loaded: LoadedRig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe of docs/ARCHITECTURE.md ("How to add a managed file"): one `FILES` entry, and the facts
    ask for its path, the plan writes it, the node check's expectations hold its digest."""
    motd = "/etc/motd.d/mgpu-provision"

    def paths(loaded: LoadedRig, host: Host) -> list[str]:
        return [motd] if host.os == "linux" else []

    def desired(ctx: HostContext) -> list[DesiredFile]:
        return [
            DesiredFile(path, f"rig {ctx.host.rig}\n", "0644", "env") for path in paths(ctx.loaded, ctx.host)
        ]

    entry = ManagedFiles(paths, desired)
    monkeypatch.setattr(host, "FILES", (*host.FILES, entry))
    monkeypatch.setattr(host, "DIFFS", (*host.DIFFS, entry.changes))  # DIFFS takes FILES' diffs at import
    gpu_a = loaded.host("gpu-a")
    assert motd in host.facts_request(loaded, gpu_a)["files"]
    box = case_facts(PAIR_BOX)
    [change] = [c for c in host.plan_host(loaded, gpu_a, box) if c.resource == f"file:{motd}"]
    assert (change.action, change.agent_step) == ("create", protocol.file_step(motd, "rig pair\n", "0644"))
    assert (
        host.expectation_of(loaded, gpu_a, box).files[motd]
        == DesiredFile(motd, "rig pair\n", "0644", "env").sha256
    )
    assert motd not in host.facts_request(loaded, loaded.host("win"))["files"]
