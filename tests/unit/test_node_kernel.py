"""Kernel facts on a node: Xid lines in both driver formats, and the NVIDIA module's readiness for the running
and the newest installed kernel, read from a /lib/modules and /boot laid out as distributions do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mgpu_provision.node.nvidia import kernel

LOG = """\
[    5.120000] nvidia: loading out-of-tree module taints kernel.
[ 3021.5] NVRM: GPU at PCI:0000:cb:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7
[ 3021.6] NVRM: Xid (PCI:0000:cb:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
NVRM: Xid (0000:03:00): 14, Channel 00000001
[ 9.1] NVRM: Xid (PCI:0001:01:00): 94, pid=3312, name=python3, Contained: SM (0x1). RST: No, D-RST: No
[ 9.2] pcieport 0000:00:01.0: AER: Corrected error received: NVRM: Xid lookalike without code
"""


def test_xid_lines_of_current_and_old_drivers() -> None:
    assert kernel.parse_xids(LOG) == [("0000:cb:00", 79), ("0000:03:00", 14), ("0001:01:00", 94)]


def test_kernel_versions_order_as_numbers() -> None:
    versions = ["6.8.0-47-generic", "6.10.0-1-generic", "6.8.0-100-generic", "6.8.0-45-generic"]
    assert sorted(versions, key=kernel.kernel_key) == [
        "6.8.0-45-generic",
        "6.8.0-47-generic",
        "6.8.0-100-generic",
        "6.10.0-1-generic",
    ]


def lay_out(root: Path, kernels: dict[str, str | None]) -> tuple[str, str]:
    """A /lib/modules and /boot with an image per kernel and, where given, the module at that path."""
    modules, boot = root / "lib-modules", root / "boot"
    boot.mkdir()
    for version, module in kernels.items():
        (modules / version / "kernel").mkdir(parents=True)
        (boot / f"vmlinuz-{version}").write_text("")
        if module:
            (modules / version / module).parent.mkdir(parents=True, exist_ok=True)
            (modules / version / module).write_bytes(b"\x7fELF")
    (modules / "6.1.0-9-amd64" / "updates" / "dkms").mkdir(parents=True)  # leftover of a removed kernel
    return str(modules), str(boot)


def test_readiness_after_an_unattended_kernel_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = os.uname().release
    modules, boot = lay_out(
        tmp_path,
        {
            running: "updates/dkms/nvidia.ko.zst",
            "999.0.0-1-generic": None,
            "0.1.0-1-generic": "extra/nvidia.ko.xz",
        },
    )
    monkeypatch.setattr(kernel, "secure_boot", lambda: False)
    ready = kernel.readiness(modules, boot)
    assert ready == {
        "running": running,
        "installed": sorted([running, "999.0.0-1-generic", "0.1.0-1-generic"], key=kernel.kernel_key),
        "nvidia_module_for": sorted([running, "0.1.0-1-generic"], key=kernel.kernel_key),
        "secure_boot": False,
        "module_signed": None,  # only asked with Secure Boot on
    }


def test_secure_boot_asks_modinfo_for_the_signer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modules, boot = lay_out(tmp_path, {os.uname().release: "kernel/nvidia-550srv/nvidia.ko"})
    monkeypatch.setattr(kernel, "secure_boot", lambda: True)
    asked: list[list[str]] = []
    monkeypatch.setattr(kernel, "_run", lambda argv: asked.append(argv) or "\n")
    ready = kernel.readiness(modules, boot)
    assert ready is not None and ready["module_signed"] is False
    assert asked[0][:3] == ["modinfo", "-F", "signer"] and asked[0][3].endswith("nvidia-550srv/nvidia.ko")


def test_no_lib_modules_is_not_judged(tmp_path: Path) -> None:
    assert kernel.readiness(str(tmp_path / "absent"), str(tmp_path)) is None


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_xid_149_of_a_gpu_outside_pci_domain_0() -> None:
    xids = kernel.parse_xids(fixture("xid-149-netir-gb200.log"))
    assert xids == [("0019:01:00", 149), ("0018:01:00", 145), ("0019:01:00", 45)]


def test_a_gpu_fallen_off_the_bus_without_an_xid_line_counts_as_xid_79() -> None:
    assert kernel.parse_xids(fixture("fallen-off-bus-no-xid.log")) == [("0000:b3:00", 79)]


def test_the_single_fallen_off_line_beside_its_xid_79_is_not_counted_twice() -> None:
    assert kernel.parse_xids(fixture("sxid-nvswitch.log")) == [("0000:91:00", 79)]


def test_sxid_reports_are_read_once_each_with_their_switch() -> None:
    assert kernel.parse_sxids(fixture("sxid-nvswitch.log")) == [
        ("nvidia-nvswitch1", "0000:06:00.0", 20034, True),
        ("nvidia-nvswitch0", "0000:05:00.0", 20034, True),
        ("nvidia-nvswitch3", "0000:05:00.0", 12028, False),
    ]
