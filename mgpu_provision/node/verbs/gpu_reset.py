"""The `gpu-reset` verb: reset the GPUs `recover` names, once no process holds them, and remember it.

A GPU reset is what NVIDIA's Xid catalog prescribes for a RESET_GPU Xid and what NVML's recovery action
`gpu_reset` asks for; it fails, or takes a job down, while a process has the GPU open. So the node waits
until no compute process is on those GPUs (NVML's list, as reclaim reads it), up to `wait_s`, and resets
nothing when one is still there: the reply names it. After a successful reset it records in the state
folder how many of this boot's Xid lines were the GPUs' (resets.py): the node check judges only the Xids
after it. Run under the host lock, like a reboot, so it never lands in the middle of an apply.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

import time

from ...typing_lite import TYPE_CHECKING
from ..core.atomic import HostLock
from ..nvidia.backend import Backend
from . import resets

if TYPE_CHECKING:
    from typing import Any, Dict, List

POLL_S = 1.0


def _holders(backend: Backend, gpus: List[int]) -> List[Dict[str, Any]]:
    return [{"gpu": gpu, "pids": sorted(pid for pid, _ in backend.processes(gpu))} for gpu in gpus]


def run(args: Dict[str, Any], backend: Backend) -> Dict[str, Any]:
    """{"reset": bool, "error", "held": [{"gpu", "pids"}], "waited_s", "gpus": [{"index", "pci_bus_id"}]}:
    `reset` false with `held` when a process stayed on a GPU (nothing was reset), with `error` when the
    reset itself failed."""
    gpus, together, wait_s = list(args["gpus"]), bool(args["together"]), float(args["wait_s"])
    wait_lock = float(args["lock_wait_s"])
    lock = HostLock(str(args["lock"]), wait_lock, holder="gpu-reset") if args["lock"] else None
    if lock is not None:
        lock.__enter__()
    try:
        backend.open()
        try:
            if together:
                gpus = list(range(backend.device_count()))
            addresses = [backend.pci_bus_id(gpu) for gpu in gpus]
            started = time.monotonic()
            held = [h for h in _holders(backend, gpus) if h["pids"]]
            while held and time.monotonic() - started < wait_s:
                time.sleep(min(POLL_S, wait_s))
                held = [h for h in _holders(backend, gpus) if h["pids"]]
            waited = round(time.monotonic() - started, 1)
        finally:
            backend.close()
        where = [{"index": gpu, "pci_bus_id": address} for gpu, address in zip(gpus, addresses)]  # noqa: B905 - Python 3.8 has no strict
        reply: Dict[str, Any] = {
            "reset": False,
            "error": None,
            "held": held,
            "waited_s": waited,
            "gpus": where,
        }
        if held:
            return reply
        error = backend.reset_gpus(gpus, together)
        if error is None and args["state_dir"]:
            _source, events, _switches = backend.kernel_events()
            resets.record(str(args["state_dir"]), backend.boot_id(), addresses, events)
        reply.update(reset=error is None, error=error)
        return reply
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)
