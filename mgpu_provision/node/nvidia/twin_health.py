"""The health part of a twin file: per-GPU `health:` and the top-level `kernel:` (schemas/twin.schema.json).

Every key is optional and an absent key describes a healthy GPU, so twins written before the health checks
keep describing healthy boxes. The values are checked here once, with messages that name the field, so the
simulated backend can answer NVML's questions from trusted dicts.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

from ...typing_lite import TYPE_CHECKING
from ..core.errors import AgentFailure
from .backend import (
    CLOCK_EVENTS,
    COMPUTE_MODES,
    FABRIC_HEALTH_BITS,
    FABRIC_INCORRECT_CONFIGURATION,
    FABRIC_STATES,
    FABRIC_SUMMARIES,
    NVLINK_BER_FIELDS,
    NVLINK_FIELDS,
    RECOVERY_ACTIONS,
    VIOLATION_POLICIES,
)

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from .backend import SXidEvent

THROTTLE_NAMES = tuple(name for _, name in CLOCK_EVENTS)
COMPUTE_MODE_NAMES = tuple(COMPUTE_MODES.values())
FABRIC_STATE_NAMES = tuple(FABRIC_STATES.values())
FABRIC_PROBLEMS = tuple(name for _, name in FABRIC_HEALTH_BITS) + tuple(
    FABRIC_INCORRECT_CONFIGURATION.values()
)

if TYPE_CHECKING:
    Rule = Tuple[str, Callable[[Any], bool]]  # (what the value must be, in words; the test)


def _choice(values: Tuple[str, ...]) -> Rule:
    return ("one of " + ", ".join(values), lambda v: v in values)


COUNT: Rule = (
    "a whole number of 0 or more",
    lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
)
FLAG: Rule = ("true or false", lambda v: isinstance(v, bool))
TEXT: Rule = ("a non-empty string", lambda v: isinstance(v, str) and v != "")
TEXTS: Rule = ("a list of strings", lambda v: isinstance(v, list) and all(TEXT[1](x) for x in v))


def _list_of(rule: Rule) -> Rule:
    return (
        "a list of " + rule[0].replace("a ", "", 1),
        lambda v: isinstance(v, list) and all(rule[1](x) for x in v),
    )


def _mapping_of(fields: Dict[str, Rule]) -> Rule:
    return ("a mapping of " + ", ".join(fields), lambda v: isinstance(v, dict))


ECC = {
    "mode": FLAG,
    "volatile_uncorrectable": COUNT,
    "aggregate_uncorrectable": COUNT,
    # Hopper and later count SRAM (on-chip) and DRAM (HBM) apart; absent = NotSupported
    "sram_volatile_uncorrectable": COUNT,
    "sram_aggregate_uncorrectable": COUNT,
    "dram_volatile_uncorrectable": COUNT,
    "dram_aggregate_uncorrectable": COUNT,
    "sram_threshold_exceeded": FLAG,
}
RETIRED = {"pending": FLAG, "count": COUNT}
REMAPPED = {"pending": FLAG, "failure": FLAG, "uncorrectable": COUNT}
FABRIC = {
    "state": _choice(FABRIC_STATE_NAMES),
    "status": TEXT,
    "clique_id": COUNT,
    "cluster_uuid": TEXT,
    "health": (
        "a list of these: " + ", ".join(FABRIC_PROBLEMS),
        lambda v: isinstance(v, list) and set(v) <= set(FABRIC_PROBLEMS),
    ),
    "summary": _choice(tuple(FABRIC_SUMMARIES.values())),
}
LINK_ERRORS = {"link": COUNT, **{name: COUNT for _, name in NVLINK_FIELDS}}
VIOLATION = {name: COUNT for _, name in VIOLATION_POLICIES}
# A BER as NVML packs it, written as its two parts: [mantissa (0-15), exponent (0-255)], BER = m * 10^-e.
BER: Rule = (
    "[mantissa 0-15, exponent 0-255]",
    lambda v: (
        isinstance(v, list) and len(v) == 2 and all(COUNT[1](x) for x in v) and v[0] <= 0xF and v[1] <= 0xFF
    ),
)
NVLINK_BER = {name: BER for _, name in NVLINK_BER_FIELDS}
NESTED = {
    "ecc": ECC,
    "retired_pages": RETIRED,
    "remapped_rows": REMAPPED,
    "fabric": FABRIC,
    "violation_ms": VIOLATION,
    "nvlink_ber": NVLINK_BER,
}
HEALTH: Dict[str, Rule] = {
    "xid": _list_of(COUNT),
    "ecc": _mapping_of(ECC),
    "retired_pages": _mapping_of(RETIRED),
    "remapped_rows": _mapping_of(REMAPPED),
    "nvlink_errors": (
        "a list of mappings",
        lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    ),
    "throttle": (
        "a list of these: " + ", ".join(THROTTLE_NAMES),
        lambda v: isinstance(v, list) and set(v) <= set(THROTTLE_NAMES),
    ),
    "power_limit_w": COUNT,
    "default_power_limit_w": COUNT,
    "enforced_power_limit_w": COUNT,
    "recovery_action": _choice(tuple(RECOVERY_ACTIONS.values())),
    "violation_ms": _mapping_of(VIOLATION),
    # Blackwell: nvmlDeviceGetNvLinkErrorCounter answers NotSupported, the counters come as field values
    "nvlink_error_api": _choice(("counters", "fields")),
    # NVLink5: the GPU's effective and symbol BER field values (absent: NotSupported, as before Blackwell)
    "nvlink_ber": _mapping_of(NVLINK_BER),
    "compute_mode": _choice(COMPUTE_MODE_NAMES),
    "mig": FLAG,
    "fabric": _mapping_of(FABRIC),
    "lost": FLAG,
    "p2p_ok_with": _list_of(COUNT),
    "reset": _choice(("succeeds", "fails")),  # what nvidia-smi -r does to this GPU
    "memory_unrepairable": FLAG,  # nvmlDeviceGetUnrepairableMemoryFlag_v1 (absent: NotSupported)
}
KERNEL: Dict[str, Rule] = {
    "running": TEXT,
    "installed": TEXTS,
    "nvidia_module_for": TEXTS,
    "secure_boot": FLAG,
    "module_signed": FLAG,
    "module_key_enrolled": FLAG,
    "next_boot": TEXT,
}


def read_gpu_health(path: str, where: str, raw: Any) -> Dict[str, Any]:
    """A GPU's `health:` mapping, checked; {} when absent."""
    if raw is None:
        return {}
    health = _check(path, where, raw, HEALTH)
    for key, fields in NESTED.items():
        if key in health:
            _check(path, f"{where}.{key}", health[key], fields)
    for position, entry in enumerate(health.get("nvlink_errors", [])):
        _check(path, f"{where}.nvlink_errors[{position}]", entry, LINK_ERRORS)
        if "link" not in entry:
            raise _bad(path, f"{where}.nvlink_errors[{position}].link is required")
    return health


def read_kernel(path: str, raw: Any) -> Optional[Dict[str, Any]]:
    """The twin's `kernel:` with defaults (installed = the running kernel, module built for none, Secure Boot
    off, module signed); None when absent: kernel readiness is then not checked."""
    if raw is None:
        return None
    kernel = _check(path, "kernel", raw, KERNEL)
    if "running" not in kernel:
        raise _bad(path, "kernel.running is required (the running kernel's release, as uname -r prints it)")
    return {
        "running": kernel["running"],
        "installed": list(kernel.get("installed") or [kernel["running"]]),
        "nvidia_module_for": list(kernel.get("nvidia_module_for") or []),
        "secure_boot": kernel.get("secure_boot", False),
        "module_signed": kernel.get("module_signed", True),
        "module_key_enrolled": kernel.get("module_key_enrolled", True),
        "next_boot": kernel.get("next_boot"),
    }


def _check(path: str, where: str, raw: Any, fields: Dict[str, Rule]) -> Dict[str, Any]:
    if not isinstance(raw, dict):
        raise _bad(path, f"{where} must be a mapping")
    for key, value in raw.items():
        if key not in fields:
            raise _bad(path, f"{where} has an unknown key {key!r} (known: {', '.join(fields)})")
        expected, ok = fields[key]
        if not ok(value):
            raise _bad(path, f"{where}.{key} must be {expected}, got {value!r}")
    return raw


def _bad(path: str, message: str) -> AgentFailure:
    return AgentFailure("twin", f"twin {path}: {message}")


SXID = {"switch": TEXT, "pci_bus_id": TEXT, "code": COUNT, "fatal": FLAG}


def read_sxids(path: str, raw: Any) -> List[SXidEvent]:
    """The twin's `sxid:` list (NVSwitch errors as the kernel log would print them); [] when absent."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad(path, "sxid must be a list of mappings")
    found = []
    for position, entry in enumerate(raw):
        where = f"sxid[{position}]"
        _check(path, where, entry, SXID)
        for key in ("switch", "pci_bus_id", "code"):
            if key not in entry:
                raise _bad(path, f"{where}.{key} is required")
        found.append((entry["switch"], entry["pci_bus_id"], entry["code"], entry.get("fatal", True)))
    return found


def read_uptime(path: str, raw: Any) -> Optional[float]:
    """The twin's `uptime_s` (seconds since the simulated boot); None: the machine's own."""
    if raw is None:
        return None
    if not COUNT[1](raw):
        raise _bad(path, f"uptime_s must be {COUNT[0]}, got {raw!r}")
    return float(raw)


def twin_xids(gpus: List[Dict[str, Any]]) -> List[Tuple[str, int]]:
    """The twin's Xids as the kernel log would print them: (domain:bus:device, code)."""
    return [
        (gpu["pci_bus_id"].rsplit(".", 1)[0], code) for gpu in gpus for code in gpu["health"].get("xid", [])
    ]
