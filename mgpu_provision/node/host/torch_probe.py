"""The torch probe: which torch the node's training python has, and whether it sees the GPUs.

Importing torch costs seconds of CPU, so the probe remembers its last answer per interpreter on the node and
only imports torch again when something it depends on changed: the interpreter, where torch's `__init__.py`
lives and its mtime and size (an upgrade), the boot, the loaded NVIDIA driver, or the visible devices. The
cheap part (finding torch without importing it) runs in the same child as the import.

Even that child is a second interpreter start per facts call (most of the agent's CPU, issue 32), so the
answer also records what decides which torch that python imports: the interpreter file (a real binary,
its mtime and size), the variables that move its import path, every folder of that path and the site
folders that could join it (their mtimes: pip adding, removing or replacing `torch/` or a `.pth` file
changes them), the `.pth` files there, and torch's `__init__.py`. While none of that changed, the answer
is reused without starting the python at all; anything else (a wrapper script such as a pyenv shim, a
folder that cannot be read) takes the child.
"""

from __future__ import annotations

import json
import os

from ...typing_lite import TYPE_CHECKING
from ..core.digest import sha256_hex
from ..core.system import read_text

if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional

# argv[1] is the key of the cached answer (its repr): when torch is still the same, say so instead of
# importing it, that is when something beside torch changed (a package installed), so it does not even
# import json: where it looked comes first as `mgpu-where KIND PATH` lines (E the interpreter, P its import
# path, S its site folders), then the one-line answer.
_TORCH_PROBE = """
import importlib.util, os, site, sys
try:
    origin = importlib.util.find_spec("torch").origin
    found = os.stat(origin)
    key = [os.path.realpath(sys.executable), origin, found.st_mtime_ns, found.st_size]
except Exception:
    key = None
try:  # what the agent checks later without this python: its import path and the site folders
    sites = list(site.getsitepackages()) + [site.getusersitepackages()]
except Exception:
    sites = []
where = {"executable": [os.path.realpath(sys.executable)], "path": sys.path, "sites": sites}
if not any("\\n" in p for paths in where.values() for p in paths):
    for kind, paths in where.items():
        for p in paths:
            print("mgpu-where", kind[0].upper(), p)
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
_WHERE = "mgpu-where "
_WHERE_KINDS = {"E": "executable", "P": "path", "S": "sites"}
_NODE_STATE = ("/proc/sys/kernel/random/boot_id", "/proc/driver/nvidia/version")


def torch_cache_file() -> str:
    """Where the torch probe keeps its answers: the agent's cache folder of whoever runs the agent."""
    return os.path.join(os.path.expanduser("~"), ".cache", "mgpu-provision", "torch-probe.json")


def _node_state(env: Mapping[str, str]) -> List[Optional[str]]:
    # What can change torch's CUDA answer without touching torch: a reboot, a driver (re)load, the devices,
    # and this probe itself (an agent whose probe reports more must not reuse an older agent's answer).
    state = [read_text(path) for path in _NODE_STATE]
    visible = [env.get("CUDA_VISIBLE_DEVICES"), env.get("NVIDIA_VISIBLE_DEVICES")]
    return [*state, *visible, sha256_hex(_TORCH_PROBE.encode())[:16]]


# What moves the import path of the probed python, or torch's CUDA libraries, besides its files.
_PATH_VARIABLES = (
    "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH", "LD_LIBRARY_PATH",
)  # fmt: skip


def _mtime(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _on_path(python: str, env: Mapping[str, str]) -> Optional[str]:
    """The file `python` names, looked up in PATH as the child's start would (shutil stays unimported)."""
    if os.sep in python:
        return python
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", python)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _pth_files(folder: str) -> List[Any]:
    try:
        with os.scandir(folder) as entries:
            return sorted([e.name, e.stat().st_mtime_ns] for e in entries if e.name.endswith(".pth"))
    except OSError:
        return []


def fingerprint(python: str, env: Mapping[str, str], where: Mapping[str, Any]) -> Optional[List[Any]]:
    """What decides which torch `python` imports, as far as it can be seen without starting it; None when
    it cannot be (the file is a wrapper script, or the last probe did not say where it looked).

    `where` is the probe's own report: the interpreter's real path, its import path, its site folders.
    """
    found = _on_path(python, env)
    paths, sites = where.get("path"), where.get("sites")
    if found is None or not isinstance(paths, list) or not isinstance(sites, list):
        return None
    real = os.path.realpath(found)
    if [real] != where.get("executable"):
        return None  # a wrapper (pyenv's shim, a script) may pick another python each time
    try:
        with open(real, "rb") as handle:
            if handle.read(4) != b"\x7fELF":
                return None
        binary = os.stat(real)
    except OSError:
        return None
    folders = [str(p) or os.getcwd() for p in paths + sites]  # "": the folder python -c starts in
    venv = [os.path.join(os.path.dirname(os.path.dirname(found)), "pyvenv.cfg")]
    return [
        real, binary.st_mtime_ns, binary.st_size,
        [env.get(name) for name in _PATH_VARIABLES],
        [[folder, _mtime(folder), _pth_files(folder)] for folder in folders + venv],
    ]  # fmt: skip


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
    environment = os.environ if env is None else env
    state = _node_state(environment)
    usable = entry.get("state") == state and isinstance(entry.get("answer"), dict)
    result: Dict[str, Any] = {"python": python, "ok": False}
    where = entry.get("where")
    if usable and isinstance(where, dict) and _unchanged(entry, python, environment, where):
        return dict(result, ok=True, **entry["answer"])
    cached_key = repr(entry.get("key")) if usable else ""
    import subprocess  # only now: the answer above needs no second python

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
    where = _where(lines)
    if answer.pop("cached", False):
        answer = entry["answer"]
        key = entry["key"]
    if key is not None:
        found = fingerprint(python, environment, where) if where else None
        cache[python] = {"key": key, "state": state, "answer": answer, "where": where, "fingerprint": found}
        _save_cache(path, cache)
    return dict(result, ok=True, **answer)


def _where(lines: List[str]) -> Optional[Dict[str, List[str]]]:
    """Where the probed python looked for torch, from its `mgpu-where` lines; None when it did not say."""
    where: Dict[str, List[str]] = {name: [] for name in _WHERE_KINDS.values()}
    for line in lines:
        if line.startswith(_WHERE) and line[len(_WHERE) : len(_WHERE) + 2] in ("E ", "P ", "S "):
            where[_WHERE_KINDS[line[len(_WHERE)]]].append(line[len(_WHERE) + 2 :])
    return where if len(where["executable"]) == 1 else None


def _unchanged(
    entry: Mapping[str, Any], python: str, env: Mapping[str, str], where: Mapping[str, Any]
) -> bool:
    """The cached answer still holds without asking the python: nothing that picks its torch changed, and
    torch's own `__init__.py` is the one probed (mtime and size, as the probe's key has them)."""
    now = fingerprint(python, env, where)
    key = entry.get("key")
    if now is None or now != entry.get("fingerprint") or not isinstance(key, list) or len(key) != 4:
        return False
    try:
        found = os.stat(key[1])
    except (OSError, TypeError):
        return False
    return [found.st_mtime_ns, found.st_size] == key[2:]
