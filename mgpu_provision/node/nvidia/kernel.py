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

from ...judge.health import kernel_key
from ...typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

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


def readiness(
    modules_root: str = "/lib/modules",
    boot: str = "/boot",
    driver_version: Optional[str] = None,
    grub_default: str = "/etc/default/grub",
) -> Optional[Dict[str, Any]]:
    """Running and installed kernels, the ones an NVIDIA module of the installed driver is built for, the
    kernel the bootloader starts next, Secure Boot and the module's signature; None when the box has no
    /lib/modules to look at."""
    if not os.path.isdir(modules_root):
        return None
    running = os.uname().release
    installed = installed_kernels(modules_root, boot)
    if running not in installed:
        installed.append(running)
    built = [k for k in installed if _module_of(os.path.join(modules_root, k), driver_version) is not None]
    secure = secure_boot()
    module = module_path(os.path.join(modules_root, running))
    checked = module is not None and bool(secure)
    # A loaded module is one the kernel accepted under Secure Boot: its key is trusted, whatever can be read.
    enrolled = (True if module_loaded() else module_key_enrolled(module)) if checked and module else None
    return {
        "running": running,
        "installed": sorted(installed, key=kernel_key),
        "nvidia_module_for": sorted(built, key=kernel_key),
        "next_boot": next_boot(installed, boot, grub_default),
        "secure_boot": secure,
        "module_signed": module_signed(module) if checked and module else None,
        "module_key_enrolled": enrolled,
    }


def _module_of(kernel_dir: str, driver_version: Optional[str]) -> Optional[str]:
    """The kernel's nvidia module when it is the installed driver's: a module left from another version
    (a removed DKMS build, an older prebuilt package) fails to load against the new userspace."""
    path = module_path(kernel_dir)
    if path is None or driver_version is None:
        return path
    version = module_version(path)
    return path if version is None or version == driver_version else None


_MODINFO_VERSION = re.compile(rb"(?:^|\0)version=([0-9][0-9.]*)\0")


def module_version(path: str) -> Optional[str]:
    """The `version=` of a module's .modinfo (compressed modules too), None when it cannot be read."""
    try:
        if path.endswith(".zst"):  # no zstd in Python's standard library
            text = _run(["modinfo", "-F", "version", path])
            return (text.strip() or None) if text else None
        with _open_module(path) as handle:
            data = handle.read()
    except (OSError, EOFError, ValueError, ImportError):
        return None
    found = _MODINFO_VERSION.search(data)
    return found.group(1).decode("ascii") if found else None


def _open_module(path: str) -> Any:
    if path.endswith(".xz"):
        import lzma

        return lzma.open(path, "rb")
    if path.endswith(".gz"):
        import gzip

        return gzip.open(path, "rb")
    return open(path, "rb")


def next_boot(installed: List[str], boot: str, grub_default: str) -> Optional[str]:
    """The kernel the bootloader starts next: grubby's default (RHEL and its rebuilds), else GRUB's
    one-time `next_entry` or, with GRUB_DEFAULT=saved, its `saved_entry`; None when neither says (GRUB's
    first entry, the newest kernel, is then the default)."""
    text = _run(["grubby", "--default-kernel"])
    if text and os.path.basename(text.strip()).startswith("vmlinuz-"):
        return os.path.basename(text.strip())[len("vmlinuz-") :]
    env = _key_values(_read(os.path.join(boot, "grub", "grubenv")))
    saved = _key_values(_read(grub_default)).get("GRUB_DEFAULT", "").strip("\"'") == "saved"
    entry = env.get("next_entry") or (env.get("saved_entry") if saved else None)
    if not entry:
        return None
    # Entries name the kernel inside a title or id ("gnulinux-6.8.0-45-generic-advanced-<uuid>"); the
    # longest installed release it contains is the one (6.8.0-45-generic, not 6.8.0-4).
    named = [k for k in installed if k in entry]
    return max(named, key=len) if named else None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _key_values(text: str) -> Dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


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


def module_loaded() -> bool:
    return os.path.isdir("/sys/module/nvidia")


def module_key_enrolled(path: str) -> Optional[bool]:
    """Whether the key the module is signed with is one MOK lists: a DKMS module signed with a MOK that was
    never enrolled carries a signer and is still refused at load. `sig_key` is the signer's serial number
    (kmod `libkmod/libkmod-signature.c`), compared with the enrolled certificates' serials only: the
    kernel's keyrings (/proc/keys) name a key by its subject key id (Linux
    `crypto/asymmetric_keys/x509_public_key.c`), which no serial matches. None when the module's key or
    the enrolled serials cannot be read: not judged."""
    key = _run(["modinfo", "-F", "sig_key", path])
    if key is None:
        return None
    wanted = _hex(key)
    if not wanted:
        return False  # unsigned
    enrolled = enrolled_serials(_run(["mokutil", "--list-enrolled"]))
    if not enrolled:
        return None
    return any(k.endswith(wanted) or wanted.endswith(k) for k in enrolled)


def enrolled_serials(mokutil: Optional[str]) -> List[str]:
    """The serial numbers of mokutil's enrolled certificates ("Serial Number: 12345 (0x3039)", or the hex
    on the next line)."""
    found: List[str] = []
    lines = (mokutil or "").splitlines()
    for index, line in enumerate(lines):
        label = line.strip()
        if label.startswith("Serial Number:"):
            value = label.split(":", 1)[1].strip() or (lines[index + 1] if index + 1 < len(lines) else "")
            short = re.search(r"\(0x([0-9a-fA-F]+)\)", value)
            found.append(_hex(short.group(1) if short else value))
    return [k for k in found if k]


def _hex(text: str) -> str:
    return re.sub(r"[^0-9a-f]", "", text.lower())
