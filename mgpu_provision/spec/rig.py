"""The loaded rig file: a valid `RigFile` and the questions every command asks of it.

`LoadedRig` is what every command works from once `load_rig` has accepted a file: the hosts and their rig
types, paths resolved against the rig file's folder, the DDP groups and node ranks, the GPUs CUDA may see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ProvisionError
from ..node.topology import TopoMatrix
from .files import resolve_path
from .models import Host, Rig, RigFile


@dataclass(frozen=True)
class LoadedRig:
    """A valid rig file and the questions every command asks of it."""

    path: Path
    base_dir: Path
    spec: RigFile
    topologies: Mapping[str, TopoMatrix] = field(default_factory=dict)  # rig name -> its topology_file

    def host(self, name: str) -> Host:
        for host in self.spec.hosts:
            if host.name == name:
                return host
        raise ProvisionError(f"{self.path}: no host named '{name}'")

    def rig_of(self, host: Host) -> Rig:
        return self.spec.rigs[host.rig]

    def resolve(self, p: str) -> Path:
        return resolve_path(self.base_dir, p)

    def ddp_group(self, host: Host) -> list[Host]:
        """The hosts that train together with `host`: those whose rig names the same DDP master.

        The master comes first (rank 0), the others in file order. A host of a rig without `ddp` is alone.
        """
        ddp = self.rig_of(host).ddp
        if ddp is None:
            return [host]
        members = [
            other
            for other in self.spec.hosts
            if (other_ddp := self.rig_of(other).ddp) is not None and other_ddp.master == ddp.master
        ]
        return sorted(members, key=lambda other: other.name != ddp.master)

    def node_rank(self, host: Host) -> int:
        return [member.name for member in self.ddp_group(host)].index(host.name)

    def visible_indices(self, host: Host, gpu_uuids: Sequence[str] | None = None) -> list[int] | None:
        """NVML indices CUDA may see on `host`; None means all.

        UUID entries (or unique prefixes) are mapped to indices through `gpu_uuids`, the host's GPU UUIDs in
        index order as its facts report them; a UUID that cannot be mapped is an error.
        """
        devices = self.rig_of(host).visible_devices
        if devices is None:
            return None
        indices = []
        for device in devices:
            if isinstance(device, int):
                indices.append(device)
                continue
            gpu_uuid = device.split("/")[0].removeprefix("MIG-")  # MIG-<GPU uuid>/gi/ci lives on that GPU
            matches = [i for i, uuid in enumerate(gpu_uuids or ()) if uuid.startswith(gpu_uuid)]
            if len(matches) != 1:
                raise ProvisionError(
                    f"{host.name}: visible device {device} matches no single GPU of the host"
                )
            indices.append(matches[0])
        return indices
