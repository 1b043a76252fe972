"""What the running kernel says about the GPUs: Xid errors since boot (and the GPUs that fell off the bus
without one), NVSwitch SXid errors, and whether the NVIDIA module is ready for the running and the next
kernel.

Both questions are answered outside NVML, from files and commands every Linux box has, so an admin's
first questions (did a GPU throw an Xid 79? will the box come back with a driver after the unattended
kernel upgrade?) are answered in the same facts call. Nothing here needs a GPU; a source that cannot be
read makes the answer None (not checked), never an error.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from ...judge.health import kernel_key
from .backend import SXidEvent, XidEvent

_ADDRESS = r"([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?"
# Current drivers: "NVRM: Xid (PCI:0000:cb:00): 13, pid=..."; old: "NVRM: Xid (0000:03:00): 14, Channel ...".
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?" + _ADDRESS + r"\): (\d+)")
# Recent open drivers may report a GPU lost at probe in three lines and no Xid line (NVIDIA/NVSentinel#155,
# driver 570.158.01): "NVRM: The NVIDIA GPU 0000:b3:00.0" / "NVRM: (PCI ID: 10de:26b5) installed in this
# system has" / "NVRM: fallen off the bus and is not responding to commands." NVSentinel and leptonai/gpud
# count it as Xid 79; so does the single line "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus."
_FALLEN_OFF = re.compile(
    r"NVRM: The NVIDIA GPU " + _ADDRESS + r"[^\n]*\n(?:[^\n]*\n){0,2}?[^\n]*NVRM: fallen off the bus"
    r"|NVRM: GPU " + _ADDRESS + r": GPU has fallen off the bus"
)
FALLEN_OFF_BUS_XID = 79
# "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress ..." (Fabric Manager user
# guide, appendix D); the lines after it ("Severity 1 Engine ...", "Data {...}") repeat the code: not counted.
_SXID = re.compile(r"(nvidia-nvswitch\d+): SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d+), (Fatal|Non-fatal)")
_MODULE_NAMES = ("nvidia.ko", "nvidia.ko.xz", "nvidia.ko.zst", "nvidia.ko.gz")
_SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e98c0a64b8c6"
_TIMEOUT_S = 20


def parse_xids(text: str) -> List[XidEvent]:
    """Every Xid line in kernel log text, in order, repeats kept (the plan counts them per GPU), then an Xid
    79 for each GPU reported fallen off the bus without an Xid 79 line of its own."""
    events = [(match.group(1), int(match.group(2))) for match in _XID.finditer(text)]
    logged = {address for address, code in events if code == FALLEN_OFF_BUS_XID}
    for match in _FALLEN_OFF.finditer(text):
        address = match.group(1) or match.group(2)
        if address not in logged:
            logged.add(address)
            events.append((address, FALLEN_OFF_BUS_XID))
    return events


def parse_sxids(text: str) -> List[SXidEvent]:
    """Every NVSwitch SXid report (its first line), in order: (switch, PCI address, code, fatal)."""
    return [
        (match.group(1), match.group(2), int(match.group(3)), match.group(4) == "Fatal")
        for match in _SXID.finditer(text)
    ]


def read_events() -> Tuple[Optional[str], List[XidEvent], List[SXidEvent]]:
    """(source, Xids, SXids) of this boot's kernel log; source None when no log could be read."""
    for source, reader in (("journal", _journal), ("kmsg", _kmsg), ("dmesg", _dmesg)):
        text = reader()
        if text:  # a boot's log is never empty: it starts with "Linux version"
            return source, parse_xids(text), parse_sxids(text)
    return None, [], []


def _run(argv: List[str]) -> Optional[str]:
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "replace")


def _journal() -> Optional[str]:
    # -b 0: this boot only; without a running journald the output is empty and the next source is tried.
    return _run(["journalctl", "-k", "-b", "0", "-o", "cat", "--no-pager", "-q"])


def _kmsg() -> Optional[str]:
    """The kernel ring buffer since boot (unless it wrapped), one record per read, until EAGAIN."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None  # EPERM with kernel.dmesg_restrict for non-root
    lines = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record was overwritten while reading: skip it
                    continue
                break
            if not record:
                break
            lines.append(record.decode("utf-8", "replace").split(";", 1)[-1])
    finally:
        os.close(fd)
    return "".join(lines)


def _dmesg() -> Optional[str]:
    return _run(["dmesg"])


def readiness(modules_root: str = "/lib/modules", boot: str = "/boot") -> Optional[Dict[str, Any]]:
    """Running and installed kernels, the ones an NVIDIA module is built for, Secure Boot and the module's
    signature; None when the box has no /lib/modules to look at."""
    if not os.path.isdir(modules_root):
        return None
    running = os.uname().release
    installed = installed_kernels(modules_root, boot)
    if running not in installed:
        installed.append(running)
    built = [k for k in installed if module_path(os.path.join(modules_root, k)) is not None]
    secure = secure_boot()
    module = module_path(os.path.join(modules_root, running))
    return {
        "running": running,
        "installed": sorted(installed, key=kernel_key),
        "nvidia_module_for": sorted(built, key=kernel_key),
        "secure_boot": secure,
        "module_signed": None if module is None or not secure else module_signed(module),
    }


def installed_kernels(modules_root: str, boot: str) -> List[str]:
    """Kernels with an image (/boot/vmlinuz-V, or RHEL's /lib/modules/V/vmlinuz): leftover module folders of
    removed kernels do not count."""
    found = set()
    try:
        names = os.listdir(boot)
    except OSError:
        names = []
    for name in names:
        if name.startswith("vmlinuz-") and os.path.isdir(os.path.join(modules_root, name[8:])):
            found.add(name[8:])
    for name in os.listdir(modules_root):
        if os.path.isfile(os.path.join(modules_root, name, "vmlinuz")):
            found.add(name)
    return sorted(found, key=kernel_key)


def module_path(kernel_dir: str) -> Optional[str]:
    """The nvidia module built for one kernel: DKMS (updates/dkms), Ubuntu's prebuilt packages
    (kernel/nvidia-<branch>), RHEL kmods (extra), compressed or not."""
    for folder, _dirs, files in os.walk(kernel_dir):
        for name in _MODULE_NAMES:
            if name in files:
                return os.path.join(folder, name)
    return None


def secure_boot() -> Optional[bool]:
    """The firmware's SecureBoot variable (last byte 1 = on); BIOS boot = off; None when unreadable."""
    if not os.path.isdir("/sys/firmware/efi"):
        return False
    try:
        with open(_SECURE_BOOT_VAR, "rb") as handle:
            data = handle.read()
    except OSError:
        text = _run(["mokutil", "--sb-state"])
        if text is None:
            return None
        return "SecureBoot enabled" in text
    return bool(data) and data[-1] == 1


def module_signed(path: str) -> Optional[bool]:
    signer = _run(["modinfo", "-F", "signer", path])
    return None if signer is None else bool(signer.strip())
