"""Facts read from the node's own files and programs: managed files, the X config's SLI option, torch.

None of these depend on the NVIDIA layer, so they are the same on real and simulated nodes.

Importing torch costs seconds of CPU, so the torch probe remembers its last answer per interpreter on the
node and only imports torch again when something it depends on changed: the interpreter, where torch's
`__init__.py` lives and its mtime and size (an upgrade), the boot, the loaded NVIDIA driver, or the
visible devices. The cheap part (finding torch without importing it) runs in the same child as the import.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
from typing import Any, Dict, List, Optional, Sequence

from .system import read_text

MAX_CONTENT_BYTES = 64 * 1024
_SLI_OPTION = re.compile(r'^\s*Option\s+"SLI"\s+"([^"]*)"', re.IGNORECASE)
# argv[1] is the key of the cached answer: when torch is still the same, say so instead of importing it.
_TORCH_PROBE = """
import importlib.util, json, os, sys
try:
    origin = importlib.util.find_spec("torch").origin
    found = os.stat(origin)
    key = [os.path.realpath(sys.executable), origin, found.st_mtime_ns, found.st_size]
except Exception:
    key = None
if key is not None and json.dumps(key) == sys.argv[1]:
    print(json.dumps({"key": key, "cached": True}))
    sys.exit()
try:
    import torch
except ImportError as exc:
    print(json.dumps({"import_error": str(exc), "missing": getattr(exc, "name", None) == "torch"}))
else:
    print(json.dumps({"version": torch.__version__, "cuda_available": torch.cuda.is_available(),
                      "device_count": torch.cuda.device_count(), "key": key}))
"""
_NODE_STATE = ("/proc/sys/kernel/random/boot_id", "/proc/driver/nvidia/version")


def describe_file(path: str, include_content: bool) -> Dict[str, Any]:
    """A managed file's state; its text only on request, when small and valid UTF-8 (for a diff)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
            mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
    except FileNotFoundError:
        return {"path": path, "exists": False}
    except OSError:  # a folder, or unreadable even to root (e.g. on a read-only network mount)
        return {"path": path, "exists": True}
    content: Optional[str] = None
    if include_content and len(data) < MAX_CONTENT_BYTES:
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError:
            content = None
    return {
        "path": path,
        "exists": True,
        "sha256": hashlib.sha256(data).hexdigest(),
        "mode": f"{mode:04o}",
        "content": content,
    }


def _config_files(paths: Sequence[str]) -> List[str]:
    files: List[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".conf"))
        elif os.path.isfile(path):
            files.append(path)
    return files


def read_sli(paths: Sequence[str]) -> Dict[str, Optional[str]]:
    """The first `Option "SLI"` in the given X config files (folders: their `*.conf`, in name order)."""
    for path in _config_files(paths):
        for line in (read_text(path) or "").splitlines():
            match = _SLI_OPTION.match(line.split("#", 1)[0])
            if match:
                return {"mode": match.group(1), "file": path}
    return {"mode": None, "file": None}


def torch_cache_file() -> str:
    """Where the torch probe keeps its answers: the agent's cache folder of whoever runs the agent."""
    return os.path.join(os.path.expanduser("~"), ".cache", "mgpu-provision", "torch-probe.json")


def _node_state() -> List[Optional[str]]:
    # What can change torch's CUDA answer without touching torch: a reboot, a driver (re)load, the devices.
    state = [read_text(path) for path in _NODE_STATE]
    return [*state, os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("NVIDIA_VISIBLE_DEVICES")]


def _load_cache(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            cache = json.load(handle)
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _save_cache(path: str, cache: Dict[str, Any]) -> None:
    """Write atomically; a cache that cannot be written (read-only home) only costs the next probe."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(cache, handle)
        os.replace(partial, path)
    except OSError:
        pass


def probe_torch(python: str, timeout_s: float = 120.0, cache_file: Optional[str] = None) -> Dict[str, Any]:
    """Ask `python` for its torch (version, CUDA, devices); failures become a plain `error`.

    A working torch's answer is cached in `cache_file` (default `torch_cache_file()`); failures never are,
    so a fixed install is seen at once.
    """
    path = cache_file or torch_cache_file()
    cache = _load_cache(path)
    found = cache.get(python)
    entry: Dict[str, Any] = found if isinstance(found, dict) else {}
    state = _node_state()
    usable = entry.get("state") == state and isinstance(entry.get("answer"), dict)
    cached_key = json.dumps(entry.get("key")) if usable else ""
    result: Dict[str, Any] = {"python": python, "ok": False}
    try:
        done = subprocess.run(
            [python, "-c", _TORCH_PROBE, cached_key],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        return dict(result, error=f"{python} does not exist on this host")
    except PermissionError:
        return dict(result, error=f"{python} is not executable")
    except subprocess.TimeoutExpired:
        return dict(result, error=f"the torch probe in {python} did not finish within {timeout_s:g} s")
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return dict(result, error=f"the torch probe in {python} failed: {tail[0]}")
    if answer.get("missing"):
        return dict(result, error=f"torch is not installed in {python}")
    if "import_error" in answer:
        return dict(result, error=f"import torch failed in {python}: {answer['import_error']}")
    key = answer.pop("key", None)
    if answer.pop("cached", False):
        answer = entry["answer"]
    elif key is not None:
        cache[python] = {"key": key, "state": state, "answer": answer}
        _save_cache(path, cache)
    return dict(result, ok=True, **answer)
