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
    monkeypatch.setattr(kernel, "_run", lambda argv: None)  # no grubby, no modinfo
    ready = kernel.readiness(modules, boot)
    assert ready == {
        "running": running,
        "installed": sorted([running, "999.0.0-1-generic", "0.1.0-1-generic"], key=kernel.kernel_key),
        "nvidia_module_for": sorted([running, "0.1.0-1-generic"], key=kernel.kernel_key),
        "next_boot": None,  # no grubby, no GRUB environment: the newest kernel is GRUB's first entry
        "secure_boot": False,
        "module_signed": None,  # only asked with Secure Boot on
        "module_key_enrolled": None,
    }


def test_secure_boot_asks_modinfo_for_the_signer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modules, boot = lay_out(tmp_path, {os.uname().release: "kernel/nvidia-550srv/nvidia.ko"})
    monkeypatch.setattr(kernel, "secure_boot", lambda: True)
    asked: list[list[str]] = []
    monkeypatch.setattr(kernel, "_run", lambda argv: asked.append(argv) or "\n")
    ready = kernel.readiness(modules, boot)
    assert ready is not None and ready["module_signed"] is False
    signer = next(argv for argv in asked if argv[:3] == ["modinfo", "-F", "signer"])
    assert signer[3].endswith("nvidia-550srv/nvidia.ko")


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


def modinfo(version: str) -> bytes:
    """An ELF-ish module whose .modinfo strings carry the driver version, as the kernel's build writes."""
    return b"\x7fELF\0\0license=NVIDIA\0srcversion=0123ABCD\0version=" + version.encode() + b"\0alias=pci\0"


def test_a_module_of_another_driver_version_does_not_count_as_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lzma

    running = os.uname().release
    modules, boot = lay_out(tmp_path, {running: None, "999.0.0-1-generic": None, "0.1.0-1-generic": None})
    (Path(modules) / running / "updates" / "dkms").mkdir(parents=True)
    (Path(modules) / running / "updates" / "dkms" / "nvidia.ko").write_bytes(modinfo("535.216.03"))
    stale = Path(modules) / "999.0.0-1-generic" / "kernel" / "nvidia-535srv" / "nvidia.ko.xz"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(lzma.compress(modinfo("535.161.08")))  # left by the driver before
    unreadable = Path(modules) / "0.1.0-1-generic" / "extra" / "nvidia.ko"
    unreadable.parent.mkdir(parents=True)
    unreadable.write_bytes(b"\x7fELF")  # no .modinfo to read: counted, as before
    monkeypatch.setattr(kernel, "secure_boot", lambda: False)
    monkeypatch.setattr(kernel, "_run", lambda argv: None)
    assert kernel.module_version(str(stale)) == "535.161.08"
    ready = kernel.readiness(modules, boot, driver_version="535.216.03")
    assert ready is not None
    assert ready["nvidia_module_for"] == sorted([running, "0.1.0-1-generic"], key=kernel.kernel_key)


def test_next_boot_is_the_bootloaders_default_not_the_highest_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = ["6.8.0-4-generic", "6.8.0-45-generic", "6.8.0-47-generic"]
    boot, default = tmp_path / "boot", tmp_path / "grub"
    (boot / "grub").mkdir(parents=True)
    env = boot / "grub" / "grubenv"
    env.write_text(
        "# GRUB Environment Block\n"
        "saved_entry=gnulinux-advanced-1a2b>gnulinux-6.8.0-45-generic-advanced-1a2b\n"
    )
    monkeypatch.setattr(kernel, "_run", lambda argv: None)
    default.write_text("GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n")
    assert kernel.next_boot(installed, str(boot), str(default)) is None  # saved_entry unused: entry 0
    default.write_text('GRUB_DEFAULT="saved"\n')
    assert kernel.next_boot(installed, str(boot), str(default)) == "6.8.0-45-generic"
    env.write_text(env.read_text() + "next_entry=gnulinux-6.8.0-4-generic-advanced-1a2b\n")  # grub-reboot
    assert kernel.next_boot(installed, str(boot), str(default)) == "6.8.0-4-generic"
    monkeypatch.setattr(kernel, "_run", lambda argv: "/boot/vmlinuz-6.8.0-47-generic\n")  # grubby (RHEL)
    assert kernel.next_boot(installed, str(boot), str(default)) == "6.8.0-47-generic"


MOKUTIL = """\
[key 1]
SHA1 Fingerprint: 76:a0:92:06:58:00:bf:37:69:01:c3:72:cd:55:a9:0e:1f:de:d2:e0
Certificate:
    Data:
        Version: 3 (0x2)
        Serial Number:
            5f:42:8a:16:93:d0:5e:b7:1c:11:9e:1c:d9:a2:2c:f6:07:3c:1d:e0
        X509v3 extensions:
            X509v3 Subject Key Identifier:
                1C:4F:0A:22:7B:3E:9D:51:04:66:29:E8:3F:D6:0B:74:AA:19:53:06
"""


def test_secure_boot_trusts_a_module_only_when_its_key_is_enrolled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "nvidia.ko"
    module.write_bytes(b"\x7fELF")
    answers = {"sig_key": "5F:42:8A:16:93:D0:5E:B7:1C:11:9E:1C:D9:A2:2C:F6:07:3C:1D:E0\n", "mokutil": MOKUTIL}
    monkeypatch.setattr(kernel, "_run", lambda argv: answers[argv[2] if argv[0] == "modinfo" else argv[0]])
    monkeypatch.setattr(kernel, "_read", lambda path: "")
    assert kernel.module_key_enrolled(str(module)) is True
    answers["sig_key"] = "DE:AD:BE:EF:00:11:22:33:44:55:66:77:88:99:AA:BB\n"  # a DKMS MOK never enrolled
    assert kernel.module_key_enrolled(str(module)) is False
    answers["sig_key"] = "\n"  # unsigned
    assert kernel.module_key_enrolled(str(module)) is False


def test_a_serial_is_never_compared_with_a_subject_key_id_and_a_loaded_module_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 38: a Canonical-signed module's sig_key is its signer's serial (kmod libkmod-signature.c);
    # /proc/keys names Canonical's key by its subject key id (x509_public_key.c). Compared with each other
    # a loaded, working module read "not enrolled" and failed the box.
    module = tmp_path / "nvidia.ko"
    module.write_bytes(b"\x7fELF")
    proc_keys = (
        "0a1b2c3d I------     1 perm 1f010000     0     0 asymmetri "
        "Canonical Ltd Secure Boot Signing: 61482aa2830d0ab2ad5af10b7250da9033ddcef0 X509.rsa 61482aa2 []\n"
    )
    answers: dict[str, str | None] = {"sig_key": "01\n", "mokutil": None, "grubby": None}
    answers["signer"] = "Canonical Ltd Secure Boot Signing\n"
    monkeypatch.setattr(kernel, "_run", lambda argv: answers[argv[2] if argv[0] == "modinfo" else argv[0]])
    monkeypatch.setattr(kernel, "_read", lambda path: proc_keys)
    assert kernel.module_key_enrolled(str(module)) is None  # no serial to compare with: not judged
    modules, boot = lay_out(tmp_path, {os.uname().release: "kernel/nvidia-550srv/nvidia.ko"})
    monkeypatch.setattr(kernel, "secure_boot", lambda: True)
    monkeypatch.setattr(kernel, "module_loaded", lambda: True)
    ready = kernel.readiness(modules, boot)
    assert ready is not None and ready["module_key_enrolled"] is True  # the kernel accepted it
