"""The node's memory of its GPU resets: an Xid is judged once, and a successful reset (or a reboot) clears it.

The kernel log keeps every Xid of the boot, so judging "since boot" keeps a GPU failed, and its node
drained, after the very reset the Xid's resolution prescribes (`nvidia-smi -r`), until a reboot. NVSentinel
marks a GPU healthy after a successful reset, gpud has `set-healthy` after a repair; here the node's
`gpu-reset` verb records, per GPU, how many of this boot's Xid lines the log held for it when the reset
succeeded, and the facts mark those lines `cleared`: the judge passes over them. The record carries the
boot id, so a reboot (a new log) forgets it.

The record is `gpu-resets.json` in the node's state folder, written atomically (a reader sees the old
record or the new one). A record that cannot be read (corrupt, another boot's, of an older format) is
judged as no record: every Xid of the log counts, and the facts say so once in `not_checked`.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

import json
import os
import time

from ...catalog.pci import same_slot
from ...typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

RESET_FILE = "gpu-resets.json"
VERSION = 1
if TYPE_CHECKING:
    Record = Dict[str, Any]


def read(state_dir: Optional[str], boot_id: str) -> Tuple[Dict[str, Dict[str, Any]], Optional[str]]:
    """(this boot's resets by GPU PCI address, a note when the record could not be read)."""
    if not state_dir:
        return {}, None
    path = os.path.join(state_dir, RESET_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return {}, None  # no reset recorded yet
    except (OSError, ValueError) as exc:
        return {}, f"xid memory: {path} cannot be read ({exc}): Xids judged from the kernel log alone"
    alone = "Xids judged from the kernel log alone"
    if not isinstance(record, dict) or record.get("version") != VERSION:
        return {}, f"xid memory: {path} is not a record of version {VERSION}: {alone}"
    gpus = record.get("gpus")
    if not isinstance(gpus, dict) or not all(_entry_ok(v) for v in gpus.values()):
        return {}, f"xid memory: {path} is malformed: {alone}"
    if record.get("boot_id") != boot_id:
        return {}, None  # another boot's resets: this boot's log starts afresh
    return gpus, None


def _entry_ok(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("xids_before"), int) and entry["xids_before"] >= 0


def mark_cleared(events: List[Dict[str, Any]], resets: Dict[str, Dict[str, Any]]) -> None:
    """Mark each Xid event logged before its GPU's recorded reset as `cleared` (events are in log order)."""
    seen: Dict[str, int] = {}
    for event in events:
        address = next((a for a in resets if same_slot(a, event["pci_bus_id"])), None)
        if address is None:
            continue
        seen[address] = seen.get(address, 0) + 1
        if seen[address] <= resets[address]["xids_before"]:
            event["cleared"] = True


def record(state_dir: str, boot_id: str, addresses: List[str], events: List[Tuple[str, int]]) -> None:
    """After a successful reset of the GPUs at `addresses`: remember how many of this boot's Xid lines
    (`events`, the log as read right after the reset) are theirs, beside the other GPUs' earlier resets."""
    from ..core.atomic import atomic_write  # tempfile: only a reset writes, every facts call reads

    kept, _ = read(state_dir, boot_id)
    now = time.time()
    for address in addresses:
        count = sum(1 for logged, _code in events if same_slot(logged, address))
        kept[address] = {"xids_before": count, "reset_at": now}
    data = {"version": VERSION, "boot_id": boot_id, "gpus": kept}
    atomic_write(os.path.join(state_dir, RESET_FILE), json.dumps(data, sort_keys=True).encode("utf-8"), 0o644)
