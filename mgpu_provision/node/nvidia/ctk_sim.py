"""A simulated node's `nvidia-ctk`: the CDI spec and runtime configs the real one writes, from the twin.

nvidia-ctk cannot be installed here, so a simulated node writes what it would: the spec follows
NVIDIA/nvidia-container-toolkit `cmd/nvidia-ctk/cdi/generate/generate_test.go` ("default": cdiVersion
0.5.0, kind nvidia.com/gpu, one device per GPU under each default naming strategy — index and uuid, the
default of `--device-name-strategy` in generate.go — and `all`; the control nodes, the driver's versioned
libraries and the nvidia-cdi-hook hooks common to all), with every host path under `--driver-root`
(pkg/nvcdi). Like the real one it needs NVML: before the reboot that loads a new driver it fails. The runtime
configs are what `nvidia-ctk runtime configure` writes (pkg/config/engine/docker: runtimes.nvidia in
daemon.json, indented by four spaces; containerd's and CRI-O's drop-ins, as configure_test.go checks them).
These are real files on the node: only their author is simulated.
"""

from __future__ import annotations

import json
import os

from ...typing_lite import TYPE_CHECKING
from ..core.atomic import atomic_write
from ..core.errors import AgentFailure

if TYPE_CHECKING:
    from typing import Any, Dict, List, Tuple

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
# The driver's libraries a spec mounts, at the driver's version (a small part of the real list).
LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"
DOCKER_CONFIG = "/etc/docker/daemon.json"
DROP_INS = {
    "containerd": (
        "/etc/containerd/conf.d/99-nvidia.toml",
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n\n'
        '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        '    BinaryName = "{}"\n'.format(RUNTIME_BINARY),
    ),
    "cri-o": (
        "/etc/crio/crio.conf.d/99-nvidia.toml",
        '[crio.runtime.runtimes.nvidia]\nruntime_path = "{}"\nruntime_type = "oci"\n'.format(RUNTIME_BINARY),
    ),
}


def _under(root: str, path: str) -> str:
    return path if root in ("", "/") else root.rstrip("/") + path


def spec(version: str, gpus: List[Tuple[int, str, int]], driver_root: str, hook_path: str) -> Dict[str, Any]:
    """The spec for the driver `version` and `gpus` ((index, uuid, minor) each)."""

    def node(path: str) -> Dict[str, str]:
        return {"path": path, "hostPath": _under(driver_root, path)}

    devices = [{"name": str(index), "containerEdits": {"deviceNodes": [node("/dev/nvidia{}".format(minor))]}}
               for index, _, minor in gpus]  # fmt: skip
    devices += [{"name": uuid, "containerEdits": {"deviceNodes": [node("/dev/nvidia{}".format(minor))]}}
                for _, uuid, minor in gpus]  # fmt: skip
    every = [node("/dev/nvidia{}".format(minor)) for _, _, minor in gpus]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})

    def hook(*args: str) -> Dict[str, Any]:
        return {"hookName": "createContainer", "path": hook_path, "args": ["nvidia-cdi-hook", *args],
                "env": ["NVIDIA_CTK_DEBUG=false"]}  # fmt: skip

    mounts = []
    for library in LIBRARIES:
        path = "{}/{}.{}".format(LIB_DIR, library, version)
        mounts.append({"hostPath": _under(driver_root, path), "containerPath": path,
                       "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]})  # fmt: skip
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_CTK_LIBCUDA_DIR={}".format(LIB_DIR), "NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node(path) for path in CONTROL_NODES],
            "hooks": [
                hook("create-symlinks", "--link", "libcuda.so.1::{}/libcuda.so".format(LIB_DIR)),
                hook("update-ldcache", "--folder", LIB_DIR),
            ],
            "mounts": mounts,
        },
    }


def to_yaml(value: Any, indent: int = 0) -> str:
    """YAML as nvidia-ctk writes it (4-space blocks); every string double-quoted, which any reader takes."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append("{}{}:\n{}".format(pad, key, to_yaml(item, indent + 4)))
            else:
                lines.append("{}{}: {}".format(pad, key, _scalar(item)))
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, dict) and item:
                text = to_yaml(item, indent + 2)
                lines.append("{}- {}".format(pad, text[indent + 2 :]))
            else:
                lines.append("{}- {}".format(pad, _scalar(item)))
        return "\n".join(lines)
    return pad + _scalar(value)


def _scalar(value: Any) -> str:
    if value == [] or value == {}:
        return "[]" if value == [] else "{}"
    return json.dumps(value)


def write_spec(output: str, data: Dict[str, Any]) -> Tuple[bool, str]:
    """Write the spec atomically, unless the file already holds exactly this text."""
    text = json.dumps(data, indent=4) + "\n" if output.endswith(".json") else "---\n" + to_yaml(data) + "\n"
    try:
        with open(output, encoding="utf-8") as handle:
            if handle.read() == text:
                return False, "{} is up to date".format(output)
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    os.makedirs(os.path.dirname(output), exist_ok=True)
    atomic_write(output, text.encode("utf-8"), 0o644)
    return True, "generated {} (simulated nvidia-ctk cdi generate)".format(output)


def configure_runtime(runtime: str) -> Tuple[bool, str]:
    """The nvidia runtime in `runtime`'s config; an unreadable config is refused, as nvidia-ctk's "unable
    to load config" is, and left as it was."""
    if runtime in DROP_INS:
        path, text = DROP_INS[runtime]
        try:
            with open(path, encoding="utf-8") as handle:
                if handle.read() == text:
                    return False, "{} already has the nvidia runtime".format(path)
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, text.encode("utf-8"), 0o644)
        return True, "wrote {}; restart {} to load it".format(path, runtime)
    try:
        with open(DOCKER_CONFIG, encoding="utf-8") as handle:
            config = json.loads(handle.read() or "{}")
    except FileNotFoundError:
        config = {}
    except ValueError as exc:
        message = "unable to load config {}: {}; nothing was changed".format(DOCKER_CONFIG, exc)
        raise AgentFailure("runtime", message) from None
    if not isinstance(config, dict):
        raise AgentFailure("runtime", "{} is not a JSON object; nothing was changed".format(DOCKER_CONFIG))
    wanted = {"args": [], "path": "nvidia-container-runtime"}
    if (config.get("runtimes") or {}).get("nvidia") == wanted:
        return False, "{} already has the nvidia runtime".format(DOCKER_CONFIG)
    config.setdefault("runtimes", {})["nvidia"] = wanted
    os.makedirs(os.path.dirname(DOCKER_CONFIG), exist_ok=True)
    atomic_write(DOCKER_CONFIG, (json.dumps(config, indent=4) + "\n").encode("utf-8"), 0o644)
    return True, "added the nvidia runtime to {}; restart docker to load it".format(DOCKER_CONFIG)
