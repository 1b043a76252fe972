"""SLI: the X config snippet (every GPU by bus id, one option per mode, Off removes it, a ServerLayout that
would hide it), and the manual Control Panel step on Windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import protocol
from mgpu_provision.errors import ProvisionError
from mgpu_provision.facts import Facts
from mgpu_provision.node.host import files as node_files
from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.resources import envfiles, sli
from mgpu_provision.rig import LoadedRig, load_rig

XORG = "/etc/X11/xorg.conf.d/20-mgpu-provision.conf"
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
BUS_IDS = ("00000000:41:00.0", "00000001:0A:00.1")


def load(tmp_path: Path, text: str = RIG, **replace: str) -> LoadedRig:
    for old, new in replace.items():
        text = text.replace(old, new)
    (tmp_path / "rig.yaml").write_text(text)
    return load_rig(tmp_path / "rig.yaml")


def facts(mode: str | None = None, bus_ids: tuple[str, ...] = BUS_IDS, **more: Any) -> Facts:
    info = {
        "hostname": "h",
        "os": "x",
        "kernel": "x",
        "arch": "x",
        "boot_id": "b",
        "python": "3",
        "user": "u",
    }
    gpus = [
        {"index": i, "name": "NVIDIA RTX A6000", "uuid": f"GPU-{i}", "pci_bus_id": bus, "memory_mib": 49152}
        for i, bus in enumerate(bus_ids)
    ]
    return Facts.model_validate(
        {
            "agent_version": "0",
            "host": info,
            "driver": {"nvml": "ok"},
            "gpus": gpus,
            "sli": {"mode": mode},
            **more,
        }
    )


def context(loaded: LoadedRig, name: str, box: Facts) -> HostContext:
    return HostContext(loaded, loaded.host(name), box)


def snippet(loaded: LoadedRig, box: Facts | None = None) -> str:
    [xorg] = sli.desired(context(loaded, "lin", box or facts()))
    assert xorg.path == XORG
    return xorg.content


@pytest.mark.parametrize(
    ("nvml", "x"),
    [
        ("00000000:41:00.0", "PCI:65:0:0"),
        ("0000:0A:1F.7", "PCI:10:31:7"),
        ("00000002:C1:00.0", "PCI:193@2:0:0"),
    ],
)
def test_bus_ids_are_written_as_x_reads_them_in_decimal(nvml: str, x: str) -> None:
    assert sli.x_bus_id(nvml) == x


def test_a_bus_id_x_cannot_read_is_a_clear_error() -> None:
    with pytest.raises(ProvisionError, match=r"GPU bus id 'PCI:1:0:0' is not domain:bus:device\.function"):
        sli.x_bus_id("PCI:1:0:0")


def test_one_device_per_gpu_and_the_screen_that_ties_them(tmp_path: Path) -> None:
    content = snippet(load(tmp_path))
    assert 'BusID          "PCI:65:0:0"' in content and 'BusID          "PCI:10@1:0:1"' in content
    sections = [line for line in content.splitlines() if line.startswith("Section")]
    assert sections == ['Section "Device"', 'Section "Device"', 'Section "Screen"']
    assert content.count("EndSection") == 3
    screen = content[content.index('Section "Screen"') :]
    assert (
        'Identifier     "mgpu-provision-screen"' in screen
        and 'Device         "mgpu-provision-gpu0"' in screen
    )
    assert 'Option         "SLI" "Mosaic"' in screen and "BaseMosaic" not in content.split("# Restart")[1]
    assert "ServerLayout" in content  # the file says how an existing layout hides it


def test_base_mosaic_writes_only_its_own_option(tmp_path: Path) -> None:
    loaded = load(tmp_path, **{"NVIDIA RTX A6000": "NVIDIA GeForce RTX 3090", "MOSAIC": "BaseMosaic"})
    content = snippet(loaded)
    assert 'Option         "BaseMosaic" "on"' in content
    assert 'Option         "SLI"' not in content  # with both set X refuses to start


def test_off_writes_nothing_and_removes_the_managed_snippet(tmp_path: Path) -> None:
    loaded = load(tmp_path, MOSAIC='"Off"')
    host = loaded.host("lin")
    assert sli.desired(context(loaded, "lin", facts())) == []
    assert sli.paths(loaded, host) == [XORG]
    present = facts(files=[{"path": XORG, "exists": True, "mode": "0644", "sha256": "a" * 64}])
    [change] = sli.diff_snippet(context(loaded, "lin", present))
    assert (change.resource, change.action, change.phase) == (f"file:{XORG}", "delete", "sli")
    assert change.summary == f"remove {XORG} (SLI Off is the driver default)"
    assert change.agent_step == protocol.remove_step(XORG)
    assert sli.diff_snippet(context(loaded, "lin", facts(files=[{"path": XORG, "exists": False}]))) == []


def test_no_sli_section_leaves_the_x_config_alone(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG.replace("    sli: {mode: MOSAIC}\n", ""))
    host = loaded.host("lin")
    assert sli.paths(loaded, host) == []
    present = facts(files=[{"path": XORG, "exists": True, "mode": "0644", "sha256": "a" * 64}])
    assert sli.diff_snippet(context(loaded, "lin", present)) == []
    assert sli.diff(context(loaded, "lin", facts())) == []


def test_a_server_layout_without_our_screen_is_a_manual_step(tmp_path: Path) -> None:
    loaded = load(tmp_path)
    layout = {"file": "/etc/X11/xorg.conf", "screens": ["Screen0"]}
    [change] = sli.diff(context(loaded, "lin", facts(xorg_layouts=[layout])))
    assert (change.resource, change.action, change.phase) == ("sli", "manual", "sli")
    assert change.summary.startswith(
        'X uses the ServerLayout in /etc/X11/xorg.conf, which does not list Screen "mgpu-provision-screen"'
    )
    ours = {"file": "/etc/X11/xorg.conf", "screens": ["mgpu-provision-screen"]}
    assert sli.diff(context(loaded, "lin", facts(xorg_layouts=[ours]))) == []
    assert sli.diff(context(loaded, "lin", facts())) == []


def test_no_gpus_to_name_is_a_failed_check_not_a_wrong_file(tmp_path: Path) -> None:
    loaded = load(tmp_path)
    [change] = sli.diff(context(loaded, "lin", facts(bus_ids=())))
    assert change.action == "verify-failed"
    assert change.summary == "cannot write the X config for SLI Mosaic: no GPU bus ids to name"
    assert sli.desired(context(loaded, "lin", facts(bus_ids=()))) == []


def test_the_node_reads_server_layouts_and_their_screens(tmp_path: Path) -> None:
    (tmp_path / "xorg.conf").write_text(
        'Section "ServerLayout"\n    Identifier "Layout0"\n    Screen 0 "Screen0" 0 0\n'
        '    Screen      1  "Screen1" RightOf "Screen0"\n'
        '    InputDevice "Keyboard0" "CoreKeyboard"\nEndSection\n'
        '# Section "ServerLayout"\nSection "Screen"\n    Identifier "Screen0"\nEndSection\n'
    )
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-other.conf").write_text('Section "Device"\n  Identifier "x"\nEndSection\n')
    layouts = node_files.server_layouts(
        [str(tmp_path / "xorg.conf"), str(tmp_path / "conf.d"), "/nonexistent"]
    )
    assert layouts == [{"file": str(tmp_path / "xorg.conf"), "screens": ["Screen0", "Screen1"]}]


def test_windows_gets_a_manual_control_panel_step(tmp_path: Path) -> None:
    loaded = load(tmp_path)
    host = loaded.host("win")
    assert sli.desired_mode(host, loaded.rig_of(host)) is None
    assert envfiles.paths(loaded, host) == sli.paths(loaded, host) == []
    [change] = sli.diff(context(loaded, "win", facts()))
    assert (change.resource, change.action, change.agent_step, change.phase) == ("sli", "manual", None, "sli")
    assert (
        change.summary == "set SLI to Mosaic by hand in the NVIDIA Control Panel: Workstation > Set up Mosaic"
    )


@pytest.mark.parametrize(
    ("mode", "where"),
    [
        ('"Off"', '3D Settings > Configure SLI, Surround, PhysX > "Disable SLI"'),
        ("BaseMosaic", '3D Settings > Configure SLI, Surround, PhysX > "Span displays with Surround"'),
    ],
)
def test_windows_step_names_the_control_panel_page(tmp_path: Path, mode: str, where: str) -> None:
    loaded = load(tmp_path, **{"NVIDIA RTX A6000": "NVIDIA GeForce RTX 3090", "MOSAIC": mode})
    [change] = sli.diff(context(loaded, "win", facts()))
    assert change.summary.endswith(f"NVIDIA Control Panel: {where}")


def test_windows_already_in_the_mode_needs_nothing(tmp_path: Path) -> None:
    assert sli.diff(context(load(tmp_path), "win", facts(mode="mosaic"))) == []
