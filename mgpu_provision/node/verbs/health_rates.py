"""Counters as rates: what each health counter did since the node's previous sample, and over how long.

NVML's counters (NVLink errors, ECC counts, clock violation time) and the kernel's Xid log count since the
driver loaded or the box booted, so a total is a function of uptime: nine months of benign CRC errors look
like a bad link, forty replays in the last minute like a good one. DCGM's health watch judges the change
over a window instead (replay/recovery >= 1 per minute, CRC >= 100 per second). The node keeps its last
sample in the state folder with the boot id and the time; the facts carry each counter's change since then
and the interval. With no earlier sample of this boot (first call, a reboot, no state folder) the change is
the total and the interval the time since boot.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

import contextlib
import json
import os

from ...typing_lite import TYPE_CHECKING
from ..nvidia.backend import NVLINK_FIELDS

if TYPE_CHECKING:
    from typing import Any, Dict, Optional

SAMPLE_FILE = "health-counters.json"
# A sample younger than this is kept as the base of the next call: calls a few seconds apart (apply's facts
# before and after, a plan run twice) judge the same window of at least a minute, as DCGM's per-minute
# limits mean, rather than a rate over two seconds; and a facts call then writes nothing.
MIN_WINDOW_S = 60.0
# Every link counter: the counter call's CRC (flit + data), and each field value (replay, recovery, ...).
LINK_COUNTERS = ("crc", *(name for _, name in NVLINK_FIELDS))
GPU_COUNTERS = (
    "ecc_volatile_uncorrectable",
    "ecc_sram_volatile_uncorrectable",
    "ecc_dram_volatile_uncorrectable",
)
if TYPE_CHECKING:
    Counters = Dict[str, int]


def sample_of(health: Dict[str, Any], uuids: Dict[int, str]) -> Dict[str, Any]:
    """The counters of one facts call, keyed by GPU UUID (indices can change across boots) and link."""
    gpus: Dict[str, Any] = {}
    for gpu in health["gpus"]:
        counters = {k: gpu[k] for k in GPU_COUNTERS if isinstance(gpu.get(k), int)}
        for name, ms in (gpu.get("violation_ms") or {}).items():
            counters["violation_" + name + "_ms"] = ms
        links = {
            str(link["link"]): {k: link[k] for k in LINK_COUNTERS if isinstance(link.get(k), int)}
            for link in gpu["nvlink_errors"]
        }
        gpus[uuids[gpu["index"]]] = {"gpu": counters, "links": links}
    return {"gpus": gpus, "xid": len(health["xid"])}


def change(previous: Optional[Counters], current: Counters) -> Counters:
    """Each counter's rise since `previous`; a counter that fell (the driver reloaded and reset it) or
    that has no earlier value counts from zero."""
    earlier = previous or {}
    return {
        name: value - earlier[name] if earlier.get(name, value + 1) <= value else value
        for name, value in current.items()
    }


def apply_changes(
    health: Dict[str, Any], uuids: Dict[int, str], now: Dict[str, Any], then: Optional[Dict[str, Any]]
) -> None:
    """Put each counter's change since `then` (None: since boot) beside it in `health`."""
    earlier = (then or {}).get("gpus", {})
    current = now["gpus"]
    for gpu in health["gpus"]:
        uuid = uuids[gpu["index"]]
        before = earlier.get(uuid, {})
        gpu["change"] = change(before.get("gpu"), current[uuid]["gpu"])
        for link in gpu["nvlink_errors"]:
            key = str(link["link"])
            link["change"] = change(before.get("links", {}).get(key), current[uuid]["links"][key])
    health["xid_change"] = change({"xid": then["xid"]} if then else None, {"xid": now["xid"]})["xid"]


def add_changes(
    health: Dict[str, Any],
    uuids: Dict[int, str],
    state_dir: Optional[str],
    boot_id: str,
    now_s: float,
    uptime_s: Optional[float],
) -> None:
    """Compare with the previous sample of this boot (if any), record this one, and say over what
    interval the changes were counted."""
    now = sample_of(health, uuids)
    path = os.path.join(state_dir, SAMPLE_FILE) if state_dir else None
    then = _read(path) if path else None
    if then is not None and (
        then.get("boot_id") != boot_id or not isinstance(then.get("time"), (int, float))
    ):
        then = None  # another boot's counters started again from zero
    if then is not None and then["time"] > now_s:
        then = None  # the clock went back: the interval is unknown
    apply_changes(health, uuids, now, then)
    if then is None:
        health["counters_since"] = "boot"
        health["counters_interval_s"] = None if uptime_s is None else round(uptime_s, 1)
    else:
        health["counters_since"] = "sample"
        health["counters_interval_s"] = round(now_s - float(then["time"]), 1)
    if path and (then is None or now_s - float(then["time"]) >= MIN_WINDOW_S):
        with contextlib.suppress(OSError):  # read-only state folder: the next call counts from boot again
            _write(path, dict(now, boot_id=boot_id, time=now_s))


def _write(path: str, record: Dict[str, Any]) -> None:
    """Write, then rename over the sample: a reader sees the old one or the new one. No fsync and no
    tempfile (facts is the call every plan makes, and must stay light): a sample lost in a crash only
    makes the next call count from boot."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    partial = "%s.%d.tmp" % (path, os.getpid())
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(record, handle, sort_keys=True)
    os.replace(partial, path)


def _read(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("gpus"), dict) else None
