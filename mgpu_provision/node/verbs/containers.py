"""The facts verb's containers part: the node's CDI specs and container runtimes, what a container asking for
a GPU would be given.

A CDI spec (cncf-tags/container-device-interface SPEC.md) is a YAML or JSON file in `/etc/cdi` or
`/var/run/cdi` that names a `kind` (vendor/class), its devices and, per device and for all of them, the
device nodes, mounts and hooks a runtime adds to the container. After a driver upgrade, a MIG change or a
module reload the spec still names the old libraries and nodes (NVIDIA/nvidia-container-toolkit issues #856,
#1828), so every path a spec names is looked at here; judging it is judge/containers.py's.

The runtime configs are read the way `nvidia-ctk runtime configure` writes them (its
cmd/nvidia-ctk/runtime/configure/configure.go: docker's /etc/docker/daemon.json, containerd's and CRI-O's
drop-ins 99-nvidia.toml under conf.d). podman has no runtime config: it reads the CDI specs itself.

Shipped to nodes: standard library only, Python 3.8. A spec that cannot be read is a fact (its `error`),
never an error of the verb.
"""

from __future__ import annotations

import json
import os
import shutil

from ...typing_lite import TYPE_CHECKING
from ..nvidia.miniyaml import MiniYamlError, loads

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

# Where podman, containerd and CRI-O look (SPEC.md "CDI file location"); /var/run/cdi wins on a conflict.
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
# The toolkit's refresh service is started by this path unit (deployments/systemd/nvidia-cdi-refresh.path).
REFRESH_UNIT = "nvidia-cdi-refresh.path"
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
MAX_SPEC_BYTES = 4 * 1024 * 1024

# runtime -> (binary that shows it is installed, config files nvidia-ctk writes, the text that says the
# nvidia runtime is in them). podman: no config, CDI only.
RUNTIMES: Dict[str, Tuple[str, Tuple[str, ...], Optional[str]]] = {
    "docker": ("dockerd", ("/etc/docker/daemon.json",), None),
    "containerd": (
        "containerd",
        ("/etc/containerd/conf.d/99-nvidia.toml", "/etc/containerd/config.toml"),
        ".runtimes.nvidia]",
    ),
    "cri-o": ("crio", ("/etc/crio/crio.conf.d/99-nvidia.toml", "/etc/crio/crio.conf"), "runtimes.nvidia]"),
    "podman": ("podman", (), None),
}
RUNTIME_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def parse_spec(text: str, path: str) -> Dict[str, Any]:
    """One spec file's record: kind, cdiVersion, device names and every path it names; `error` when the
    text is not a CDI spec (not YAML/JSON, no kind, devices that are not a list)."""
    record: Dict[str, Any] = {"path": path, "kind": None, "cdi_version": None, "devices": [], "paths": []}
    try:
        data = json.loads(text) if path.endswith(".json") else loads(_without_document_start(text))
    except (ValueError, MiniYamlError) as exc:
        what = "JSON" if path.endswith(".json") else "YAML"
        return dict(record, error="not valid {}: {}".format(what, exc))
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return dict(record, error="not a CDI spec: no `kind` (vendor.com/class)")
    kind = data["kind"]
    record.update(kind=kind, cdi_version=None if data.get("cdiVersion") is None else str(data["cdiVersion"]))
    if "/" not in kind:
        return dict(record, error="`kind` {!r} is not vendor.com/class".format(kind))
    devices = data.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, dict) and d.get("name") for d in devices):
        return dict(record, error="`devices` must be a list of devices, each with a `name`")
    edits = [data.get("containerEdits")] + [d.get("containerEdits") for d in devices]
    paths: List[Tuple[str, str]] = []
    for edit in edits:
        if edit is not None and not isinstance(edit, dict):
            return dict(record, error="`containerEdits` must be a mapping")
        paths += _edit_paths(edit or {})
    record["devices"] = [str(d["name"]) for d in devices]
    record["paths"] = [{"role": role, "path": p} for role, p in dict.fromkeys(paths)]
    return dict(record, error=None)


def _without_document_start(text: str) -> str:
    # nvidia-ctk's YAML starts with `---`, the one document marker the agent's reader does not take.
    lines = text.split("\n")
    return "\n".join(lines[1:]) if lines and lines[0].strip() == "---" else text


def _edit_paths(edit: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(role, host path) of one containerEdits: device nodes (hostPath, else path), mounts, hooks."""
    found: List[Tuple[str, str]] = []
    for role, key, field in (("device", "deviceNodes", "hostPath"), ("mount", "mounts", "hostPath")):
        for entry in edit.get(key) or ():
            if isinstance(entry, dict):
                where = entry.get(field) or (entry.get("path") if role == "device" else None)
                if isinstance(where, str):
                    found.append((role, where))
    for hook in edit.get("hooks") or ():
        if isinstance(hook, dict) and isinstance(hook.get("path"), str):
            found.append(("hook", hook["path"]))
    return found


def read_specs(dirs: Optional[Tuple[str, ...]] = None) -> List[Dict[str, Any]]:
    """Every spec file in `dirs` (SPEC_DIRS; in that order, names sorted), each path marked present or
    missing."""
    specs = []
    for folder in dirs or SPEC_DIRS:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(SPEC_SUFFIXES) and os.path.isfile(path):
                specs.append(read_spec(path))
    return specs


def read_spec(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        return dict(parse_spec("", path), error="unreadable: {}".format(exc.strerror))
    if len(data) > MAX_SPEC_BYTES:
        return dict(parse_spec("", path), error="larger than {} bytes".format(MAX_SPEC_BYTES))
    try:
        record = parse_spec(data.decode("utf-8"), path)
    except UnicodeDecodeError:
        return dict(parse_spec("", path), error="not UTF-8 text")
    for entry in record["paths"]:
        entry["exists"] = os.path.lexists(entry["path"])
    return record


def read_runtimes(names: List[str]) -> Dict[str, Dict[str, Any]]:
    """Per runtime asked about: installed (its binary on the standard PATH), the config that holds the
    nvidia runtime, configured (None for podman, which has none), and why a config could not be read."""
    found = {}
    for name in names:
        binary, configs, marker = RUNTIMES[name]
        installed = shutil.which(binary, path=RUNTIME_PATH) is not None
        entry: Dict[str, Any] = {"installed": installed, "config": None, "configured": None, "error": None}
        if configs:
            entry["configured"] = False
            for config in configs:
                holds, error = _holds_nvidia(config, marker)
                if error is not None:
                    entry["error"] = error
                if holds:
                    entry.update(config=config, configured=True)
                    break
        found[name] = entry
    return found


def _holds_nvidia(path: str, marker: Optional[str]) -> Tuple[bool, Optional[str]]:
    """Whether the config at `path` names the nvidia runtime; (False, why) when it is there but unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(MAX_SPEC_BYTES)
    except FileNotFoundError:
        return False, None
    except (OSError, UnicodeDecodeError) as exc:
        return False, "{}: {}".format(path, getattr(exc, "strerror", None) or exc)
    if marker is not None:
        return marker in text, None
    try:
        data = json.loads(text)  # docker: {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}
    except ValueError as exc:
        return False, "{} is not valid JSON: {}".format(path, exc)
    runtimes = data.get("runtimes") if isinstance(data, dict) else None
    return isinstance(runtimes, dict) and "nvidia" in runtimes, None
