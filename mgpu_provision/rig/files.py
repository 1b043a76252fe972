"""Files a rig file points at: paths resolved against its folder, and its captured topologies, read once.

A rig may pin its NVLink layout with `bridge.topology_file`, an `nvidia-smi topo -m` capture from a
known-good box. The loader reads each one here, the rules judge what was read, and the loaded rig keeps the
parsed matrices for the plan: the file is read and parsed once per run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog.topology import TopologyParseError, TopoMatrix, parse_topology, read_topology_text

if TYPE_CHECKING:
    from .models import Rig


def resolve_path(base_dir: Path, path: str) -> Path:
    """Relative paths in a rig file are relative to the rig file's folder, not to the working directory."""
    expanded = Path(path).expanduser()
    return expanded if expanded.is_absolute() else base_dir / expanded


def read_topologies(rigs: Iterable[tuple[str, Rig]], base_dir: Path) -> dict[str, TopoMatrix | str]:
    """Each rig's captured matrix by rig name, or why it cannot be used (the message names the file)."""
    found: dict[str, TopoMatrix | str] = {}
    for name, rig in rigs:
        if rig.bridge.topology_file is None:
            continue
        path = resolve_path(base_dir, rig.bridge.topology_file)
        try:
            found[name] = parse_topology(read_topology_text(str(path)))
        except OSError as exc:
            found[name] = f"cannot read topology file {path}: {exc.strerror or exc}"
        except TopologyParseError as exc:
            found[name] = f"{path} is not `nvidia-smi topo -m` output: {exc}"
    return found
