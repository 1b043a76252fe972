"""Facts read from the node's own files and programs: managed files, the X config's SLI option, torch.

None of these depend on the NVIDIA layer, so they are the same on real and simulated nodes.
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
_TORCH_PROBE = """
import json
try:
    import torch
except ImportError as exc:
    print(json.dumps({"import_error": str(exc), "missing": getattr(exc, "name", None) == "torch"}))
else:
    print(json.dumps({"version": torch.__version__, "cuda_available": torch.cuda.is_available(),
                      "device_count": torch.cuda.device_count()}))
"""


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


def probe_torch(python: str, timeout_s: float = 120.0) -> Dict[str, Any]:
    """Ask `python` for its torch (version, CUDA, devices); failures become a plain `error`."""
    result: Dict[str, Any] = {"python": python, "ok": False}
    try:
        done = subprocess.run(
            [python, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=timeout_s, check=False
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
    return dict(result, ok=True, **answer)
