"""A valid rig file as plain records: what every command works from once pydantic has accepted the file.

pydantic is the validator of the rig file (`models.py`, `loader.py`); what a command reads afterwards is
only values. `plain(spec)` copies a validated `RigFile` into `records.Record`s holding the same values, so
the rig cache (`cache.py`) pickles records and a later run unpickles them without importing pydantic or
building a model (issue 41: ~0.15 CPU-s of a small run). The methods the code asks of the models live here,
in one "shape" per model that has any, which the pydantic model and its record both inherit: one
definition, whichever of the two a caller holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..records import Record

M = TypeVar("M")
D = TypeVar("D")


class _Counted(Protocol):  # what RigShape reads of `gpus` (models.Gpus)
    @property
    def count(self) -> int: ...


class _Ddp(Protocol):  # what RigShape reads of `ddp` (models.Ddp)
    @property
    def nproc_per_node(self) -> int | None: ...


def nvml_gres_type(model: str) -> str:
    """The GRES type Slurm's AutoDetect=nvml gives a GPU: its NVML name lower-cased, spaces as underscores
    ("NVIDIA GeForce RTX 3090" -> "nvidia_geforce_rtx_3090"); a configured type must be a substring of it."""
    return "_".join(model.lower().split())


def imex_domain(driver: Any, default: D) -> D | None:
    """The IMEX domain a rig's `driver` asks for; None without IMEX. `imex: true` is `default` (the domain's
    defaults, `peers: fleet`): the models give `ImexDomain()`, a loaded rig its `defaults.imex_domain`."""
    if driver is None or driver.imex is False:
        return None
    return default if driver.imex is True else driver.imex


class HostShape:
    if TYPE_CHECKING:
        name: str
        address: str | None

    @property
    def target(self) -> str:
        return self.address or self.name


class HealthShape:
    if TYPE_CHECKING:
        skip: Sequence[str]

    def checks(self, name: str) -> bool:
        return name not in self.skip


class SlurmShape:
    if TYPE_CHECKING:
        gres_type: str | None

    def type_for(self, model: str) -> str:
        return self.gres_type or nvml_gres_type(model)


class RigShape:
    if TYPE_CHECKING:
        gpus: _Counted
        visible_devices: list[int | str] | None
        ddp: _Ddp | None

    @property
    def visible_count(self) -> int:
        """GPUs per node that CUDA sees: the visible device list, or every GPU of the rig."""
        return len(self.visible_devices) if self.visible_devices is not None else self.gpus.count

    @property
    def nproc_per_node(self) -> int:
        """DDP processes per node: `ddp.nproc_per_node`, else one per visible GPU."""
        if self.ddp is not None and self.ddp.nproc_per_node is not None:
            return self.ddp.nproc_per_node
        return self.visible_count


class NodeCheckShape:
    if TYPE_CHECKING:
        command: str
        agent: str
        expectations: str
        textfile_dir: str | None

    def paths(self) -> list[tuple[str, str]]:
        """(field, path) of every path of the section, for the rules on paths."""
        named = [("command", self.command), ("agent", self.agent), ("expectations", self.expectations)]
        return named + ([("textfile_dir", self.textfile_dir)] if self.textfile_dir else [])


class Plain(Record):
    """A rig model's validated values, with the model's fields in its order (`model_fields_set` too)."""


class PlainHost(Plain, HostShape):
    pass


class PlainHealth(Plain, HealthShape):
    pass


class PlainSlurm(Plain, SlurmShape):
    pass


class PlainRig(Plain, RigShape):
    pass


class PlainNodeCheck(Plain, NodeCheckShape):
    pass


_RECORD_OF_SHAPE: dict[type, type[Plain]] = {
    HostShape: PlainHost,
    HealthShape: PlainHealth,
    SlurmShape: PlainSlurm,
    RigShape: PlainRig,
    NodeCheckShape: PlainNodeCheck,
}


def plain(model: M) -> M:
    """`model` (a validated rig model) as a record with the same values, nested models as records too;
    typed as the model, whose fields and methods it answers for."""
    return _plain(model)  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value
    fields = getattr(type(value), "model_fields", None)
    if fields is not None:  # a pydantic model
        kind = next((r for shape, r in _RECORD_OF_SHAPE.items() if isinstance(value, shape)), Plain)
        values = {name: _plain(getattr(value, name)) for name in fields}
        return kind.from_values(values, frozenset(value.model_fields_set))
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
