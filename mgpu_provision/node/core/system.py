"""Small readers of the running Linux system that both kinds of node share (boot id, DMI board, OS).

Kept apart from the NVIDIA backends because a simulated node is a real machine in everything but its
NVIDIA layer: its host facts come from here unchanged, and a twin only overrides what it chooses to.
"""

from __future__ import annotations

import os
import re
import sys

from ...typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess
    from typing import Dict, List, Optional

_NVRM = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9]+(?:\.[0-9]+)+)")


def read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def boot_id() -> str:
    return (read_text("/proc/sys/kernel/random/boot_id") or "unknown").strip()


def machine_id() -> Optional[str]:
    """/etc/machine-id (machine-id(5)): which OS installation this is, None when empty or unreadable.

    The control side compares it with its own to tell the machine it runs on from a box that only shares
    its kernel or its address (a container, a chroot on loopback): see fleet/here.py."""
    return (read_text("/etc/machine-id") or "").strip() or None


def dmi_board() -> Dict[str, Optional[str]]:
    def field(name: str) -> Optional[str]:
        text = read_text(f"/sys/class/dmi/id/{name}")
        return text.strip() or None if text is not None else None

    return {"vendor": field("board_vendor") or field("sys_vendor"), "model": field("board_name")}


def os_pretty_name(text: Optional[str]) -> str:
    """PRETTY_NAME from /etc/os-release text, "unknown" when absent."""
    for line in (text or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PRETTY_NAME":
            return value.strip().strip("\"'")
    return "unknown"


def os_release_text() -> Optional[str]:
    """The box's os-release: /etc/os-release, else /usr/lib/os-release (os-release(5): "Applications should
    check for the former, and exclusively use its data if it exists, and only fall back to the latter");
    None when the box has neither."""
    return read_text("/etc/os-release") or read_text("/usr/lib/os-release")


def os_release(text: Optional[str]) -> Dict[str, object]:
    """ID, VERSION_ID, ID_LIKE and PLATFORM_ID of /etc/os-release text: which distribution's packages the
    node takes."""
    fields = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition("=")
        fields[key.strip()] = value.strip().strip("\"'")
    return {
        "os_id": fields.get("ID") or None,
        "os_version_id": fields.get("VERSION_ID") or None,
        "os_like": fields.get("ID_LIKE", "").split(),
        # The platform a rebuild follows (`platform:el8` on TencentOS 3.1, whose VERSION_ID is its own).
        "os_platform_id": fields.get("PLATFORM_ID") or None,
    }


def parse_module_type(text: Optional[str]) -> Optional[str]:
    """open or proprietary from /proc/driver/nvidia/version (`... Open Kernel Module for x86_64 ...`)."""
    if not parse_nvrm_version(text):
        return None
    return "open" if "Open Kernel Module" in (text or "") else "proprietary"


def parse_nvrm_version(text: Optional[str]) -> Optional[str]:
    """The kernel module version in /proc/driver/nvidia/version (`NVRM version: ... Module  550.90.07`)."""
    match = _NVRM.search(text or "")
    return match.group(1) if match else None


def host_info(
    simulated: bool, boot: str, distribution: Optional[Dict[str, object]] = None
) -> Dict[str, object]:
    """Host facts; `distribution` (os_id, os_version_id, os_like and the pretty name `os`) stands in for the
    real os-release, whole: a simulated SLES box never reports the machine's own "Debian GNU/Linux 12"."""
    uname = os.uname()
    if distribution is None:
        release = os_release_text()
        distribution = dict(os_release(release), os=os_pretty_name(release))
    return {
        **distribution,
        "hostname": uname.nodename,  # gethostname(2) is uname's nodename; `socket` costs every call
        "kernel": uname.release,
        "arch": uname.machine,
        "boot_id": boot,
        "machine_id": machine_id(),
        "python": sys.version.split()[0],  # what platform.python_version() parses, without importing it
        "user": _user(),
        "simulated": simulated,
    }


def _user() -> str:
    # getpass.getuser()'s order, without importing getpass (and termios with it) on every call.
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if os.environ.get(name):
            return os.environ[name]
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def run(
    argv: List[str], timeout: float = 600.0, env: Optional[Dict[str, str]] = None
) -> "subprocess.CompletedProcess[str]":
    """Run a command, capture its text output; a missing program reads as exit 127 rather than raising."""
    import subprocess  # here: a facts call on a box that changed nothing may run no command at all

    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]}: timed out after {timeout:g} s")


def end_group(child: "subprocess.Popen[str]") -> None:
    """Kill a child started with `start_new_session` and everything it started (its process group)."""
    import contextlib
    import signal
    import subprocess

    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    # A process stuck in the kernel (a hung NVML ioctl) may not die: it is not waited for long.
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.communicate(timeout=1.0)
