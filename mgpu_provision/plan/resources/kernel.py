"""Kernel readiness: the NVIDIA module is built for the running kernel and for the one the next boot picks.

The classic failure after an unattended kernel upgrade is a box that reboots into a kernel DKMS never built
the module for, and comes up without a GPU driver; this check says so before the reboot. With Secure Boot on,
an unsigned module is refused by the kernel. Only judged where a driver is installed (otherwise the driver
resource says what to install) and the node could look at its kernels.
"""

from __future__ import annotations

from ...node.nvidia.kernel import kernel_key
from ..change import Change, HostContext, check_failed

REBUILD = "rebuild it (dkms autoinstall -k {k}, or install the prebuilt module package for that kernel)"


def diff(ctx: HostContext) -> list[Change]:
    health = ctx.facts.health
    kernel = None if health is None else health.kernel
    if kernel is None or not ctx.rig.health.checks("kernel") or ctx.host.os != "linux":
        return []
    if not (ctx.facts.driver.installed or ctx.facts.driver.version):
        return []
    changes: list[Change] = []
    built = set(kernel.nvidia_module_for)
    if kernel.running not in built:
        summary = (
            f"the NVIDIA module is not built for the running kernel {kernel.running}: "
            + REBUILD.format(k=kernel.running)
        )
        changes.append(check_failed("kernel", summary, "not built", "built"))
    newest = max(kernel.installed, key=kernel_key) if kernel.installed else None
    following = kernel.next_boot or newest  # the bootloader's default, else GRUB's first: the newest
    if following is not None and following != kernel.running and following not in built:
        which = "the bootloader's default" if kernel.next_boot else "the newest installed"
        summary = (
            f"the NVIDIA module is not built for kernel {following}, {which}: the next reboot "
            f"would come up without a GPU driver; {REBUILD.format(k=following)}, or hold the kernel"
        )
        changes.append(check_failed("kernel", summary, f"{following}: not built", f"{following}: built"))
    if kernel.secure_boot and kernel.module_signed is False:
        summary = (
            "Secure Boot is on and the NVIDIA module is unsigned, so the kernel refuses it: sign it with an "
            "enrolled MOK key (DKMS does when mokutil has its key), or use the distribution's signed modules"
        )
        changes.append(check_failed("kernel", summary, "unsigned", "signed"))
    elif kernel.secure_boot and kernel.module_key_enrolled is False:
        summary = (
            "Secure Boot is on and the NVIDIA module is signed with a key that is not enrolled, so the "
            "kernel refuses it: enroll the key (mokutil --import, then confirm at the next boot) or use the "
            "distribution's signed prebuilt modules"
        )
        changes.append(check_failed("kernel", summary, "key not enrolled", "key enrolled"))
    return changes
