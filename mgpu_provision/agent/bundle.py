"""Build the node agent zipapp (control side): the node-side modules plus the installed `pynvml.py`.

The bytes are deterministic (sorted entries, fixed timestamps and permissions), so the content hash in the
name changes only when the code does: a host that already has `agent-<hash>.pyz` never gets it again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_MAIN = b"import runpy\nrunpy.run_module('mgpu_provision.agent', run_name='__main__', alter_sys=True)\n"
# Node-side modules beside the agent package; the optional ones belong to other parts and ship when present.
_REQUIRED = ("__init__.py", "topology.py")
_OPTIONAL = ("smoke/__init__.py", "smoke/program.py", "smoke/node.py")
_CONTROL_ONLY = ("bundle.py",)


@dataclass(frozen=True)
class AgentBundle:
    data: bytes
    digest: str
    name: str


def agent_files() -> dict[str, bytes]:
    """Archive name -> content of every file the agent needs on a node."""
    files = {f"mgpu_provision/{rel}": (PACKAGE_DIR / rel).read_bytes() for rel in _REQUIRED}
    present = [rel for rel in _OPTIONAL if (PACKAGE_DIR / rel).exists()]
    files.update({f"mgpu_provision/{rel}": (PACKAGE_DIR / rel).read_bytes() for rel in present})
    for path in sorted((PACKAGE_DIR / "agent").glob("*.py")):
        if path.name not in _CONTROL_ONLY:
            files[f"mgpu_provision/agent/{path.name}"] = path.read_bytes()
    files["pynvml.py"] = _pynvml_source()
    files["__main__.py"] = _MAIN
    return files


def _pynvml_source() -> bytes:
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise RuntimeError("nvidia-ml-py is not installed: the agent bundles its pynvml.py")
    return Path(spec.origin).read_bytes()


def build_agent() -> AgentBundle:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in sorted(agent_files().items()):
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, content, compresslevel=9)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    return AgentBundle(data=data, digest=digest, name=f"agent-{digest[:16]}.pyz")
