"""The torch probe: which torch the node's training python has, and whether it sees the GPUs.

Importing torch costs seconds of CPU, so the probe remembers its last answer per interpreter on the node and
only imports torch again when something it depends on changed: the interpreter, where torch's `__init__.py`
lives and its mtime and size (an upgrade), the boot, the loaded NVIDIA driver, or the visible devices. The
cheap part (finding torch without importing it) runs in the same child as the import.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from typing import Any, Dict, List, Mapping, Optional

from ..core.system import read_text

# argv[1] is the key of the cached answer (its repr): when torch is still the same, say so instead of
# importing it. That is every plan's path on a box that did not change, so it does not even import json.
_TORCH_PROBE = """
import importlib.util, os, sys
try:
    origin = importlib.util.find_spec("torch").origin
    found = os.stat(origin)
    key = [os.path.realpath(sys.executable), origin, found.st_mtime_ns, found.st_size]
except Exception:
    key = None
if key is not None and repr(key) == sys.argv[1]:
    print('{"cached": true}')
    sys.exit()
import json
try:
    import torch
except ImportError as exc:
    print(json.dumps({"import_error": str(exc), "missing": getattr(exc, "name", None) == "torch"}))
else:
    import warnings
    with warnings.catch_warnings(record=True) as caught:  # why CUDA is unusable, e.g. a too-old driver
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    build = getattr(getattr(torch, "version", None), "cuda", None)  # None: a CPU-only wheel
    why = None if available or not caught else str(caught[-1].message).strip().splitlines()[0]
    print(json.dumps({"version": torch.__version__, "cuda_build": build, "cuda_available": available,
                      "cuda_warning": why, "device_count": torch.cuda.device_count(), "key": key}))
"""
_NODE_STATE = ("/proc/sys/kernel/random/boot_id", "/proc/driver/nvidia/version")


def torch_cache_file() -> str:
    """Where the torch probe keeps its answers: the agent's cache folder of whoever runs the agent."""
    return os.path.join(os.path.expanduser("~"), ".cache", "mgpu-provision", "torch-probe.json")


def _node_state(env: Mapping[str, str]) -> List[Optional[str]]:
    # What can change torch's CUDA answer without touching torch: a reboot, a driver (re)load, the devices,
    # and this probe itself (an agent whose probe reports more must not reuse an older agent's answer).
    state = [read_text(path) for path in _NODE_STATE]
    visible = [env.get("CUDA_VISIBLE_DEVICES"), env.get("NVIDIA_VISIBLE_DEVICES")]
    return [*state, *visible, hashlib.sha256(_TORCH_PROBE.encode()).hexdigest()[:16]]


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


def probe_torch(
    python: str,
    timeout_s: float = 120.0,
    cache_file: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Dict[str, Any]:
    """Ask `python` (in `env`, default the agent's) for its torch: version, CUDA build, whether CUDA is
    usable (and the warning that says why not), devices. Failures become a plain `error` and a `kind`
    (python-missing, python-broken, python-hung, torch-missing, torch-broken).

    A working torch's answer is cached in `cache_file` (default `torch_cache_file()`); failures never are,
    so a fixed install is seen at once.
    """
    path = cache_file or torch_cache_file()
    cache = _load_cache(path)
    found = cache.get(python)
    entry: Dict[str, Any] = found if isinstance(found, dict) else {}
    state = _node_state(os.environ if env is None else env)
    usable = entry.get("state") == state and isinstance(entry.get("answer"), dict)
    cached_key = repr(entry.get("key")) if usable else ""
    result: Dict[str, Any] = {"python": python, "ok": False}
    try:
        done = subprocess.run(
            [python, "-c", _TORCH_PROBE, cached_key],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=None if env is None else dict(env),
        )
    except FileNotFoundError:
        return dict(result, kind="python-missing", error=f"{python} does not exist")
    except PermissionError:
        return dict(result, kind="python-missing", error=f"{python} is not executable")
    except subprocess.TimeoutExpired:
        error = f"the torch probe in {python} did not finish within {timeout_s:g} s"
        return dict(result, kind="python-hung", error=error)
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return dict(result, kind="python-broken", error=f"the torch probe in {python} failed: {tail[0]}")
    if answer.get("missing"):
        return dict(result, kind="torch-missing", error=f"torch is not installed in {python}")
    if "import_error" in answer:
        error = f"import torch failed in {python}: {answer['import_error']}"
        return dict(result, kind="torch-broken", error=error)
    key = answer.pop("key", None)
    if answer.pop("cached", False):
        answer = entry["answer"]
    elif key is not None:
        cache[python] = {"key": key, "state": state, "answer": answer}
        _save_cache(path, cache)
    return dict(result, ok=True, **answer)
