"""The hosts a rig file takes from its Ansible inventory, with every problem located for the loader.

The loader calls this before the rules, so that the rules see the inventory's hosts as hosts of the fleet
(a DDP master, a group member may be one). A problem is located in the inventory (its file and line) or in
the rig file (the `inventory:` line for a file that is missing or an extra that is not installed, a
`rig_groups` entry for a group that is missing, a `hosts:` entry that the inventory lists too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .files import resolve_path
from .inventory import AnsibleMissing, InventoryError, read_inventory
from .inventory_hosts import InventoryProblem, inventory_hosts
from .models import ABS_OR_RELATIVE_PATH, HOST_NAME, INVENTORY_GROUP, Host


@dataclass(frozen=True)
class InventoryPart:
    hosts: list[Host] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)  # the mapped group each host comes from
    problems: list[InventoryProblem] = field(default_factory=list)
    readable: bool = True  # False: the inventory could not be read, so its hosts are unknown


def read_inventory_part(data: dict[str, object], base_dir: Path) -> InventoryPart:
    """The inventory's hosts for the rig file `data`; nothing when it names no (well-formed) inventory, whose
    schema errors the loader reports."""
    raw, raw_groups = data.get("inventory"), data.get("rig_groups")
    if raw is not None and not _fits(raw, ABS_OR_RELATIVE_PATH):
        return InventoryPart(readable=False)  # named, but not as a path: the schema error says so
    if not isinstance(raw, str) or not isinstance(raw_groups, dict):
        return InventoryPart()
    rig_groups = {k: v for k, v in raw_groups.items() if _fits(k, INVENTORY_GROUP) and _fits(v, HOST_NAME)}
    if not rig_groups:
        return InventoryPart()
    path = resolve_path(base_dir, raw)
    if not path.is_file():
        why = "is a folder: name the inventory file" if path.is_dir() else "does not exist"
        return _unreadable(InventoryProblem(f"inventory {path} {why}", loc=("inventory",)))
    try:
        inventory = read_inventory(path, tuple(rig_groups))
    except AnsibleMissing as exc:
        return _unreadable(InventoryProblem(str(exc), loc=("inventory",)))
    except InventoryError as exc:
        return _unreadable(InventoryProblem(exc.message, exc.file, exc.line))
    hosts, problems = inventory_hosts(inventory, rig_groups)
    written = _written_hosts(data)
    kept, groups = [], []
    for host in hosts:
        group = next(g for g in rig_groups if host.name in inventory.groups.get(g, ()))
        if host.name in written:
            problems.append(
                InventoryProblem(
                    f"host '{host.name}' is also in the inventory {path} (group '{group}'): list each host "
                    "once, under `hosts:` or in the inventory",
                    loc=("hosts", written[host.name], "name"),
                )
            )
            continue
        kept.append(host)
        groups.append(group)
    return InventoryPart(kept, groups, problems)


def _fits(value: object, pattern: str) -> bool:
    """A value the schema accepts (the schema's own error covers the others)."""
    return isinstance(value, str) and re.match(pattern, value) is not None


def _unreadable(problem: InventoryProblem) -> InventoryPart:
    return InventoryPart(problems=[problem], readable=False)


def _written_hosts(data: dict[str, object]) -> dict[str, int]:
    """The names under `hosts:` and their index."""
    raw = data.get("hosts")
    if not isinstance(raw, list):
        return {}
    return {
        item["name"]: index
        for index, item in enumerate(raw)
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    }
