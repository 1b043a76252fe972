"""Playbooks: which steps of a rollout run, in which order, with tags to pick some of them (`--tags`).

A playbook is a small YAML file (`provision`, `audit` and `env` ship in `mgpu_provision/playbooks/`; any file
of the same shape works). It never says *what* a box must look like, only which kinds of Changes of the plan
an apply reports and carries out, so the same rig file can be audited, or get only its env files, safely.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ProvisionError, did_you_mean
from ..plan.change import PHASES, Change

# Every step a playbook may name: the phases resource diffs give their Changes.
STEPS = PHASES
_MAX_BYTES = 64 * 1024
_MESSAGES = {"extra_forbidden": "unknown key", "missing": "required key is missing"}


class PlaybookError(ProvisionError):
    """A playbook is missing, unreadable or invalid, or --tags/--skip-tags name tags it does not have."""


class _StepModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str
    tags: list[str] = Field(default_factory=list)

    @field_validator("step")
    @classmethod
    def _known_step(cls, value: str) -> str:
        if value not in STEPS:
            raise ValueError(f"unknown step {value!r} (known steps: {', '.join(STEPS)})")
        return value


class _PlaybookModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str = ""
    steps: list[_StepModel] = Field(min_length=1)

    @field_validator("steps")
    @classmethod
    def _unique_steps(cls, value: list[_StepModel]) -> list[_StepModel]:
        names = [s.step for s in value]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"step(s) listed twice: {', '.join(repeated)}")
        return value


@dataclass(frozen=True)
class PlaybookStep:
    name: str
    tags: frozenset[str]  # always includes the step's own name


@dataclass(frozen=True)
class Playbook:
    name: str
    description: str
    steps: tuple[PlaybookStep, ...]
    source: str

    @property
    def tags(self) -> frozenset[str]:
        return frozenset().union(*(s.tags for s in self.steps))


def _location(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def parse_playbook(text: str, source: str) -> Playbook:
    """A Playbook from YAML text; every problem found is reported, each with the key it concerns."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlaybookError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise PlaybookError(f"{source}: a playbook is a mapping with `name` and `steps`")
    try:
        model = _PlaybookModel.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = _location(error["loc"]) or "playbook"
            message = _MESSAGES.get(error["type"], error["msg"])
            problems.append(f"{source}: {where}: {message.removeprefix('Value error, ')}")
        raise PlaybookError("\n".join(problems)) from exc
    steps = tuple(PlaybookStep(s.step, frozenset([s.step, *s.tags])) for s in model.steps)
    return Playbook(model.name, model.description, steps, source)


def packaged_playbooks() -> list[str]:
    """Names of the playbooks shipped inside the package."""
    folder = resources.files("mgpu_provision") / "playbooks"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_playbook(ref: str) -> Playbook:
    """A packaged playbook by NAME (`provision`), or a playbook FILE (any path, or a name ending in .yaml)."""
    if "/" not in ref and not ref.endswith((".yaml", ".yml")):
        if ref not in packaged_playbooks():
            known = ", ".join(packaged_playbooks())
            hint = did_you_mean(ref, packaged_playbooks())
            raise PlaybookError(f"no playbook named {ref!r}{hint} (shipped: {known}; or give a file path)")
        packaged = resources.files("mgpu_provision") / "playbooks" / f"{ref}.yaml"
        return parse_playbook(packaged.read_text(encoding="utf-8"), f"playbook {ref}")
    path = Path(ref)
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise PlaybookError(f"{ref}: larger than {_MAX_BYTES} bytes; not a playbook")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlaybookError(f"cannot read playbook {ref}: {exc.strerror}") from exc
    return parse_playbook(text, ref)


def select_steps(playbook: Playbook, tags: list[str] | None, skip_tags: list[str] | None) -> tuple[str, ...]:
    """The steps that run, in playbook order: with any of `tags` (all if None) and none of `skip_tags`."""
    unknown = sorted(set(tags or []).union(skip_tags or []) - playbook.tags)
    if unknown:
        raise PlaybookError(
            f"unknown tag(s) {', '.join(unknown)} for playbook {playbook.name} "
            f"(its tags: {', '.join(sorted(playbook.tags))})"
        )
    wanted = set(tags) if tags else None
    skipped = set(skip_tags or [])
    return tuple(
        s.name for s in playbook.steps if (wanted is None or s.tags & wanted) and not (s.tags & skipped)
    )


def reported(change: Change, steps: tuple[str, ...]) -> bool:
    """Whether a run of `steps` shows this Change: a pending reboot matters to the driver step too."""
    step = change.phase
    if step == "reboot":
        return "reboot" in steps or "driver" in steps
    return step in steps


def carried_out(change: Change, steps: tuple[str, ...]) -> bool:
    """Whether a run of `steps` makes this Change (checks and manual steps never are)."""
    return change.agent_step is not None and change.phase in steps


def in_step_order(changes: list[Change], steps: tuple[str, ...]) -> list[Change]:
    """The Changes a run of `steps` shows, in playbook order (stable within a step), so the playbook says
    what goes first (persistence before the driver install that would unload it)."""
    rank = {step: i for i, step in enumerate(steps)}
    shown = [c for c in changes if reported(c, steps)]
    return sorted(shown, key=lambda c: rank.get(c.phase, len(steps)))
