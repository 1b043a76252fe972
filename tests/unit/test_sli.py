"""SLI: the X config snippet's mode on Linux, and the manual Control Panel step on Windows."""

from __future__ import annotations

from pathlib import Path

from mgpu_provision.facts import Facts
from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.resources import sli
from mgpu_provision.plan.resources.envfiles import desired_files
from mgpu_provision.spec import LoadedRig, load_rig

RIG = """\
version: 1
hosts:
  - {name: lin, address: 10.0.0.1, rig: pair}
  - {name: win, address: 10.0.0.2, rig: pair, os: windows}
rigs:
  pair:
    gpus: {model: "NVIDIA RTX A6000", count: 2}
    bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}
    sli: {mode: MOSAIC}
"""


def load(tmp_path: Path, text: str = RIG) -> LoadedRig:
    (tmp_path / "rig.yaml").write_text(text)
    return load_rig(tmp_path / "rig.yaml")


def context(loaded: LoadedRig, name: str, mode: str | None = None) -> HostContext:
    host = loaded.host(name)
    info = {
        "hostname": name,
        "os": "x",
        "kernel": "x",
        "arch": "x",
        "boot_id": "b",
        "python": "3",
        "user": "u",
    }
    facts = Facts.model_validate(
        {"agent_version": "0", "host": info, "driver": {"nvml": "ok"}, "sli": {"mode": mode}}
    )
    return HostContext(host=host, rig=loaded.rig_of(host), facts=facts, visible_count=2)


def test_linux_gets_the_mode_as_nvidia_xconfig_spells_it(tmp_path: Path) -> None:
    loaded = load(tmp_path)
    host = loaded.host("lin")
    assert sli.desired_mode(host, loaded.rig_of(host)) == "Mosaic"
    [xorg] = [f for f in desired_files(loaded, host) if f.phase == "sli"]
    assert xorg.path == "/etc/X11/xorg.conf.d/20-mgpu-provision.conf"
    assert 'Option         "SLI" "Mosaic"' in xorg.content
    assert sli.diff(context(loaded, "lin")) == []  # the file diff carries it on Linux


def test_no_sli_no_snippet(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG.replace("    sli: {mode: MOSAIC}\n", ""))
    host = loaded.host("lin")
    assert sli.desired_mode(host, loaded.rig_of(host)) is None
    assert sli.diff(context(loaded, "win")) == []


def test_windows_gets_a_manual_control_panel_step(tmp_path: Path) -> None:
    loaded = load(tmp_path)
    host = loaded.host("win")
    assert sli.desired_mode(host, loaded.rig_of(host)) is None
    [change] = sli.diff(context(loaded, "win"))
    assert (change.resource, change.action, change.agent_step, change.phase) == ("sli", "manual", None, "sli")
    assert change.summary == (
        'set SLI to Mosaic by hand: NVIDIA Control Panel > 3D Settings > "Set SLI and PhysX configuration" > '
        '"Span display with Surround"'
    )


def test_windows_off_names_disable_sli(tmp_path: Path) -> None:
    [change] = sli.diff(context(load(tmp_path, RIG.replace("MOSAIC", '"Off"')), "win"))
    assert change.summary.endswith('> "Disable SLI"')


def test_windows_already_in_the_mode_needs_nothing(tmp_path: Path) -> None:
    assert sli.diff(context(load(tmp_path), "win", mode="mosaic")) == []
