"""Write a rig file from a known-good box's facts (`mgpu-provision init --from HOST`).

People should not have to type GPU names, link counts and driver versions by hand: a box that works is the
best description of the boxes that should match it. This module is pure (facts in, YAML text out) so that the
guesses it makes are unit-tested; every guess carries a `# review:` comment for the person to check.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from ..errors import ProvisionError
from ..facts import Facts
from ..rig.models import Files

# The env files apply writes; `init` asks the box for them so that its rig file does not demand new ones.
ENV_FILE_FIELDS = ("profile_d", "environment_file", "launcher")


def env_file_paths() -> list[str]:
    defaults = Files()
    return [path for path in (getattr(defaults, f) for f in ENV_FILE_FIELDS) if path]


def files_lines(facts: Facts) -> list[str]:
    """Keep the default env files if the box has them all; otherwise leave them unmanaged, said plainly.

    A known-good box that was set up by hand has no mgpu-provision env files; demanding them would make the
    first plan of the box it was read from show drift.
    """
    if all((f := facts.file(path)) is not None and f.exists for path in env_file_paths()):
        return []
    return [
        "files:",
        "  # review: this box has no env files from mgpu-provision yet. Remove these three lines to have",
        "  # `apply` write the profile.d script, the systemd EnvironmentFile and the mgpu-torchrun launcher.",
        *(f"  {field}: null" for field in ENV_FILE_FIELDS),
    ]


def _q(value: str) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML)."""
    return json.dumps(value)


def rig_name_for(facts: Facts) -> str:
    """A short rig-type name such as `rtx3090-x2` from the GPU model and count."""
    if not facts.gpus:
        return "no-gpu"
    model = Counter(g.name for g in facts.gpus).most_common(1)[0][0]
    words = [w for w in model.lower().replace("nvidia", "").replace("geforce", "").split() if w]
    stem = "-".join(words[:2]) or "gpu"
    stem = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in stem).strip("-")
    return f"{stem.replace('rtx-', 'rtx')}-x{len(facts.gpus)}"


def bridge_lines(facts: Facts, topology_file: str | None) -> list[str]:
    """The `bridge:` section: NVSwitch, bridged pairs, a mesh, or PCIe only, as the links show."""
    linked = [p for p in facts.pairs if p.nvlinks > 0]
    topo = f", topology_file: {topology_file}" if topology_file else ""
    if facts.nvswitch:
        per_gpu = min((sum(1 for link in g.nvlinks if link.active) for g in facts.gpus), default=0)
        return [f"    bridge: {{kind: nvswitch, links: {per_gpu}{topo}}}"]
    if not linked:
        return [f"    bridge: {{kind: none{topo}}}  # review: no NVLink is active on this box"]
    degree = Counter(i for p in linked for i in (p.a, p.b))
    kind = "nvlink-bridge" if max(degree.values()) == 1 else "nvlink"
    pairs = ", ".join(f"[{p.a}, {p.b}]" for p in linked)
    counts = {p.nvlinks for p in linked}
    links = f", links: {counts.pop()}" if len(counts) == 1 else ""
    note = "" if links else "  # review: pairs have different link counts; the topology file pins each"
    return [f"    bridge: {{kind: {kind}, pairs: [{pairs}]{links}{topo}}}{note}"]


def driver_lines(facts: Facts) -> list[str]:
    version = facts.driver.version
    if not version:
        reason = facts.driver.message or "no driver version could be read"
        return [f"    # review: no driver section: {reason}"]
    os_name = facts.host.os.lower()
    method = "dnf" if any(d in os_name for d in ("red hat", "rocky", "alma", "centos", "fedora")) else "apt"
    fm = ", fabricmanager: true" if facts.nvswitch else ""
    return [
        f"    driver: {{version: {_q(version)}, method: {method}, hold: true, reboot: never{fm}}}",
        "    # review: reboot: never reports a needed reboot instead of rebooting; `allowed` reboots",
    ]


def health_lines(facts: Facts) -> list[str]:
    """The `health:` settings this box runs with where they are not the defaults (one value on every GPU),
    so the written rig plans clean; nothing when the box reports no health or uses the defaults."""
    gpus = facts.health.gpus if facts.health is not None else []

    def common(values: list[Any]) -> Any:
        return values[0] if values and None not in values and len(set(values)) == 1 else None

    found = {
        "ecc": common([g.ecc_mode for g in gpus]),
        "compute_mode": common([g.compute_mode for g in gpus]),
        "mig": common([g.mig for g in gpus]),
    }
    if any(g.power_limit_w != g.default_power_limit_w for g in gpus):
        found["power_limit_w"] = common([g.power_limit_w for g in gpus])
    defaults = {"compute_mode": "default", "mig": False, "ecc": None}
    keep = {k: v for k, v in found.items() if v is not None and v != defaults.get(k) and v != "unknown"}
    if not keep:
        return []
    words = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in keep.items())
    return [f"    health: {{{words}}}  # review: the settings this box runs with"]


def host_line(host_name: str, address: str, rig: str, connection: dict[str, str | int | None]) -> str:
    fields = [f"name: {host_name}", f"address: {_q(address)}", f"rig: {rig}"]
    fields += [
        f"{key}: {value if isinstance(value, int) else _q(value)}"
        for key, value in connection.items()
        if value is not None
    ]
    return "  - {" + ", ".join(fields) + "}"


def rig_from_facts(
    host_name: str,
    address: str,
    facts: Facts,
    topology_file: str | None = None,
    connection: dict[str, str | int | None] | None = None,
    schema_line: str | None = None,
    source: str | None = None,
) -> str:
    """Rig-file text describing the box `facts` were read from; valid as written.

    `connection` holds the host keys that reached the box (user, port, identity_file, python, connection,
    simulate), so the written file reaches it the same way; `source` is how init was told to reach it.
    A box without GPUs is refused: a rig file needs a GPU model, and a placeholder would validate.
    """
    if not facts.gpus:
        reason = facts.driver.message or "no NVIDIA driver answered"
        raise ProvisionError(
            f"NVML sees no GPU on {host_name}: {reason}. init describes a box whose GPUs work, so it "
            "wrote nothing: run it against such a box, or rehearse with --simulate TWIN"
        )
    rig = rig_name_for(facts)
    lines = [
        *([schema_line] if schema_line else []),
        f"# Written by `mgpu-provision init {source or '--from ' + host_name}` from the box as it is now.",
        "# Lines marked `review:` are guesses; check them before you apply this to other boxes.",
        "version: 1",
        "hosts:",
        host_line(host_name, address, rig, connection or {}),
        "  # review: add the other boxes that must match this one, each with `rig: " + rig + "`",
        "rigs:",
        f"  {rig}:",
    ]
    names = Counter(g.name for g in facts.gpus)
    model = names.most_common(1)[0][0]
    lines.append(f"    gpus: {{model: {_q(model)}, count: {len(facts.gpus)}}}")
    if len(names) > 1:
        lines.append("    # review: this box mixes GPU models; a rig wants one model on every GPU")
    lines += bridge_lines(facts, topology_file)
    lines.append(f"    visible_devices: {list(range(len(facts.gpus)))}")
    nproc = len(facts.gpus)
    lines += driver_lines(facts)
    lines += health_lines(facts)
    lines += [
        f"    ddp: {{master: {host_name}, port: 29500, backend: nccl, nproc_per_node: {nproc}}}",
        "    # review: the rendezvous master must be reachable from every node on the port",
    ]
    if facts.torch is not None and facts.torch.ok:
        lines.append(f"smoke: {{python: {facts.torch.python}, timeout_s: 180, batch_size: {max(8, nproc)}}}")
    else:
        lines.append(f"smoke: {{timeout_s: 180, batch_size: {max(8, nproc)}}}  # review: python with torch")
    lines += files_lines(facts)
    return "\n".join(lines) + "\n"
