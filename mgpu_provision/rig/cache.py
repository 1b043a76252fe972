"""A rig file that loaded once loads again from the control machine's cache, until anything it depends on
changes.

Loading a rig file costs most of a small command's start-up (issue 32): the YAML parser, the loader, the
rules and every model's validation. The answer depends only on the file's bytes, the topology files it
names, how its paths resolve (the path as given, the working directory, HOME) and the code that loads it,
so a valid rig is kept pickled under the XDG cache with all of that as its key and checked on every run:
a changed byte in the rig file or a topology file, a moved HOME or an edited loader (any file of
`mgpu_provision/rig/`, the catalog's tables and topology parser, the package or pydantic version) is a miss
and loads afresh; an edited installer of the agent is not (the rig imports no node module).
A rig that takes hosts from an Ansible inventory is never cached (inventories are folders, variable files
and plugins: no short key covers them), nor is a file with problems (they are reported on every run).
A cache that cannot be read or written costs only the next load.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pickle
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import __version__
from ..control_cache import control_cache_dir
from ..typing_lite import NamedTuple

if TYPE_CHECKING:
    from .rig import LoadedRig

# Bump when what an entry holds changes shape (3: plain records, rig/plain.py, instead of pydantic models).
_FORMAT = 3
_KEEP_S = 30 * 24 * 3600
_PACKAGE = Path(__file__).resolve().parent.parent
# The code whose output is cached: the rig package (models, loader, rules, messages) and every module it
# loads from elsewhere (the judge's defaults, the catalog's package names and topology parser, the error type,
# the protocol, the plain records it ends in); tests/unit/test_rig_cache.py checks that loading a rig imports
# nothing outside these.
_CODE_FOLDERS = ("rig", "judge", "catalog")
_CODE = ("__init__.py", "errors.py", "protocol.py", "records.py", "typing_lite.py")


class Checked(NamedTuple):
    """What `validate` says of a valid rig file: known without unpickling (and so without pydantic)."""

    host_rigs: tuple[tuple[str, str], ...]  # each host's name and rig type, in file order
    rigs: int


def _checked(loaded: LoadedRig) -> Checked:
    return Checked(tuple((h.name, h.rig) for h in loaded.spec.hosts), len(loaded.spec.rigs))


def rig_cache_dir() -> Path:
    """Where loaded rigs are kept."""
    return control_cache_dir() / "rigs"


def _pydantic_version_file() -> Path | None:
    """pydantic's version.py, found without importing pydantic (what `validate` answers without)."""
    spec = importlib.util.find_spec("pydantic")
    origin = spec.origin if spec is not None else None
    return Path(origin).with_name("version.py") if origin else None


def code_files() -> list[Path]:
    """The source files whose change must make every entry a miss."""
    folders = (sorted((_PACKAGE / folder).glob("*.py")) for folder in _CODE_FOLDERS)
    return [path for found in folders for path in found] + [_PACKAGE / name for name in _CODE]


def _code_fingerprint() -> list[object]:
    # pydantic's own state is pickled in an entry too: an upgrade rewrites its version.py.
    files = [*code_files(), _pydantic_version_file()]
    found: list[object] = [_FORMAT, __version__, sys.version]
    for path in files:
        if path is None:
            found.append(None)
            continue
        try:
            stat = path.stat()
        except OSError:
            found.append((str(path), None))
            continue
        found.append((str(path), stat.st_mtime_ns, stat.st_size))
    return found


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _entry_file(path: Path) -> Path:
    """One entry per rig file as named from here, for this code: an edited rig replaces its entry."""
    where = [str(path), os.getcwd(), str(Path.home()), *map(repr, _code_fingerprint())]
    name = hashlib.sha256("\0".join(where).encode()).hexdigest()[:32]
    return rig_cache_dir() / f"{name}.pickle"


def _dependencies(loaded: LoadedRig) -> dict[str, str | None]:
    """The files besides the rig file that its loading read: each rig's topology file, with its digest."""
    found: dict[str, str | None] = {}
    for rig in loaded.spec.rigs.values():
        if rig.bridge.topology_file is not None:
            path = loaded.resolve(rig.bridge.topology_file)
            found[str(path)] = _digest(path)
    return found


def _entry(entry: Path, rig_digest: str) -> tuple[Checked, bytes] | None:
    """The entry's answer for validate and its pickled rig, when it is this rig file's and its topology
    files are as they were."""
    try:
        with entry.open("rb") as handle:
            stored = pickle.load(handle)
    except Exception:  # a missing, partial or foreign entry (any unpickling error) is a miss
        return None
    if not (isinstance(stored, tuple) and len(stored) == 4 and stored[0] == rig_digest):
        return None
    _, dependencies, checked, blob = stored
    if not isinstance(dependencies, dict) or any(
        _digest(Path(path)) != digest for path, digest in dependencies.items()
    ):
        return None
    return Checked(*checked), blob


def _forget_old(folder: Path) -> None:
    """Entries not written for `_KEEP_S` go: every rig file a machine ever loaded (test runs load
    thousands) would otherwise stay; an old one still in use only costs one load afresh."""
    limit = time.time() - _KEEP_S
    with contextlib.suppress(OSError):
        for old in folder.glob("*.pickle"):
            with contextlib.suppress(OSError):
                if old.stat().st_mtime < limit:
                    old.unlink()


def _store(entry: Path, rig_digest: str, loaded: LoadedRig) -> None:
    _forget_old(entry.parent)
    partial = entry.with_name(f".{entry.name}.{os.urandom(16).hex()}.partial")
    try:
        blob = pickle.dumps(loaded, pickle.HIGHEST_PROTOCOL)
        entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with partial.open("wb") as handle:
            stored = (rig_digest, _dependencies(loaded), tuple(_checked(loaded)), blob)
            pickle.dump(stored, handle, pickle.HIGHEST_PROTOCOL)
        partial.replace(entry)
    except (OSError, pickle.PicklingError):
        with contextlib.suppress(OSError):
            partial.unlink()


def _load_afresh(path: Path, entry: Path | None, rig_digest: str | None) -> LoadedRig:
    from .loader import load_rig as load_afresh  # the parser, the rules: only on a miss

    loaded = load_afresh(path)
    unchanged = rig_digest is not None and _digest(path) == rig_digest  # not edited while it loaded
    if entry is not None and rig_digest is not None and unchanged and loaded.spec.inventory is None:
        _store(entry, rig_digest, loaded)
    return loaded


def _lookup(path: Path) -> tuple[Path | None, str | None, tuple[Checked, bytes] | None]:
    rig_digest = _digest(path)
    if rig_digest is None:
        return None, None, None  # unreadable: the loader says why
    entry = _entry_file(path)
    return entry, rig_digest, _entry(entry, rig_digest)


def check_rig(path: str | Path) -> Checked:
    """`validate`'s answer for a valid rig file (hosts and rig types), from the cache when nothing changed;
    raises the loader's SpecError."""
    path = Path(path)
    entry, rig_digest, found = _lookup(path)
    if found is not None:
        return found[0]
    return _checked(_load_afresh(path, entry, rig_digest))


def load_rig(path: str | Path) -> LoadedRig:
    """`loader.load_rig(path)` (what the commands load with), from the cache when nothing it depends on
    changed; raises the loader's SpecError."""
    path = Path(path)
    entry, rig_digest, found = _lookup(path)
    if found is not None:
        try:
            return pickle.loads(found[1])  # type: ignore[no-any-return]
        except Exception:  # pickled by code the key did not tell apart (e.g. a class renamed): a miss
            pass
    return _load_afresh(path, entry, rig_digest)
