"""An inventory's hosts as hosts of the fleet: `rig_groups` picks them, their variables say how to reach them.

Pure: `rig/inventory.py` reads the inventory; this module decides what its hosts mean for the rig file, so
each rule about them (one rig type per host, a mapped group that is missing or empty, a variable that does
not fit) has its own message and test. An inventory host becomes the same `Host` a `hosts:` entry would:
its rig type from the group that `rig_groups` maps, its inventory groups as groups for `--limit`, and its
connection variables as fields; anything it leaves out comes from `defaults`, as for any host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from .inventory import Inventory, InventoryHost, Located, line_of_host
from .messages import error_message
from .models import HOST_NAME, Host
from .rules import Loc

# Which Host field each variable sets, in the order of the ssh connection plugin's options: when several
# are set, the last one listed wins, as in Ansible (ansible_ssh_user over ansible_user, at any level).
FIELDS = {
    "address": ("ansible_host", "ansible_ssh_host"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "identity_file": ("ansible_private_key_file", "ansible_ssh_private_key_file"),
    "python": ("ansible_python_interpreter",),
}
# ansible_connection values that mean "over SSH" (the others but local cannot be reached by this tool).
SSH_CONNECTIONS = (
    "ssh",
    "smart",
    "paramiko",
    "paramiko_ssh",
    "ansible.builtin.ssh",
    "ansible.builtin.paramiko_ssh",
)
LOCAL_CONNECTIONS = ("local", "ansible.builtin.local")
# `ansible_python_interpreter: auto` lets Ansible discover python; the node's python3 is this tool's default.
AUTO_PYTHON = ("auto", "auto_silent", "auto_legacy", "auto_legacy_silent")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


@dataclass(frozen=True)
class InventoryProblem:
    """Something wrong with the inventory's hosts: in the inventory (`file`, `line`), or in the rig file
    (`file` None: at `loc`, e.g. the `rig_groups` entry of a missing group)."""

    message: str
    file: str | None = None
    line: int | None = None
    loc: Loc = ()
    at_key: bool = False


def inventory_hosts(
    inventory: Inventory, rig_groups: Mapping[str, str]
) -> tuple[list[Host], list[InventoryProblem]]:
    """The hosts of the mapped groups, group by group in `rig_groups` order and in inventory order within
    a group, each once; and every problem found."""
    problems: list[InventoryProblem] = []
    shown = str(inventory.path)
    known = ", ".join(sorted(inventory.groups)) or "none"
    rig_of: dict[str, tuple[str, str]] = {}  # host -> (mapped group, rig type)
    for group, rig in rig_groups.items():
        members = inventory.groups.get(group)
        where = ("rig_groups", group)
        if members is None:
            message = f"group '{group}' is not in the inventory {shown} (its groups: {known})"
            problems.append(InventoryProblem(message, loc=where, at_key=True))
            continue
        if not members:
            problems.append(
                InventoryProblem(f"group '{group}' of the inventory {shown} has no hosts", loc=where)
            )
        shared: dict[str, list[str]] = {}  # earlier mapped group -> hosts this group shares with it
        for name in members:
            if name in rig_of:
                shared.setdefault(rig_of[name][0], []).append(name)
            else:
                rig_of[name] = (group, rig)
        for first, names in shared.items():
            problems.append(
                InventoryProblem(
                    f"inventory host(s) {', '.join(names)} are in two groups of rig_groups: '{first}' "
                    f"({rig_groups[first]}) and '{group}' ({rig}); a host has one rig type: map one of the "
                    "groups, or move the hosts",
                    loc=where,
                    at_key=True,
                )
            )
    hosts = []
    for name, (_, rig) in rig_of.items():
        host = _host(inventory.hosts[name], rig, inventory.path, problems)
        if host is not None:
            hosts.append(host)
    return hosts, problems


def _host(found: InventoryHost, rig: str, inventory: Path, problems: list[InventoryProblem]) -> Host | None:
    """`found` as a Host, or None after adding why it cannot be one to `problems`."""
    shown = str(inventory)
    if not re.match(HOST_NAME, found.name):
        problems.append(
            InventoryProblem(
                f"inventory host '{found.name}' cannot be a host name here: letters, digits, '.', '_' and "
                "'-' only (starting with a letter or digit), 63 at most",
                shown,
                line_of_host(inventory, found.name),
            )
        )
        return None
    fields: dict[str, object] = {
        "name": found.name,
        "rig": rig,
        "groups": [group for group in found.groups if re.match(HOST_NAME, group)],
    }
    source: dict[str, Located] = {}  # field -> the variable that set it
    for field in FIELDS:
        var = _var_of(found, field)
        if var in found.vars:
            fields[field] = found.vars[var].value
            source[field] = found.vars[var]
    before = len(problems)
    _connection(found, fields, problems)
    _become(found, fields, problems)
    if fields.get("python") in AUTO_PYTHON:
        del fields["python"]
    identity = fields.get("identity_file")
    if isinstance(identity, str) and not identity.startswith(("/", "~")):
        # Relative to the inventory's folder, as the inventory is relative to the rig file's.
        fields["identity_file"] = str(inventory.resolve().parent / identity)
    if len(problems) > before:
        return None
    try:
        return Host.model_validate(fields)
    except ValidationError as exc:
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            located = source.get(field)
            var = _var_of(found, field)
            problems.append(
                InventoryProblem(
                    f"inventory host '{found.name}': {var}: {error_message(error)}",
                    located.file if located else shown,
                    located.line if located else None,
                )
            )
        return None


def _var_of(found: InventoryHost, field: str) -> str:
    """The variable that sets `field` for this host (the field's own name when none does)."""
    names = FIELDS.get(field, ())
    return next((name for name in reversed(names) if name in found.vars), field)


def _problem(found: InventoryHost, var: str, message: str) -> InventoryProblem:
    located = found.vars[var]
    return InventoryProblem(f"inventory host '{found.name}': {var}: {message}", located.file, located.line)


def _connection(found: InventoryHost, fields: dict[str, object], problems: list[InventoryProblem]) -> None:
    if "ansible_connection" not in found.vars:
        return
    value = found.vars["ansible_connection"].value
    if value in LOCAL_CONNECTIONS:
        fields["connection"] = "local"
    elif value not in SSH_CONNECTIONS:
        problems.append(
            _problem(
                found,
                "ansible_connection",
                f"'{value}' cannot be used: mgpu-provision reaches hosts over ssh or runs on this machine "
                "(local)",
            )
        )


def _become(found: InventoryHost, fields: dict[str, object], problems: list[InventoryProblem]) -> None:
    if "ansible_become" in found.vars:
        value = found.vars["ansible_become"].value
        text = str(value).lower()
        if isinstance(value, bool) or text in _TRUE + _FALSE:
            fields["become"] = value if isinstance(value, bool) else text in _TRUE
        else:
            problems.append(_problem(found, "ansible_become", f"expected true or false, got {value!r}"))
    method = found.vars.get("ansible_become_method")
    if method is not None and method.value != "sudo":
        problems.append(
            _problem(
                found,
                "ansible_become_method",
                f"'{method.value}' cannot be used: the agent runs with sudo -n",
            )
        )
    user = found.vars.get("ansible_become_user")
    if user is not None and user.value != "root":
        problems.append(
            _problem(found, "ansible_become_user", f"'{user.value}' cannot be used: the agent becomes root")
        )
