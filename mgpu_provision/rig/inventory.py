"""Read an Ansible inventory with Ansible's own parser: its hosts, groups and connection variables.

Fleets that Ansible already manages keep their boxes in an inventory; `inventory:` in a rig file reads it
instead of asking for every address to be copied into `hosts:`. Ansible's parser (ansible-core, the optional
extra `mgpu-provision[ansible]`) reads it exactly as `ansible` does, group_vars/ and host_vars/ next to it
included, so the two tools cannot disagree about a host.

ansible-core is imported here only, inside `read_inventory`: a rig file without `inventory:` never pays for
it. Only static files are read: an ini or yaml file, parsed by the one plugin its suffix names (never the
script plugin, which would run an executable file). Ansible's controller temporary folder goes to the
system's temporary folder (removed at exit) rather than ~/.ansible, unless ANSIBLE_LOCAL_TEMP says otherwise.
Errors name the inventory file and, where Ansible reports it, the line.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ProvisionError

EXTRA = "pip install 'mgpu-provision[ansible]'"
# The variables read from the inventory (with the older ansible_ssh_* spellings); every other is ignored.
READ_VARS = (
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_python_interpreter",
    "ansible_connection",
    "ansible_become",
    "ansible_become_method",
    "ansible_become_user",
)
YAML_SUFFIXES = (".yml", ".yaml")
# Groups every host is in: they name no part of the fleet.
IMPLICIT_GROUPS = ("all", "ungrouped")


class InventoryError(ProvisionError):
    """The inventory cannot be read: `file` (and `line`, when known) say where."""

    def __init__(self, message: str, file: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line


class AnsibleMissing(ProvisionError):
    """ansible-core is not installed."""


@dataclass(frozen=True)
class Located:
    """A variable's value and where it was written (an inventory, group_vars or host_vars file)."""

    value: object
    file: str
    line: int | None


@dataclass(frozen=True)
class InventoryHost:
    name: str
    groups: tuple[str, ...]  # every group it is in (parents too), without all and ungrouped
    vars: Mapping[str, Located]  # READ_VARS only


@dataclass(frozen=True)
class Inventory:
    path: Path
    groups: Mapping[str, tuple[str, ...]]  # group -> its hosts and those of its child groups, in file order
    hosts: Mapping[str, InventoryHost]  # only the hosts of the groups asked for


def read_inventory(path: Path, groups: tuple[str, ...]) -> Inventory:
    """Every group of the inventory at `path`, and the hosts of `groups` with their connection variables."""
    # Ansible prints warnings about its own runs (group names it would not accept in a later release, a
    # group named like a host): they are not this tool's, so they stay off the user's terminal.
    with contextlib.redirect_stderr(io.StringIO()):
        return _read(path, groups)


def _read(path: Path, groups: tuple[str, ...]) -> Inventory:
    ansible = _import_ansible()
    kind = "yaml" if path.suffix in YAML_SUFFIXES else "ini"
    source = str(path.resolve())
    loader = ansible.DataLoader()
    # The plugin raises its parse errors; InventoryManager would only print them as warnings.
    plugin = ansible.inventory_loader.get(kind)
    try:
        plugin.parse(ansible.InventoryData(), loader, source, cache=False)
        # The one plugin again (never `script`), and a failure raised rather than printed.
        ansible.constants.INVENTORY_ENABLED = [kind]
        ansible.constants.INVENTORY_ANY_UNPARSED_IS_FAILED = True
        manager = ansible.InventoryManager(loader=loader, sources=[source])
        variables = ansible.VariableManager(loader=loader, inventory=manager)
        members = {
            str(name): tuple(str(host.name) for host in manager.get_hosts(pattern=name))
            for name in manager.groups
            if name not in IMPLICIT_GROUPS
        }
        wanted = dict.fromkeys(name for group in groups for name in members.get(group, ()))
        hosts = {}
        for name in wanted:
            host = manager.get_host(name)
            found = variables.get_vars(host=host, include_hostvars=False)
            host_groups = tuple(str(g.name) for g in host.get_groups() if g.name not in IMPLICIT_GROUPS)
            hosts[name] = InventoryHost(
                name=name,
                groups=host_groups,
                vars={
                    var: _located(found[var], path, name, host_groups, var)
                    for var in READ_VARS
                    if var in found
                },
            )
    except (ansible.AnsibleError, OSError, ValueError) as exc:  # Ansible's, and what its plugins let through
        message = _one_line(exc)
        file, line = _where(exc, source)
        vaulted = _vault_file(path) if "vault" in message.lower() else None
        if vaulted is not None:
            file, line = str(vaulted), 1
            message += (
                " (mgpu-provision asks for no vault password, so it cannot read a variables file that "
                "Ansible Vault encrypted whole)"
            )
        raise InventoryError(message, file, line) from None
    return Inventory(path=path, groups=members, hosts=hosts)


@dataclass(frozen=True)
class _Ansible:
    """The parts of ansible-core this module uses, imported on first use."""

    constants: Any  # ansible.constants, whose settings are module attributes
    DataLoader: Any
    InventoryData: Any
    InventoryManager: Any
    VariableManager: Any
    inventory_loader: Any
    AnsibleError: type[Exception]


def _import_ansible() -> _Ansible:
    # Ansible reads its settings at import: keep its controller temp folder out of ~/.ansible.
    saved = os.environ.get("ANSIBLE_LOCAL_TEMP")
    os.environ.setdefault("ANSIBLE_LOCAL_TEMP", tempfile.gettempdir())
    try:
        import ansible.constants as constants
        from ansible.errors import AnsibleError
        from ansible.inventory.data import InventoryData
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import inventory_loader
        from ansible.vars.manager import VariableManager
    except ImportError as exc:
        raise AnsibleMissing(
            f"reading an Ansible inventory needs ansible-core, which is not installed ({exc.msg}): {EXTRA}"
        ) from None
    finally:
        if saved is None:
            os.environ.pop("ANSIBLE_LOCAL_TEMP", None)
    return _Ansible(
        constants,
        DataLoader,
        InventoryData,
        InventoryManager,
        VariableManager,
        inventory_loader,
        AnsibleError,
    )


def _located(value: object, inventory: Path, host: str, groups: tuple[str, ...], var: str) -> Located:
    origin = _origin_of(value) or _search_var(inventory, host, groups, var)
    return Located(_plain(value), *origin)


def _search_var(inventory: Path, host: str, groups: tuple[str, ...], var: str) -> tuple[str, int | None]:
    """Where `var` of `host` is most likely written, for ansible-core before 2.19, whose values do not say:
    the host's line of the inventory, else its host_vars or its groups' group_vars, else any line of the
    inventory that sets it (a [group:vars] section)."""
    host_word = re.compile(rf"(^|\s){re.escape(host)}(\s|$)")
    found = _first_line(inventory, lambda text: host_word.search(text) is not None and f"{var}=" in text)
    if found is not None:
        return str(inventory), found
    folder = inventory.resolve().parent
    candidates = [folder / "host_vars" / host, *(folder / "group_vars" / group for group in (*groups, "all"))]
    setting = re.compile(rf"^\s*{re.escape(var)}\s*:")
    for base in candidates:
        for path in (base, *(base.parent / (base.name + suffix) for suffix in (".yml", ".yaml", ".json"))):
            files = sorted(path.rglob("*")) if path.is_dir() else [path]
            for file in files:
                line = _first_line(file, lambda text: setting.search(text) is not None)
                if line is not None:
                    return str(file), line
    return str(inventory), _first_line(inventory, lambda text: f"{var}=" in text)


def _first_line(path: Path, wanted: Callable[[str], bool]) -> int | None:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((number for number, text in enumerate(lines, start=1) if wanted(text)), None)


def _plain(value: object) -> object:
    """ansible-core 2.19+ hands out subclasses of str and int that carry their origin: keep the value only."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def _origin_of(thing: object) -> tuple[str, int | None] | None:
    """Where Ansible says `thing` (a value, or an error's `obj`) was written: every value from 2.19 on,
    strings and YAML nodes read from YAML before."""
    position = getattr(thing, "ansible_pos", None)
    if isinstance(position, tuple) and len(position) == 3 and position[0]:
        return str(position[0]), int(position[1])
    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # before ansible-core 2.19 values carry no position
        return None
    origin = thing if isinstance(thing, Origin) else Origin.get_tag(thing)
    if origin is None or not origin.path:
        return None
    return str(origin.path), origin.line_num


def _vault_file(inventory: Path) -> Path | None:
    """The first variables file next to the inventory that Ansible Vault encrypted whole (Ansible does not
    name it when it cannot decrypt it)."""
    for folder in ("group_vars", "host_vars"):
        for path in sorted((inventory.parent / folder).rglob("*")):
            try:
                with path.open("rb") as fh:
                    if fh.read(14) == b"$ANSIBLE_VAULT":
                        return path
            except OSError:
                continue
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


_PATH_LINE = re.compile(r"(/[^\s:'\"]+):(\d+)")
# ansible-core before 2.19: "The error appears to be in '/x/hosts.yml': line 6, column 14, but may be ..."
_APPEARS = re.compile(r"The error appears to be in '([^']+)': line (\d+)")


def _where(exc: BaseException, source: str) -> tuple[str, int | None]:
    """The file and line of an Ansible error: its origin (2.19+), a `path:line` in its message (before
    2.19), or the first line of the inventory that holds what the message quotes."""
    for error in _chain(exc):
        origin = _origin_of(getattr(error, "obj", None))
        if origin is not None and origin[1]:
            return origin
    for error in _chain(exc):
        match = _APPEARS.search(str(error)) or _PATH_LINE.search(str(error))
        if match:
            return match.group(1), int(match.group(2))
    return source, _line_quoted(exc, source)


# Where an ini error quotes the text it refused: "got: X", a quoted name, a [section].
_QUOTED = (re.compile(r"got: (.+)$"), re.compile(r"'([^']+)'"), re.compile(r"\[(\S+?)\]"))


def _line_quoted(exc: BaseException, source: str) -> int | None:
    """The first line that holds what the message quotes as a whole token (`port`, not `ansible_port=`)."""
    message = _one_line(exc)
    for pattern in _QUOTED:
        match = pattern.search(message)
        if match is None:
            continue
        line = _token_line(
            Path(source), re.compile(rf"(^|[\s\[=]){re.escape(match.group(1).strip())}($|[\s\]=:])")
        )
        if line is not None:
            return line
    return None


def _token_line(path: Path, token: re.Pattern[str]) -> int | None:
    return _first_line(
        path, lambda text: not text.lstrip().startswith(("#", ";")) and bool(token.search(text))
    )


def _one_line(exc: BaseException) -> str:
    message = str(getattr(exc, "message", None) or exc)
    # Before 2.19 a YAML error also quotes the JSON parser's and ends with the place and a snippet.
    start = message.find("Syntax Error while loading YAML.")
    message = message[max(start, 0) :].split("The error appears to be in")[0]
    message = " ".join(message.split())
    return _PATH_LINE.sub("", message).replace(": :", ":").strip(" :")


def line_of_host(inventory: Path, name: str) -> int | None:
    """The first line of the inventory that names `name` (where Ansible's parser does not say)."""
    try:
        lines = inventory.read_text(errors="replace").splitlines()
    except OSError:
        return None
    word = re.compile(rf"(^|[\s\[]){re.escape(name)}($|[\s:=\]])")
    return next((number for number, text in enumerate(lines, start=1) if word.search(text)), None)
