"""The replies of `apply`, `reboot`, `smoke`, `smoke-cleanup`, `smoke-baseline`, `slurm-node`, `gpu-reset`.

The agent answers plain JSON (node/verbs/apply.py, node/verbs/smoke.py); `fleet.session.read_reply`
validates it against these models, so a reply this version cannot read is an AgentError that names the
field, never a KeyError deep inside a job. Facts have their own contract (facts.py), reclaim's is in
jobs/reclaim.py. Unknown keys are ignored (smoke's are kept: its report carries the node's whole answer).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Reply(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class StepOutcome(Reply):
    """One apply step's outcome, in the order of the request's steps."""

    index: int = Field(ge=0)
    kind: str
    changed: bool
    message: str
    error: str | None = None
    skipped: bool = False


class ApplyReply(Reply):
    results: list[StepOutcome]
    # The reply envelope of the facts read afterwards, when the request asked for them (`then_facts`); read
    # as a facts reply is (jobs/apply.py), and absent from an agent that predates it.
    facts: dict[str, Any] | None = None


class RebootReply(Reply):
    boot_id: str = Field(min_length=1, description="the boot id before the reboot: the wait ends on another")


class CleanupReply(Reply):
    """`smoke-cleanup`: the run's marker on that node, and what survived SIGKILL (normally nothing)."""

    marker: str
    leftover_pids: list[int]


class BaselineReply(Reply):
    """`smoke-baseline`: where the baseline was written, and whether it replaced a corrupt one."""

    path: str
    replaced_corrupt: bool


class SmokeReply(Reply):
    """One node's part of the smoke run (node/verbs/smoke.py `run`): the fields the judgement reads."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    ok: bool
    kind: str | None = None
    diagnosis: str | None = None
    ranks: list[dict[str, Any]] = Field(default_factory=list)
    elapsed_s: float = Field(0.0, ge=0)
    data_parallel: dict[str, Any] | None = None
    transport: dict[str, Any] | None = None  # what NCCL's log says joined the ranks (smoke_watch.transport)
    under_load: list[dict[str, Any]] = Field(default_factory=list)  # per GPU while the ranks ran
    baseline: dict[str, Any] | None = None  # the box's smoke baseline: record, problem (a corrupt file)


class SlurmNodeReply(Reply):
    """`slurm-node`: the node's Slurm name and its controller line after the action."""

    node: str = Field(min_length=1)
    line: dict[str, str]
    changed: bool


class HeldGpu(Reply):
    gpu: int = Field(ge=0)
    pids: list[int]


class ResetGpu(Reply):
    index: int = Field(ge=0)
    pci_bus_id: str


class GpuResetReply(Reply):
    """`gpu-reset`: whether the GPUs were reset, what the reset said when not, who still held them."""

    reset: bool
    error: str | None = None
    held: list[HeldGpu]
    waited_s: float = Field(ge=0)
    gpus: list[ResetGpu]
