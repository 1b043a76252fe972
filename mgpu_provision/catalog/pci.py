"""PCI addresses as NVML and the kernel print them, compared as numbers.

NVML pads the domain to eight digits in some answers and four in others, the kernel log prints four and no
function, and multi-segment hosts (Grace, GB200) repeat a bus number in another domain: two addresses name
the same device only when domain, bus, device and function all agree.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

from ..typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Optional, Tuple

if TYPE_CHECKING:
    PciKey = Tuple[int, int, int, int]


def pci_key(address: Optional[str]) -> Optional[PciKey]:
    """(domain, bus, device, function) of `[domain:]bus:device[.function]`; None when it is not one."""
    if not address:
        return None
    parts = address.strip().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return None
    device, _, function = parts[2].partition(".")
    try:
        return (int(parts[0], 16), int(parts[1], 16), int(device, 16), int(function or "0", 16))
    except ValueError:
        return None


def same_pci(a: Optional[str], b: Optional[str]) -> bool:
    key = pci_key(a)
    return key is not None and key == pci_key(b)


def sysfs_name(address: str) -> Optional[str]:
    """The device's folder name under /sys/bus/pci/devices ("0000:01:00.0"), None when not an address."""
    key = pci_key(address)
    return None if key is None else "{:04x}:{:02x}:{:02x}.{:x}".format(*key)

def same_slot(a: Optional[str], b: Optional[str]) -> bool:
    """Same domain, bus and device: the kernel's Xid lines leave the function out."""
    ka, kb = pci_key(a), pci_key(b)
    return ka is not None and kb is not None and ka[:3] == kb[:3]
