"""The loaded rig file: a valid `RigFile` and the questions every command asks of it.

`LoadedRig` is what every command works from once `load_rig` has accepted a file: the hosts and their rig
types, paths resolved against the rig file's folder, the DDP groups and their rendezvous, the GPUs CUDA may
see. A host's `Rendezvous` is derived here once per DDP group; apply writes it into the host's launcher and
smoke runs that launcher, so the two can never disagree about ranks, sizes or the rendezvous id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ProvisionError
from ..typing_lite import NamedTuple
from .files import resolve_path

if TYPE_CHECKING:  # the rig cache unpickles a LoadedRig of plain records: no model, no pydantic
    from ..catalog.topology import TopoMatrix
    from .models import Cdi, DcgmDiag, Host, ImexDomain, NodeCheck, Rig, RigFile


class Rendezvous(NamedTuple):
    """How one host joins its DDP group: torchrun's rendezvous settings and the host's place in the group."""

    master: str  # the master host's name: the group's id
    members: tuple[str, ...]  # node rank order: the master first, the others in file order
    master_addr: str
    port: int
    node_rank: int
    nproc_per_node: int  # the same on every member: spec rules keep a DDP group within one rig
    backend: str  # nccl or gloo
    rdzv_backend: str  # static or c10d
    rdzv_id: str

    @property
    def nnodes(self) -> int:
        return len(self.members)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.port}"

    def settings(self) -> dict[str, Any]:
        """The rendezvous under the names the launcher template and the smoke request give it (the one
        spread of it; protocol.torchrun_options fills its values in)."""
        return {
            "master_addr": self.master_addr,
            "master_port": self.port,
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "nproc_per_node": self.nproc_per_node,
            "backend": self.backend,
            "rdzv_backend": self.rdzv_backend,
            "rdzv_id": self.rdzv_id,
        }


@dataclass(frozen=True)
class SectionDefaults:
    """What an optional section a rig file leaves out holds by default, made by the loader (where the
    models are) so that a command reads it without them."""

    node_check: NodeCheck  # where a node check the rig no longer asks for was installed
    cdi: Cdi  # the CDI spec a rig without `containers` would keep
    dcgm_diag: DcgmDiag  # the diag's budget a rig without `health.dcgm_diag` would give it
    imex_domain: ImexDomain  # the domain `driver.imex: true` asks for


@dataclass(frozen=True)
class LoadedRig:
    """A valid rig file and the questions every command asks of it."""

    path: Path
    base_dir: Path
    spec: RigFile
    defaults: SectionDefaults
    topologies: Mapping[str, TopoMatrix] = field(default_factory=dict)  # rig name -> its topology_file

    @cached_property
    def _hosts_by_name(self) -> dict[str, Host]:
        """Every host by name, made once: a run asks for each of its hosts by name (at 10,000 hosts a scan
        per question was the largest part of plan's CPU, benchmarks/results/paper-fleet.md)."""
        found: dict[str, Host] = {}
        for host in self.spec.hosts:
            found.setdefault(host.name, host)  # the first of a name, as the scan did (rules refuse twins)
        return found

    def host(self, name: str) -> Host:
        found = self._hosts_by_name.get(name)
        if found is None:
            raise ProvisionError(f"{self.path}: no host named '{name}'")
        return found

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

    @cached_property
    def _rendezvous_by_master(self) -> dict[str, Rendezvous]:
        """Each DDP group's rendezvous (node rank 0), computed once for every use of this rig file."""
        groups: dict[str, Rendezvous] = {}
        for host in self.spec.hosts:
            ddp = self.rig_of(host).ddp
            if ddp is None or ddp.master in groups:
                continue
            master = self.host(ddp.master)
            groups[ddp.master] = Rendezvous(
                master=master.name,
                members=tuple(member.name for member in self.ddp_group(master)),
                master_addr=master.target,
                port=ddp.port,
                node_rank=0,
                nproc_per_node=self.rig_of(master).nproc_per_node,
                backend=ddp.backend,
                rdzv_backend=ddp.rdzv_backend,
                rdzv_id=ddp.rdzv_id or f"mgpu-{master.name}",
            )
        return groups

    def rendezvous(self, host: Host) -> Rendezvous | None:
        """`host`'s rendezvous in its DDP group; None for a host whose rig has no `ddp`."""
        ddp = self.rig_of(host).ddp
        if ddp is None:
            return None
        group = self._rendezvous_by_master[ddp.master]
        return group._replace(node_rank=group.members.index(host.name))

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
