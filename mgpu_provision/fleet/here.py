"""Is a host the machine running mgpu-provision? Asked before a driver install or a reboot is sent to it.

A rig file that reaches this machine without `simulate:` (a `connection: local` host, or an SSH address that
resolves here) would install a driver on, or reboot, the operator's own workstation. An address alone does
not settle it: a box on loopback in its own namespaces or chroot (the test hosts, a container) is another
OS installation that only shares the network. So the node's own word decides first: its /etc/machine-id
(machine-id(5)) and boot id from facts, compared with this machine's. Only where a machine id is unknown
on either side do the boot id and the address decide, erring towards "this machine".
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..typing_lite import NamedTuple

if TYPE_CHECKING:
    from ..facts import Facts
    from .targets import HostTarget

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
MACHINE_ID = Path("/etc/machine-id")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class Here(NamedTuple):
    """This machine's identity, read once per run."""

    machine_id: str | None
    boot_id: str | None

    @classmethod
    def read(cls) -> Here:
        return cls(_read(MACHINE_ID), _read(BOOT_ID))


def control_machine(
    target: HostTarget, facts: Facts, here: Here, address_is_here: Callable[[HostTarget], bool]
) -> str | None:
    """Why `target` is the machine running this tool, or None when it is another box (or simulated).

    A simulated host's driver install and reboot only change its twin's overlay, never the machine.
    Two installations with the same machine id and the same boot id are one running machine; a different
    machine id is another box even on this machine's address. `address_is_here` is asked last: it may
    resolve a name."""
    if facts.host.simulated:
        return None
    if target.connection == "local":
        return "it is this machine (connection: local)"
    theirs = facts.host.machine_id
    if theirs is not None and here.machine_id is not None:
        if theirs == here.machine_id and facts.host.boot_id == here.boot_id:
            return "it reports the machine id and boot id of the machine running mgpu-provision"
        return None
    if here.boot_id is not None and facts.host.boot_id == here.boot_id:
        return "it reports the boot id of the machine running mgpu-provision"
    if address_is_here(target):
        return f"its address {target.address} is this machine"
    return None


def address_is_here(target: HostTarget) -> bool:
    """Whether `target.address` resolves to a loopback address or one of this machine's own."""
    if target.jump is not None:  # the address is resolved on the jump host, not here
        return False
    try:
        theirs = {info[4][0] for info in socket.getaddrinfo(target.address, None)}
        ours = set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        return False
    return any(ipaddress.ip_address(str(a)).is_loopback or a in ours for a in theirs)
