"""Build the node agent zipapp: all of `node/`, the protocol, the judge, the catalog and the installed
`pynvml.py`.

The bytes are deterministic (sorted entries, fixed timestamps and permissions), so the content hash in the
name changes only when the code does: a host that already has `agent-<hash>.pyz` never gets it again.
Compressing them costs more than a small fleet's whole plan, so the built zipapp is kept in this machine's
cache (`~/.cache/mgpu-provision/bundles/<hash of the sources>.pyz`) and reused while the sources are the same.
Reading and hashing the ~1 MB of sources to name that file was itself ~5 ms of every SSH run, so the name is
also kept under a stamp of the sources' paths, sizes and modification times (what Python's bytecode cache
trusts): an unchanged install finds its zipapp with one stat per file, and an edited one builds again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
from pathlib import Path

from ..control_cache import control_cache_dir
from ..typing_lite import NamedTuple

PACKAGE_DIR = Path(__file__).resolve().parent.parent
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_MAIN = b"import runpy\nrunpy.run_module('mgpu_provision.node', run_name='__main__', alter_sys=True)\n"
# What a node runs: the package marker (it carries the version), the protocol, and these packages whole:
# the node's code, the judge it holds itself to and the catalog of tables and parsers it shares with the plan.
_SHIPPED = ("__init__.py", "protocol.py", "typing_lite.py")
_SHIPPED_PACKAGES = ("node", "judge", "catalog")


class AgentBundle(NamedTuple):
    data: bytes
    digest: str
    name: str


def agent_files() -> dict[str, bytes]:
    """Archive name -> content of every file the agent needs on a node."""
    files = {name: Path(path).read_bytes() for name, path in _agent_sources()}
    files["__main__.py"] = _MAIN
    return files


def _agent_sources() -> list[tuple[str, str]]:
    """(archive name, file path) of every file the agent ships but its generated `__main__.py`, sorted by
    name (os.walk and strings: pathlib's rglob took ~2 ms for these 80 files)."""
    root = str(PACKAGE_DIR)
    sources = [(f"mgpu_provision/{rel}", os.path.join(root, rel)) for rel in _SHIPPED]
    for package in _SHIPPED_PACKAGES:
        for folder, _, names in os.walk(os.path.join(root, package)):
            inside = os.path.relpath(folder, root).replace(os.sep, "/")
            sources += [
                (f"mgpu_provision/{inside}/{n}", os.path.join(folder, n)) for n in names if n.endswith(".py")
            ]
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise RuntimeError("nvidia-ml-py is not installed: the agent bundles its pynvml.py")
    sources.append(("pynvml.py", spec.origin))
    return sorted(sources)


def _stamp(sources: list[tuple[str, str]]) -> str:
    """The sources' names, paths, sizes and modification times, and this module's (it writes the archive)."""
    stamp = hashlib.sha256()
    for name, path in [*sources, ("", __file__)]:
        found = os.stat(path)
        stamp.update(f"{name}\0{path}\0{found.st_size}\0{found.st_mtime_ns}\n".encode())
    return stamp.hexdigest()


def bundle_cache_dir() -> Path:
    """Where built zipapps are kept on the control machine (XDG_CACHE_HOME is honoured)."""
    return control_cache_dir() / "bundles"


def _zip(files: dict[str, bytes]) -> bytes:
    import io  # only when the cache has no zipapp for these sources
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, content, compresslevel=9)
    return buffer.getvalue()


def _sources_key(files: dict[str, bytes]) -> str:
    sources = hashlib.sha256()
    for name, content in sorted(files.items()):
        sources.update(hashlib.sha256(name.encode()).digest() + hashlib.sha256(content).digest())
    return sources.hexdigest()


def build_agent(cache_dir: Path | None = None) -> AgentBundle:
    """The agent zipapp, reused from the cache while the sources are unchanged (a broken cache is skipped).

    Without `cache_dir` it is this process's agent, read and hashed once (~50 source files, 3-4 ms): apply
    asks for it again for every `--serial` batch, smoke for its clean-up, and the sources do not change
    during a run.
    """
    if cache_dir is None:
        return _this_process_agent()
    return _build(cache_dir)


@functools.cache
def _this_process_agent() -> AgentBundle:
    return _build(bundle_cache_dir())


def _build(cache_dir: Path) -> AgentBundle:
    sources = _agent_sources()
    stamped = cache_dir / f"{_stamp(sources)}.sources"  # holds the sources' key, the zipapp's name
    try:
        key = stamped.read_text(encoding="ascii")
        data = (cache_dir / f"{key}.pyz").read_bytes() if key.isalnum() else None
    except (OSError, UnicodeDecodeError):
        data = None
    if data is None:
        files = {name: Path(path).read_bytes() for name, path in sources}
        files["__main__.py"] = _MAIN
        key = _sources_key(files)
        cached = cache_dir / f"{key}.pyz"
        try:
            data = cached.read_bytes()
        except OSError:
            data = _zip(files)
            _write(cached, data)
        _write(stamped, key.encode("ascii"))
    digest = hashlib.sha256(data).hexdigest()
    return AgentBundle(data=data, digest=digest, name=f"agent-{digest[:16]}.pyz")


def _write(path: Path, data: bytes) -> None:
    """`data` as `path`, whole or not at all (by way of a partial file); an unwritable cache is skipped."""
    partial = path.with_name(f".{path.name}.{os.urandom(16).hex()}.partial")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial.write_bytes(data)
        partial.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
