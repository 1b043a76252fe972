"""Installing a driver from NVIDIA's .run installer, and clearing nouveau out of its way.

The installer is fetched once into a cache and checked against its sha256 before it runs silently, with
the kernel module type the control side chose from the GPUs' architecture (open modules need Turing or
newer; from 560 open is the default). It exits with an error while nouveau is bound to the GPU, so nouveau
is blacklisted first (modprobe.d plus a new initramfs) and the box rebooted before the install.
"""

from __future__ import annotations

import hashlib
import os
import shutil

from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.atomic import atomic_write
from ..core.errors import AgentFailure
from .common import Command, run_all

if TYPE_CHECKING:
    from typing import Any, Dict, List, Tuple

CACHE = "/var/cache/mgpu-provision"
NOUVEAU_BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
NOUVEAU_TEXT = (
    "# Written by mgpu-provision: the NVIDIA installer needs nouveau gone.\n"
    "blacklist nouveau\noptions nouveau modeset=0\n"
)


def commands(step: Dict[str, Any]) -> List[Command]:
    runfile = step["runfile"]
    if not runfile:
        raise AgentFailure("driver", "the runfile method needs `runfile`, the installer's path on the node")
    argv = ["sh", str(runfile), "--silent", "--dkms"]
    module = step["kernel_module_type"]
    if module and int(step["branch"]) >= 560:
        argv.append(f"--kernel-module-type={module}")
    elif module == "open":
        argv.append("-m=kernel-open")  # how 515-559 spelled it; older drivers have no open modules
    return [Command(argv)]


def install(step: Dict[str, Any]) -> None:
    if nouveau_loaded():
        raise AgentFailure(
            "driver",
            "nouveau is bound to the GPU, so the NVIDIA installer would refuse: blacklist it, reboot",
        )
    step = dict(step, runfile=fetch(step))
    check(step)
    run_all(commands(step))


def nouveau_loaded() -> bool:
    return os.path.isdir("/sys/module/nouveau")


def blacklist_nouveau() -> Tuple[bool, str]:
    """Keep nouveau from loading at the next boot (the file, then a new initramfs that carries it)."""
    if system.read_text(NOUVEAU_BLACKLIST) == NOUVEAU_TEXT:
        return False, f"{NOUVEAU_BLACKLIST} already blacklists nouveau"
    atomic_write(NOUVEAU_BLACKLIST, NOUVEAU_TEXT.encode("utf-8"), 0o644)
    if shutil.which("update-initramfs"):
        run_all([Command(["update-initramfs", "-u"])], "nouveau")
    elif shutil.which("dracut"):
        run_all([Command(["dracut", "--force"])], "nouveau")
    return True, f"blacklisted nouveau in {NOUVEAU_BLACKLIST}; reboot to unbind it"


def fetch(step: Dict[str, Any], cache_dir: str = CACHE) -> str:
    """The installer's path on the node: a local path as given, an https URL downloaded once into a cache.

    The download lands under a temporary name and is renamed into place, so an interrupted fetch never
    leaves a half file that a later run would take for the installer; the checksum is checked after.
    """
    import urllib.request  # only a runfile install needs it: keep the agent's start-up lean

    source = str(step.get("runfile") or "")
    if not source.startswith("https://"):
        return source
    target = os.path.join(cache_dir, "NVIDIA-{}.run".format(str(step.get("sha256") or "unchecked")[:16]))
    if os.path.exists(target):
        return target
    os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    partial = target + ".partial"
    try:
        with urllib.request.urlopen(source, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except (OSError, ValueError) as exc:
        if os.path.exists(partial):
            os.remove(partial)
        raise AgentFailure("driver", "could not download {}: {}".format(source, exc)) from exc
    os.replace(partial, target)
    return target


def check(step: Dict[str, Any]) -> None:
    expected = step.get("sha256")
    if not expected:
        raise AgentFailure("driver", "the runfile method needs `sha256` of the installer")
    digest = hashlib.sha256()
    with open(str(step.get("runfile")), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise AgentFailure("driver", f"checksum mismatch for {step.get('runfile')}: got {digest.hexdigest()}")
