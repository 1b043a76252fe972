"""Cross-field rules of the rig file: what no single field can check on its own.

The models check each value alone; a rig file can still be wrong as a whole (a host naming a rig that does
not exist, a visible device beyond the GPU count, an SLI mode that drivers dropped years ago). Each rule here
is its own small pure function with its own message, so that each can be tested with one bad file. A rule
returns findings located by their path in the document; the loader turns paths into file:line:column.

Rules also run on a partially valid file (the loader leaves out hosts, rigs and sections that failed the
schema), so that a file's schema errors and rule errors are reported together. Rules therefore check
references against every name the file declares (`declared_hosts`, `declared_rigs`), valid or not.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..catalog import families, names, sources
from ..catalog.topology import TopoMatrix
from ..errors import did_you_mean
from ..judge.containers import CDI_SINCE, version_tuple
from ..protocol import branch_of
from .cards import (
    branch_range,
    card_class,
    fabric_manager_elsewhere,
    missing_connector,
    missing_nvlink,
    module_type,
    nvlink5_hgx,
    nvml_name_for,
    open_modules_only,
)
from .envvalues import path_entry_problem, value_problem
from .files import resolve_path
from .inventory import line_of_host
from .models import SLI_MODES, Driver, Host, Rig, RigFile, nvml_gres_type

Loc = tuple[str | int, ...]

# Variables the tool writes itself from other fields; setting them in `env` would fight those fields.
MANAGED_ENV = {
    "CUDA_VISIBLE_DEVICES": "visible_devices",
    "CUDA_DEVICE_ORDER": "visible_devices (the tool always writes PCI_BUS_ID)",
}
# Variables bash holds read-only: the profile.d script could not set them in a bash login shell, and the
# launcher (`set -eu`) would stop where /bin/sh is bash.
SHELL_READONLY = frozenset({"BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "UID"})
# Every variable the env files may set from other fields (`env` may override the others): none of them is
# a search path, so `path_prepend` may name none of them.
DERIVED_ENV = frozenset(
    {
        *MANAGED_ENV,
        "NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "OMP_NUM_THREADS",
    }
)
NVLINK_KINDS = ("nvlink-bridge", "nvlink", "nvswitch")


@dataclass(frozen=True)
class Finding:
    """One rule violation: where in the document (a path of keys and indices) and what is wrong."""

    loc: Loc
    message: str
    at_key: bool = False  # point at the key itself (a bad name) rather than at its value


@dataclass(frozen=True)
class RuleInput:
    """What the rules see: the (possibly partial) spec and the names the file declares."""

    spec: RigFile
    # Where each entry of spec.hosts was written: ("hosts", i), or ("rig_groups", group) for inventory hosts.
    host_index: tuple[Loc, ...]
    declared_hosts: frozenset[str]
    declared_rigs: frozenset[str]
    base_dir: Path
    topologies: Mapping[str, TopoMatrix | str]  # rig name -> its parsed topology_file, or why it is unusable
    hosts_known: bool = True  # False: the inventory named could not be read, so hosts may be missing

    def hosts(self) -> Iterator[tuple[Loc, Host]]:
        yield from zip(self.host_index, self.spec.hosts, strict=True)

    def written_hosts(self) -> Iterator[tuple[Loc, Host]]:
        """The hosts of `hosts:` (not the inventory's)."""
        return ((loc, host) for loc, host in self.hosts() if loc[0] == "hosts")

    def rigs(self) -> Iterator[tuple[Loc, Rig]]:
        for name, rig in self.spec.rigs.items():
            yield ("rigs", name), rig


Rule = Callable[[RuleInput], Iterable[Finding]]


def fleet_has_hosts(inp: RuleInput) -> Iterator[Finding]:
    if not inp.spec.hosts and inp.spec.inventory is None and inp.hosts_known:
        yield Finding(
            ("hosts",),
            "the fleet has no hosts: list them under `hosts:`, or read them from an Ansible `inventory:`",
        )


def host_rig_exists(inp: RuleInput) -> Iterator[Finding]:
    known = ", ".join(sorted(inp.declared_rigs)) or "none"
    for loc, host in inp.written_hosts():
        if host.rig not in inp.declared_rigs:
            yield Finding((*loc, "rig"), f"rig '{host.rig}' is not defined under `rigs` (defined: {known})")
    for group, rig in inp.spec.rig_groups.items():
        if rig not in inp.declared_rigs:
            yield Finding(
                ("rig_groups", group), f"rig '{rig}' is not defined under `rigs` (defined: {known})"
            )


def inventory_has_rig_groups(inp: RuleInput) -> Iterator[Finding]:
    if inp.spec.inventory is not None and not inp.spec.rig_groups:
        yield Finding(
            ("inventory",),
            "an inventory needs `rig_groups`: map its groups to rig types, e.g. rig_groups: {gpu_3090: pair}",
        )
    if inp.spec.rig_groups and inp.spec.inventory is None and inp.hosts_known:
        yield Finding(
            ("rig_groups",),
            "rig_groups maps groups of an Ansible inventory: name it in `inventory:`",
            at_key=True,
        )


def host_names_unique(inp: RuleInput) -> Iterator[Finding]:
    first: dict[str, Loc] = {}
    for loc, host in inp.written_hosts():
        if host.name in first:
            yield Finding(
                (*loc, "name"), f"host name '{host.name}' is already used by hosts[{first[host.name][1]}]"
            )
        else:
            first[host.name] = loc


def _box(inp: RuleInput, host: Host) -> tuple[str, str, int]:
    """(jump, address, port) the host is reached at: two hosts with the same are one box. The same
    private address behind two jump hosts may be two boxes; names are compared as written (no DNS)."""
    address = host.target.lower().rstrip(".")
    with contextlib.suppress(ValueError):  # a name, not an IP
        address = str(ipaddress.ip_address(address))  # one spelling for ::1 and 0:0::1
    jump = (host.jump or inp.spec.defaults.jump or "").lower()
    return jump, address, host.port or inp.spec.defaults.port or 22


def _defined_at(inp: RuleInput, loc: Loc, host: Host) -> str:
    if loc[0] == "hosts":
        return f"'{host.name}' at hosts[{loc[1]}]"
    inventory = resolve_path(inp.base_dir, inp.spec.inventory or "")
    line = line_of_host(inventory, host.name)
    return f"'{host.name}' in the inventory {inventory}" + (f" line {line}" if line else "")


def hosts_are_distinct_boxes(inp: RuleInput) -> Iterator[Finding]:
    """Two hosts at one address and port would be converged twice in parallel: two agents, one lock,
    two reboots. Local hosts are this machine by design (rehearsals), so only SSH hosts count."""
    first: dict[tuple[str, str, int], tuple[Loc, Host]] = {}
    for loc, host in inp.hosts():
        if host.connection == "local":
            continue
        box = _box(inp, host)
        if box not in first:
            first[box] = (loc, host)
            continue
        other_loc, other = first[box]
        if other.name == host.name:
            continue  # one name written twice: host_names_unique says so
        via = f" through {box[0]}" if box[0] else ""
        where = f"{_defined_at(inp, other_loc, other)}, {_defined_at(inp, loc, host)}"
        at = (*loc, "address" if host.address else "name") if loc[0] == "hosts" else loc
        same = f"hosts '{other.name}' and '{host.name}' are the same box ({box[1]} port {box[2]}{via})"
        yield Finding(at, f"{same}: {where}; one apply would converge it twice at once: list each box once")


def group_members_exist(inp: RuleInput) -> Iterator[Finding]:
    if not inp.hosts_known:
        return
    for group, members in inp.spec.groups.items():
        for index, member in enumerate(members):
            if member not in inp.declared_hosts:
                hint = did_you_mean(member, inp.declared_hosts)
                yield Finding(
                    ("groups", group, index), f"group member '{member}' is not a host of the fleet{hint}"
                )


def group_names_distinct_from_hosts(inp: RuleInput) -> Iterator[Finding]:
    for group in inp.spec.groups:
        if group in inp.declared_hosts:
            yield Finding(
                ("groups", group),
                f"group '{group}' has the name of a host, so --limit {group} would be ambiguous",
                at_key=True,
            )


def ddp_master_in_fleet(inp: RuleInput) -> Iterator[Finding]:
    if not inp.hosts_known:
        return
    for loc, rig in inp.rigs():
        if rig.ddp is not None and rig.ddp.master not in inp.declared_hosts:
            hint = did_you_mean(rig.ddp.master, inp.declared_hosts)
            yield Finding(
                (*loc, "ddp", "master"), f"ddp master '{rig.ddp.master}' is not a host of the fleet{hint}"
            )


def gpu_model_is_a_name(inp: RuleInput) -> Iterator[Finding]:
    """The model is matched against NVML's name exactly: a shorthand never matches (a placeholder is
    refused by the model itself)."""
    for loc, rig in inp.rigs():
        model = rig.gpus.model
        if (name := nvml_name_for(model)) is not None:
            yield Finding(
                (*loc, "gpus", "model"),
                f"'{model}' is not an NVML name (plan compares it exactly); did you mean '{name}'?",
            )


def ddp_master_uses_rig(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.ddp is None:
            continue
        rig_name = loc[1]
        for _, host in inp.hosts():
            if host.name == rig.ddp.master and host.rig != rig_name:
                yield Finding(
                    (*loc, "ddp", "master"),
                    f"ddp master '{host.name}' is a '{host.rig}' host; the master of rig '{rig_name}' "
                    "must be one of its own hosts",
                )
                break


def ddp_master_has_address(inp: RuleInput) -> Iterator[Finding]:
    # The other nodes dial the master for the rendezvous: a name that only this machine's ~/.ssh/config
    # knows (the fallback when `address` is absent) would reach them as an unresolvable MASTER_ADDR.
    for loc, rig in inp.rigs():
        if rig.ddp is None:
            continue
        rig_name = loc[1]
        members = [host for _, host in inp.hosts() if host.rig == rig_name]
        master = next((host for host in members if host.name == rig.ddp.master), None)
        if len(members) > 1 and master is not None and master.address is None:
            yield Finding(
                (*loc, "ddp", "master"),
                f"ddp master '{master.name}' has no `address`: the other nodes of rig '{rig_name}' reach the "
                "rendezvous there, so give it the IP or DNS name they resolve (an ~/.ssh/config alias "
                "is not enough)",
            )


def visible_devices_valid(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        seen: set[int | str] = set()
        for index, device in enumerate(rig.visible_devices or []):
            where = (*loc, "visible_devices", index)
            if device in seen:
                yield Finding(where, f"visible device {device} is listed twice")
            seen.add(device)
            if isinstance(device, int) and not 0 <= device < rig.gpus.count:
                yield Finding(
                    where,
                    f"visible device {device} does not exist: the rig has {rig.gpus.count} GPU(s), "
                    f"indices 0-{rig.gpus.count - 1}",
                )


def batch_size_covers_gpus(inp: RuleInput) -> Iterator[Finding]:
    batch = inp.spec.smoke.batch_size
    for loc, rig in inp.rigs():
        gpus = rig.visible_count
        if batch < gpus:
            yield Finding(
                ("smoke", "batch_size"),
                f"batch size {batch} is smaller than the {gpus} GPUs per node of rig '{loc[1]}'; "
                "every GPU needs at least one sample",
            )


def nproc_within_visible(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.ddp is not None and rig.ddp.nproc_per_node is not None:
            gpus = rig.visible_count
            if rig.ddp.nproc_per_node > gpus:
                yield Finding(
                    (*loc, "ddp", "nproc_per_node"),
                    f"nproc_per_node {rig.ddp.nproc_per_node} is more than the {gpus} visible GPU(s) "
                    "per node",
                )


def sli_mode_supported(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.sli is not None and rig.sli.mode not in SLI_MODES:
            yield Finding(
                (*loc, "sli", "mode"),
                f"SLI mode '{rig.sli.mode}' is not supported: NVIDIA drivers since 455 accept only Off and "
                "Mosaic (On, Auto, AFR, SFR, AA and AFRofAA were removed); BaseMosaic spans displays on "
                "GeForce",
            )


def _sli_enabled(rig: Rig) -> bool:
    return rig.sli is not None and rig.sli.mode != "Off"


def sli_needs_two_gpus(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if _sli_enabled(rig) and rig.gpus.count < 2:
            yield Finding((*loc, "sli", "mode"), "SLI needs at least 2 GPUs of one model; this rig has 1")


def sli_needs_bridge(inp: RuleInput) -> Iterator[Finding]:
    # Base Mosaic needs no bridge (NVIDIA X driver README); SLI Mosaic does.
    for loc, rig in inp.rigs():
        if rig.sli is not None and rig.sli.mode == "Mosaic" and rig.bridge.kind == "none":
            yield Finding((*loc, "sli", "mode"), "SLI needs a bridge: set bridge.kind (e.g. nvlink-bridge)")


def sli_mosaic_needs_professional_cards(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.sli is not None and rig.sli.mode == "Mosaic" and card_class(rig.gpus.model) == "geforce":
            yield Finding(
                (*loc, "sli", "mode"),
                f"SLI Mosaic needs professional cards (Quadro, RTX A-series, RTX Ada); {rig.gpus.model} is a "
                "GeForce card, whose driver ignores it: use mode BaseMosaic (Base Mosaic spans the displays "
                "without SLI rendering)",
            )


def card_has_bridge_connector(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        family = missing_connector(rig.gpus.model)
        if family is None:
            continue
        why = f"{rig.gpus.model} has no NVLink/SLI connector ({family})"
        if rig.bridge.kind in NVLINK_KINDS:
            yield Finding((*loc, "bridge", "kind"), f"{why}: bridge kind {rig.bridge.kind} is impossible")
        if rig.sli is not None and _sli_enabled(rig):
            yield Finding((*loc, "sli", "mode"), f"{why}: SLI mode {rig.sli.mode} is impossible")


def card_has_nvlink_connector(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        family = missing_nvlink(rig.gpus.model)
        if family is not None and rig.bridge.kind in NVLINK_KINDS:
            yield Finding(
                (*loc, "bridge", "kind"),
                f"{rig.gpus.model} has no NVLink connector ({family}): bridge kind {rig.bridge.kind} is "
                "impossible; use kind none (PCIe)",
            )


def bridge_pairs_in_range(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        for index, pair in enumerate(rig.bridge.pairs):
            for side, gpu in enumerate(pair):
                if not 0 <= gpu < rig.gpus.count:
                    yield Finding(
                        (*loc, "bridge", "pairs", index, side),
                        f"GPU {gpu} does not exist: the rig has {rig.gpus.count} GPU(s), "
                        f"indices 0-{rig.gpus.count - 1}",
                    )


def bridge_pairs_distinct(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        seen: set[frozenset[int]] = set()
        for index, (a, b) in enumerate(rig.bridge.pairs):
            where = (*loc, "bridge", "pairs", index)
            if a == b:
                yield Finding(where, f"GPU {a} cannot be bridged to itself")
            elif frozenset((a, b)) in seen:
                yield Finding(where, f"pair [{a}, {b}] is listed twice")
            seen.add(frozenset((a, b)))


def bridge_links_given(inp: RuleInput) -> Iterator[Finding]:
    # A captured matrix gives the links of every pair itself (its NV# cells), as the README offers.
    for loc, rig in inp.rigs():
        bridge = rig.bridge
        if bridge.kind in NVLINK_KINDS and bridge.links is None and bridge.topology_file is None:
            yield Finding(
                (*loc, "bridge"),
                f"bridge kind {bridge.kind} needs `links` (the active NVLinks expected per "
                + ("GPU, to the switches" if bridge.kind == "nvswitch" else "bridged pair")
                + ") or a `topology_file` (a capture of `nvidia-smi topo -m` that shows them)",
            )


def bridge_pairs_given(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        bridge = rig.bridge
        if bridge.kind in ("nvlink-bridge", "nvlink") and not bridge.pairs and bridge.topology_file is None:
            yield Finding(
                (*loc, "bridge"),
                f"bridge kind {bridge.kind} needs `pairs` (which GPUs are joined) or a `topology_file`",
            )


def nvswitch_has_no_pairs(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.bridge.kind == "nvswitch" and rig.bridge.pairs:
            yield Finding(
                (*loc, "bridge", "pairs"),
                "nvswitch bridges take no `pairs`: every NVLink ends at a switch, not at another GPU",
            )


def no_bridge_has_no_links(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.bridge.kind == "none":
            for key in ("pairs", "links"):
                if getattr(rig.bridge, key):
                    yield Finding(
                        (*loc, "bridge", key),
                        f"`{key}` needs an NVLink bridge kind; bridge.kind is none (PCIe only)",
                    )


def driver_version_or_branch(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        driver = rig.driver
        if driver is None:
            continue
        if driver.version is None and driver.branch is None:
            yield Finding(
                (*loc, "driver"), 'driver needs `version` (e.g. "550.54.15") or `branch` (e.g. "550")'
            )
        elif driver.version is not None and driver.branch is not None:
            yield Finding((*loc, "driver", "branch"), "give either `version` or `branch`, not both")


def reclaim_patterns_match_policy(inp: RuleInput) -> Iterator[Finding]:
    reclaim = inp.spec.reclaim
    if reclaim.patterns and reclaim.policy != "orphans+patterns":
        yield Finding(
            ("reclaim", "patterns"),
            f"patterns are only used with policy orphans+patterns, but the policy is {reclaim.policy}",
        )
    if reclaim.policy == "orphans+patterns" and not reclaim.patterns:
        yield Finding(
            ("reclaim", "patterns"), "policy orphans+patterns needs `patterns` (command-line regexes)"
        )


def runfile_complete(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        driver = rig.driver
        if driver is None:
            continue
        if driver.method == "runfile":
            missing = [key for key in ("runfile_url", "runfile_sha256") if getattr(driver, key) is None]
            if missing:
                yield Finding(
                    (*loc, "driver", "method"),
                    f"method runfile needs {' and '.join(missing)}: the installer is checked before it runs",
                )
            if driver.branch is not None:
                yield Finding(
                    (*loc, "driver", "branch"), "method runfile installs one exact `version`, not a branch"
                )
        else:
            for key in ("runfile_url", "runfile_sha256"):
                if getattr(driver, key) is not None:
                    yield Finding(
                        (*loc, "driver", key),
                        f"`{key}` is only used with method runfile (method is {driver.method or 'apt/dnf'})",
                    )


# How each package source is installed; the CUDA repository serves every family (catalog/families.py).
SOURCE_METHODS = {
    source: tuple(method for method, served in families.METHOD_SOURCES.items() if source in served)
    for source in sources.SOURCES
}


def driver_source_fits(inp: RuleInput) -> Iterator[Finding]:
    """A flavor, Fabric Manager or method the chosen source lacks is refused here, not at install time."""
    for loc, rig in inp.rigs():
        driver = rig.driver
        if driver is None:
            continue
        at = (*loc, "driver")
        if driver.flavor == "open" and sources.pre_turing(rig.gpus.model):
            yield Finding(
                (*at, "flavor"),
                f"open kernel modules need Turing or newer; {rig.gpus.model} needs flavor default "
                "(proprietary)",
            )
        if driver.method == "runfile":
            yield from _runfile_fits(at, driver)
            continue
        if driver.packages is not None and driver.method not in (None, "apt"):
            yield Finding(
                (*at, "packages"), f"`packages` is for apt sources; {driver.method} installs NVIDIA's set"
            )
        if driver.source is None:
            continue
        flavors = sources.FLAVORS[driver.source]
        if driver.flavor is not None and driver.flavor not in flavors:
            yield Finding(
                (*at, "flavor"),
                f"the {driver.source} source has no {driver.flavor} flavor (it has {', '.join(flavors)})",
            )
        if driver.fabricmanager and not sources.HAS_FABRICMANAGER[driver.source]:
            yield Finding(
                (*at, "fabricmanager"),
                f"the {driver.source} source has no Fabric Manager package; use source cuda "
                "(NVIDIA's repository)",
            )
        methods = SOURCE_METHODS[driver.source]
        if driver.method is not None and driver.method not in methods:
            yield Finding(
                (*at, "method"),
                f"the {driver.source} source is installed with {' or '.join(methods)}, not {driver.method}",
            )


def kernel_modules_fit_architecture(inp: RuleInput) -> Iterator[Finding]:
    """Blackwell and Grace GPUs come up without a usable GPU (RmInitAdapter failed) on the proprietary
    modules: refused here, whether the rig asks for them or its branch defaults to them."""
    for loc, rig in inp.rigs():
        driver = rig.driver
        family = open_modules_only(rig.gpus.model)
        if driver is None or family is None:
            continue
        branch = str(driver.branch or branch_of(driver.version or ""))
        if not branch.isdigit():
            continue  # driver_version_or_branch says what is missing
        if module_type(driver.flavor, rig.gpus.model, branch) == "open":
            continue
        why = (
            f"{rig.gpus.model} ({family}) runs only the open kernel modules; NVIDIA does not support the "
            "proprietary ones there and the GPU does not initialize"
        )
        if driver.flavor is not None:
            yield Finding((*loc, "driver", "flavor"), f"{why}: flavor {driver.flavor} is proprietary")
        else:
            yield Finding(
                (*loc, "driver"),
                f"{why}: branch {branch} installs them by default (open from {sources.OPEN_DEFAULT_FROM}); "
                f"use branch {sources.OPEN_DEFAULT_FROM} or later, or set flavor open",
            )


def branch_drives_gpu(inp: RuleInput) -> Iterator[Finding]:
    """A branch that does not drive the rig's GPU generation (cards.branch_range: Volta on 590, a B200 on
    550) installs a driver under which the GPU never comes up: refused here, naming the branches that do."""
    for loc, rig in inp.rigs():
        driver = rig.driver
        known = branch_range(rig.gpus.model)
        branch = str((driver.branch or branch_of(driver.version or "")) if driver else "")
        if driver is None or known is None or not branch.isdigit():
            continue
        b = int(branch)
        field = "branch" if driver.branch is not None else "version"
        if known.last is not None and b > known.last:
            yield Finding(
                (*loc, "driver", field),
                f"{rig.gpus.model} ({known.generation}) is driven by branch {known.last} and older; "
                f'branch {b} does not support it: set driver.branch to "{known.last}"',
            )
        elif known.first is not None and b < known.first:
            yield Finding(
                (*loc, "driver", field),
                f"{rig.gpus.model} ({known.generation}) needs branch {known.first} or newer; branch {b} does "
                f'not support it: set driver.branch to "{known.first}" or later',
            )
        elif driver.version and known.first_version and _before(driver.version, known.first_version):
            first = known.first_version
            yield Finding(
                (*loc, "driver", "version"),
                f"{rig.gpus.model} ({known.generation}) is driven from {first}; {driver.version} does not "
                f"support it: set driver.version to {first} or later",
            )


def _before(version: str, first: str) -> bool:
    def numbers(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", text))

    return numbers(version) < numbers(first)


def nvlink5_needs_nvidia_repository(inp: RuleInput) -> Iterator[Finding]:
    """Canonical's archive builds Fabric Manager and NSCQ per branch and nothing of NVLink5's set (NVLink
    Subnet Manager, NVSDM): Fabric Manager on an HGX B200/B300 from it could never start."""
    for loc, rig in inp.rigs():
        driver = rig.driver
        if driver and driver.fabricmanager and driver.source == "ubuntu" and nvlink5_hgx(rig.gpus.model):
            yield Finding(
                (*loc, "driver", "source"),
                f"{rig.gpus.model} needs NVLink Subnet Manager (nvlsm) and NVSDM beside Fabric Manager, "
                "which Ubuntu's archive does not carry: set driver.source: cuda (NVIDIA's repository)",
            )


PGP_ARMOR = "-----BEGIN PGP PUBLIC KEY BLOCK-----"


def driver_repo_usable(inp: RuleInput) -> Iterator[Finding]:
    """A mirror is a package repository (apt's deb822 source, or a .repo file for dnf, yum and zypper); its
    key file must be there and be a public key."""
    for loc, rig in inp.rigs():
        driver = rig.driver
        if driver is None or driver.repo is None:
            continue
        at = (*loc, "driver", "repo")
        if driver.method == "runfile":
            yield Finding(at, "driver.repo is a package repository; method runfile installs no packages")
        path = resolve_path(inp.base_dir, driver.repo.key)
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            yield Finding((*at, "key"), f"cannot read the mirror's key {path}: {exc.strerror}")
            continue
        if PGP_ARMOR not in text:
            yield Finding((*at, "key"), f"{path} is not an ASCII-armored public key ({PGP_ARMOR} ...)")


def _runfile_fits(at: Loc, driver: Driver) -> Iterator[Finding]:
    for key in ("source", "packages"):
        if getattr(driver, key) is not None:
            yield Finding(
                (*at, key), f"`{key}` is for package installs; method runfile runs NVIDIA's installer"
            )
    if driver.flavor in ("server", "server-open"):
        yield Finding(
            (*at, "flavor"),
            f"flavor {driver.flavor} is an Ubuntu package build; a runfile has default or open",
        )
    if driver.fabricmanager:
        yield Finding(
            (*at, "fabricmanager"),
            "Fabric Manager has no runfile path here: install the driver with method apt or dnf",
        )


def imex_fits(inp: RuleInput) -> Iterator[Finding]:
    """nvidia-imex is NVIDIA's (CUDA and RHEL repositories, from branch 550); Fabric Manager never runs on a
    Grace Blackwell compute tray."""
    for loc, rig in inp.rigs():
        driver = rig.driver
        if driver is None:
            continue
        if driver.fabricmanager and fabric_manager_elsewhere(rig.gpus.model):
            yield Finding(
                (*loc, "driver", "fabricmanager"),
                f"{rig.gpus.model} compute trays run no Fabric Manager (the rack's NVLink switch trays do): "
                "set fabricmanager false, and imex true for multi-node NVLink",
            )
        if not driver.imex:
            continue
        branch = str(driver.branch or branch_of(driver.version or ""))
        if driver.source in ("ubuntu", "debian") or driver.method == "runfile":
            where = f"the {driver.source} source" if driver.method != "runfile" else "method runfile"
            yield Finding(
                (*loc, "driver", "imex"), f"{where} has no nvidia-imex package; use source cuda (NVIDIA's)"
            )
        elif branch.isdigit() and names.component("cuda", "apt", int(branch), "imex") is None:
            yield Finding(
                (*loc, "driver", "imex"), f"nvidia-imex exists from branch 550; this rig has {branch}"
            )


def imex_peers_are_addresses(inp: RuleInput) -> Iterator[Finding]:
    """nodes_config.cfg holds IP addresses (NVIDIA's IMEX guide, "Deployment Models"): each peer named, and
    with `peers: fleet` each host of the rig type, must be one."""
    for loc, rig in inp.rigs():
        domain = rig.driver.imex_domain if rig.driver is not None else None
        if domain is None or domain.peers == "per_job":
            continue
        at = (*loc, "driver", "imex", "peers")
        if domain.peers == "fleet":
            for host_loc, host in inp.hosts():
                if host.rig == loc[1] and not _is_ip(host.target):
                    yield Finding(
                        (*host_loc, "address"),
                        f"{host.name}'s address {host.target} is not an IP address, and IMEX's "
                        "nodes_config.cfg lists IP addresses: give the host its IP address, or set "
                        f"rigs.{loc[1]}.driver.imex.peers to the domain's addresses",
                    )
            continue
        for i, peer in enumerate(domain.peers):
            if not _is_ip(peer):
                yield Finding((*at, i), f"{peer} is not an IP address (nodes_config.cfg lists IP addresses)")
        if len(set(domain.peers)) != len(domain.peers):
            yield Finding(at, "each address once: every node of the domain reads the same list")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def fabricmanager_needs_nvswitch(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.driver is not None and rig.driver.fabricmanager and rig.bridge.kind != "nvswitch":
            yield Finding(
                (*loc, "driver", "fabricmanager"),
                f"Fabric Manager only runs NVSwitch boxes; bridge.kind is {rig.bridge.kind}",
            )


def containers_fit(inp: RuleInput) -> Iterator[Finding]:
    """`nvidia-ctk cdi generate` exists from toolkit 1.12.0 (NVIDIA/nvidia-container-toolkit CHANGELOG.md,
    v1.12.0-rc.2): an older pin could not keep a CDI spec."""
    for loc, rig in inp.rigs():
        want = rig.containers
        if want is not None and version_tuple(want.toolkit) < CDI_SINCE:
            yield Finding(
                (*loc, "containers", "toolkit"),
                f"toolkit {want.toolkit} has no `nvidia-ctk cdi generate` (from 1.12.0): pin 1.12.0 or later",
            )


def _read_only(loc: Loc, name: str) -> Iterator[Finding]:
    if name in SHELL_READONLY:
        yield Finding(
            (*loc, name),
            f"{name} is read-only in bash: the profile.d script cannot set it, and the launcher would stop "
            "where /bin/sh is bash",
            at_key=True,
        )


def _env_findings(loc: Loc, env: dict[str, str]) -> Iterator[Finding]:
    for name, value in env.items():
        yield from _read_only(loc, name)
        if name in MANAGED_ENV:
            yield Finding(
                (*loc, name),
                f"{name} is written by the tool from {MANAGED_ENV[name]}; set it there",
                at_key=True,
            )
        problem = value_problem(value)
        if problem is not None:
            yield Finding((*loc, name), f"value of {name} {problem}")
        elif re.search(rf"\$(?:{name}|{{{name}}})(?![A-Za-z0-9_])", value):
            # Values are data, so `PATH: /x:$PATH` would hand every process on the node a PATH holding the
            # text `$PATH` (and drop /usr/bin): the one literal `$` that is never meant.
            yield Finding(
                (*loc, name),
                f"value of {name} refers to ${name}, but values are written as data, not expanded: the node "
                f"would get the text ${name}; to put folders in front of {name} use "
                f"path_prepend: {{{name}: [/folder]}}",
            )


def env_safe(inp: RuleInput) -> Iterator[Finding]:
    yield from _env_findings(("env",), inp.spec.env)
    for loc, rig in inp.rigs():
        yield from _env_findings((*loc, "env"), rig.env)


def _path_prepend_findings(loc: Loc, prepends: dict[str, list[str]]) -> Iterator[Finding]:
    for name, entries in prepends.items():
        yield from _read_only(loc, name)
        if name in DERIVED_ENV:
            yield Finding(
                (*loc, name),
                f"{name} is written by the tool, not a search path: path_prepend is for variables such as "
                "PATH and LD_LIBRARY_PATH",
                at_key=True,
            )
        seen: set[str] = set()
        for index, entry in enumerate(entries):
            problem = path_entry_problem(entry)
            if problem is None and entry in seen:
                problem = f"entry {entry!r} is listed twice"
            seen.add(entry)
            if problem is not None:
                yield Finding((*loc, name, index), f"{name}: {problem}")


def path_prepend_safe(inp: RuleInput) -> Iterator[Finding]:
    yield from _path_prepend_findings(("path_prepend",), inp.spec.path_prepend)
    for loc, rig in inp.rigs():
        yield from _path_prepend_findings((*loc, "path_prepend"), rig.path_prepend)


def _both_message(name: str, env_at: str, prepend_at: str) -> str:
    return (
        f"{name} is set by {env_at} and prepended to by {prepend_at}: a variable is either a value (env) "
        "or entries put in front of its current value (path_prepend), not both"
    )


def env_or_path_prepend(inp: RuleInput) -> Iterator[Finding]:
    # The fleet's pair is reported once; a rig is checked for what it adds to the merge (rig over fleet).
    # An empty list prepends nothing: a rig may drop the fleet's list that way and set the variable in env.
    fleet_env = inp.spec.env
    fleet_prepend = {name: entries for name, entries in inp.spec.path_prepend.items() if entries}
    for name in sorted(fleet_env.keys() & fleet_prepend.keys()):
        yield Finding(("path_prepend", name), _both_message(name, "env", "path_prepend"), at_key=True)
    for loc, rig in inp.rigs():
        where = ".".join(str(part) for part in loc)
        env = {**dict.fromkeys(fleet_env, "env"), **dict.fromkeys(rig.env, f"{where}.env")}
        prepend = {
            **dict.fromkeys(fleet_prepend, "path_prepend"),
            **dict.fromkeys(rig.path_prepend, f"{where}.path_prepend"),
        }
        prepend = {name: at for name, at in prepend.items() if rig.path_prepend.get(name, True)}
        for name in sorted(env.keys() & prepend.keys()):
            if name in rig.path_prepend:
                yield Finding(
                    (*loc, "path_prepend", name), _both_message(name, env[name], prepend[name]), at_key=True
                )
            elif name in rig.env:
                yield Finding((*loc, "env", name), _both_message(name, env[name], prepend[name]), at_key=True)


def topology_file_matches(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        found = inp.topologies.get(str(loc[1]))
        if found is None:
            continue
        where = (*loc, "bridge", "topology_file")
        if isinstance(found, str):
            yield Finding(where, found)
        elif found.gpu_count != rig.gpus.count:
            path = resolve_path(inp.base_dir, str(rig.bridge.topology_file))
            yield Finding(where, f"{path} shows {found.gpu_count} GPU(s) but gpus.count is {rig.gpus.count}")


def _managed_paths(inp: RuleInput) -> Iterator[tuple[Loc, str]]:
    """Every path the tool writes on a node, where the rig file names it: `files` and `node_check`."""
    for key, value in inp.spec.files:
        if isinstance(value, str):
            yield ("files", key), value
    if inp.spec.node_check is not None:
        for key, value in inp.spec.node_check.paths():
            yield ("node_check", key), value


def ssh_files_absolute(inp: RuleInput) -> Iterator[Finding]:
    ssh_hosts = [host.name for _, host in inp.hosts() if host.connection == "ssh"]
    if not ssh_hosts:
        return
    for loc, value in _managed_paths(inp):
        if not value.startswith("/"):
            yield Finding(
                loc,
                f"'{value}' must be an absolute path (start with /): it is a path on ssh hosts "
                f"such as {ssh_hosts[0]}; only local hosts may use relative paths",
            )


def files_without_dot_dot(inp: RuleInput) -> Iterator[Finding]:
    # The tool writes these paths as root: `/etc/profile.d/../../tmp/x` lands outside the folder it names.
    for loc, value in _managed_paths(inp):
        if ".." in value.split("/"):
            yield Finding(
                loc,
                f"'{value}' contains '..': name the managed file's folder directly, without climbing out",
            )


def node_check_timer_has_systemd(inp: RuleInput) -> Iterator[Finding]:
    check = inp.spec.node_check
    if check is not None and check.interval is not None and inp.spec.files.systemd_dir is None:
        yield Finding(
            ("node_check", "interval"),
            "a timer needs files.systemd_dir (where apply writes its units); set it, or set "
            "node_check.interval to null and run the check from Slurm or cron",
        )


def identity_files_exist(inp: RuleInput) -> Iterator[Finding]:
    """A key file that is not there fails every login later with a bare "No such file or directory"."""
    named: list[tuple[Loc, str]] = [
        (loc, host.identity_file) for loc, host in inp.written_hosts() if host.identity_file
    ]
    if inp.spec.defaults.identity_file:
        named.append((("defaults",), inp.spec.defaults.identity_file))
    for loc, value in named:
        path = resolve_path(inp.base_dir, value)
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "does not exist"
            yield Finding((*loc, "identity_file"), f"the SSH key {path} {what}")
        elif (problem := key_file_problem(path)) is not None:
            yield Finding((*loc, "identity_file"), f"the SSH key {path} {problem}")


# The first words of a public key line (ssh-keygen's .pub, authorized_keys): ssh-ed25519, ecdsa-sha2-...
_PUBLIC_KEY = re.compile(rb"^\s*(ssh-|ecdsa-|sk-ssh-|sk-ecdsa-)[a-z0-9@.-]+ [A-Za-z0-9+/=]{20,}")


def key_file_problem(path: Path) -> str | None:
    """Why a private key file cannot log in, read as OpenSSH would (without loading Paramiko): a public key
    named instead, a file that is no key, or a passphrase with no SSH agent to hold it; None when usable or
    unreadable here (the login says why)."""
    import base64
    import os

    try:
        head = path.read_bytes()[:65536]
    except OSError:
        return None
    if _PUBLIC_KEY.match(head):
        return "is a public key: name the private key (the same file without .pub)"
    if b"PRIVATE KEY-----" not in head:
        return "is not a private key (no '-----BEGIN ... PRIVATE KEY-----' line)"
    if os.environ.get("SSH_AUTH_SOCK"):
        return None  # an agent may hold the key already
    encrypted = b"Proc-Type: 4,ENCRYPTED" in head or b"BEGIN ENCRYPTED PRIVATE KEY" in head
    if b"BEGIN OPENSSH PRIVATE KEY" in head:  # PROTOCOL.key: "openssh-key-v1\0", then the cipher's name
        body = b"".join(line for line in head.splitlines() if line and not line.startswith(b"-----"))
        with contextlib.suppress(ValueError):
            raw = base64.b64decode(body[:200] + b"=" * (-len(body[:200]) % 4))
            magic = b"openssh-key-v1\0"
            if raw.startswith(magic):
                size = int.from_bytes(raw[len(magic) : len(magic) + 4], "big")
                encrypted = raw[len(magic) + 4 : len(magic) + 4 + size] != b"none"
    if encrypted:
        return "is protected by a passphrase and no SSH agent runs (SSH_AUTH_SOCK): load it with ssh-add"
    return None


def addresses_are_addresses(inp: RuleInput) -> Iterator[Finding]:
    """`10.0.0.300` passes the address pattern (a DNS name may hold digits and dots) but is no address:
    every login would fail at name resolution."""
    for loc, host in inp.written_hosts():
        address = host.address
        if address is not None and re.fullmatch(r"[0-9.]+", address):
            try:
                ipaddress.IPv4Address(address)
            except ValueError:
                yield Finding(
                    (*loc, "address"), f"'{address}' is not an IPv4 address (four numbers 0 to 255)"
                )


def local_twins_exist(inp: RuleInput) -> Iterator[Finding]:
    """A `connection: local` host's twin is a file of this machine: one that is missing or a folder fails
    every call with a twin error. (An SSH host's twin is a file of the node, which validate cannot see.)"""
    for loc, host in inp.written_hosts():
        if host.connection != "local" or host.simulate is None:
            continue
        path = resolve_path(inp.base_dir, host.simulate)
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "does not exist"
            yield Finding((*loc, "simulate"), f"the twin file {path} {what}")


def local_hosts_apart(inp: RuleInput) -> Iterator[Finding]:
    """Two simulated hosts on this machine (`connection: local`, a rehearsal of a fleet) write the same
    managed files (`files:` is one for the fleet): each apply would undo the other's, forever, while each
    twin says its box converged. A rig that writes no env file (all null) is safe to read and plan that
    way, and real local hosts are this one machine under several names (smoke tests use that)."""
    files = inp.spec.files
    if files.profile_d is None and files.environment_file is None and files.launcher is None:
        return
    first: tuple[Loc, Host] | None = None
    for loc, host in inp.written_hosts():
        if host.connection != "local" or host.simulate is None:
            continue
        if first is None:
            first = (loc, host)
            continue
        yield Finding(
            (*loc, "connection"),
            f"'{host.name}' and '{first[1].name}' are simulated on this machine (connection: local) and "
            "would write the same managed files (files:) over each other; rehearse several nodes with "
            '`mgpu-provision rehearse up --hosts N` (SSH hosts on loopback, README "Rehearsing a fleet")',
        )


def slurm_health_check_has_node_check(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.slurm is not None and rig.slurm.health_check is not None and inp.spec.node_check is None:
            yield Finding(
                (*loc, "slurm", "health_check"),
                "health_check runs the node check, which apply installs only with a `node_check` section "
                "(interval: null leaves the scheduling to Slurm)",
            )


def slurm_socket_layout_needs_cores(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.slurm is not None and not rig.slurm.cores and rig.slurm.socket_layout not in ("auto", "exact"):
            yield Finding(
                (*loc, "slurm", "socket_layout"),
                f"socket_layout {rig.slurm.socket_layout} shapes gres.conf's Cores=, which cores: false "
                "leaves out; set cores: true or drop socket_layout",
            )


def slurm_type_matches_nvml(inp: RuleInput) -> Iterator[Finding]:
    for loc, rig in inp.rigs():
        if rig.slurm is None or rig.slurm.gres_type is None:
            continue
        nvml = nvml_gres_type(rig.gpus.model)
        if rig.slurm.gres_type not in nvml:
            yield Finding(
                (*loc, "slurm", "gres_type"),
                f"GRES type '{rig.slurm.gres_type}' is not part of '{nvml}' (the NVML name lower-cased with "
                "underscores): Slurm's AutoDetect=nvml would not match it; use a substring such as "
                f"'{'_'.join(nvml.split('_')[-2:])}'",
            )


RULES: tuple[Rule, ...] = (
    fleet_has_hosts,
    hosts_are_distinct_boxes,
    host_rig_exists,
    inventory_has_rig_groups,
    host_names_unique,
    group_members_exist,
    group_names_distinct_from_hosts,
    ddp_master_in_fleet,
    gpu_model_is_a_name,
    ddp_master_uses_rig,
    ddp_master_has_address,
    visible_devices_valid,
    batch_size_covers_gpus,
    nproc_within_visible,
    sli_mode_supported,
    sli_needs_two_gpus,
    sli_needs_bridge,
    sli_mosaic_needs_professional_cards,
    card_has_bridge_connector,
    card_has_nvlink_connector,
    bridge_pairs_in_range,
    bridge_pairs_distinct,
    bridge_links_given,
    bridge_pairs_given,
    nvswitch_has_no_pairs,
    no_bridge_has_no_links,
    driver_version_or_branch,
    runfile_complete,
    driver_source_fits,
    kernel_modules_fit_architecture,
    branch_drives_gpu,
    nvlink5_needs_nvidia_repository,
    driver_repo_usable,
    reclaim_patterns_match_policy,
    fabricmanager_needs_nvswitch,
    imex_fits,
    imex_peers_are_addresses,
    env_safe,
    path_prepend_safe,
    env_or_path_prepend,
    topology_file_matches,
    ssh_files_absolute,
    files_without_dot_dot,
    identity_files_exist,
    addresses_are_addresses,
    local_twins_exist,
    local_hosts_apart,
    node_check_timer_has_systemd,
    slurm_type_matches_nvml,
    slurm_socket_layout_needs_cores,
    slurm_health_check_has_node_check,
    containers_fit,
)


def check_rules(inp: RuleInput) -> list[Finding]:
    """Every finding of every rule, in rule order."""
    return [finding for rule in RULES for finding in rule(inp)]
