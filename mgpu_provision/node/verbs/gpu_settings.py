"""The `compute-mode` and `power-limit` apply steps: NVML settings of each GPU, set where they differ.

Both are lost when the driver unloads (every reboot): the boot unit apply writes beside these steps
(plan/resources/boot_unit.py) sets them again at boot; without it a later plan shows them again and apply
sets them again. A GPU already right is not touched, so a second apply reports no change.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

from ...typing_lite import TYPE_CHECKING
from ..core.errors import AgentFailure
from ..nvidia.backend import COMPUTE_MODE_CODES, Backend, NvmlUnavailable

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    StepResult = Tuple[bool, str]


def set_compute_mode(step: Dict[str, Any], backend: Backend) -> StepResult:
    name = step["mode"]  # one of protocol.COMPUTE_MODES: the door checked it
    code = COMPUTE_MODE_CODES[name]
    changed, gpus = _converge(
        backend, step, "the compute mode", lambda gpu: code, backend.compute_mode, backend.set_compute_mode
    )
    return _result(f"compute mode {name}", changed, gpus)


def set_power_limit(step: Dict[str, Any], backend: Backend) -> StepResult:
    watts = step["watts"]

    def limits(gpu: int) -> Tuple[int, int]:
        found = backend.power_limits_mw(gpu)
        if found is None:
            raise AgentFailure("nvml", f"GPU {gpu} reports no power limit (NVML: not supported)")
        return found

    changed, gpus = _converge(
        backend,
        step,
        "the power limit",
        lambda gpu: watts * 1000 if watts is not None else limits(gpu)[1],
        lambda gpu: limits(gpu)[0],
        backend.set_power_limit_mw,
    )
    return _result("power limit " + (f"{watts} W" if watts is not None else "default"), changed, gpus)


def set_persistence(step: Dict[str, Any], backend: Backend) -> StepResult:
    enabled = step["enabled"]
    changed, gpus = _converge(
        backend,
        step,
        "persistence mode",
        lambda gpu: enabled,
        backend.persistence_mode,
        backend.set_persistence_mode,
    )
    word = "enabled" if enabled else "disabled"
    if not changed:
        return False, f"persistence mode already {word} on GPU {_listed(gpus)}"
    return True, f"persistence mode {word} on GPU {_listed(changed)}"


def _converge(
    backend: Backend,
    step: Dict[str, Any],
    what: str,
    wanted: Callable[[int], Any],
    current: Callable[[int], Optional[Any]],
    write: Callable[[int, Any], None],
) -> Tuple[List[int], List[int]]:
    """(GPUs changed, GPUs asked for): each GPU whose `current` differs from `wanted` gets `write`."""
    try:
        backend.open()
    except NvmlUnavailable as exc:
        raise AgentFailure("nvml", f"cannot set {what}: {exc.message}") from None
    try:
        gpus = step["gpus"] or list(range(backend.device_count()))
        changed = []
        for gpu in gpus:
            target = wanted(gpu)
            if current(gpu) != target:
                write(gpu, target)
                changed.append(gpu)
    finally:
        backend.close()
    return changed, gpus


def _result(setting: str, changed: List[int], gpus: List[int]) -> StepResult:
    if changed:
        return True, f"{setting} set on GPU {_listed(changed)}"
    return False, f"{setting} already on GPU {_listed(gpus)}"


def _listed(gpus: List[int]) -> str:
    return ",".join(str(g) for g in gpus)
