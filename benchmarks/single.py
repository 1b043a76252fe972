"""Figures of one process at a time for fleet.py's page: the agent's facts call on a test host, and
startup.py's start-up figures (what `plan` imports, `validate`, a local `plan --json`).

These bound what the fleet figures can reach: the agent's CPU is paid once per host by every contender, the
imports and `validate` once per command. startup.py measures the start-up figures (reused here, not
copied); the agent's call is measured here because it needs a test host: inside the first host's
namespaces, with a login's environment, the exact request the fleet's contenders send and the interpreter
flags the tool uses, next to that python doing nothing. Each figure is the median and the best of `runs`,
in the same run and on the same frozen code as the fleet (a wall clock is judged on the best run: other
work on a shared machine only ever adds to it; CPU is the kernel's rusage with children).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from contenders import AGENT_FLAGS
from startup import cases, cpu_run


@dataclass(frozen=True)
class Figure:
    """One figure over several runs."""

    median: float
    best: float

    @classmethod
    def of(cls, measure: Callable[[], float], runs: int) -> Figure:
        values = [measure() for _ in range(runs)]
        return cls(statistics.median(values), min(values))


@dataclass(frozen=True)
class AgentCost:
    """The cached agent's facts call on a simulated test host, and a bare start of the same python."""

    facts_cpu_s: Figure
    facts_wall_s: Figure
    python_start_cpu_s: Figure


def agent_cost(namespace: Sequence[str], python: str, agent: str, request: bytes, runs: int) -> AgentCost:
    """`namespace`: nsenter into the host and its login's environment, exec'd into the python (its own
    cost is a few exec calls)."""
    facts = [*namespace, python, *AGENT_FLAGS, agent, "facts"]
    bare = [*namespace, python, *AGENT_FLAGS, "-c", "pass"]
    env = dict(os.environ)
    calls = [cpu_run(facts, env, request) for _ in range(runs)]
    return AgentCost(
        Figure(statistics.median(c for _, c in calls), min(c for _, c in calls)),
        Figure(statistics.median(w for w, _ in calls), min(w for w, _ in calls)),
        Figure.of(lambda: cpu_run(bare, env)[1], runs),
    )


@dataclass(frozen=True)
class StartUp:
    """startup.py's figures for one copy of the package (names as startup.py gives them)."""

    figures: dict[str, Figure]
    plan_loads: list[str]  # which of rich, fabric, paramiko, jinja2, pydantic, yaml a `plan --json` run loads


def startup_figures(code: Path, node_python: str, example: str, runs: int) -> StartUp:
    """startup.py's measurements of the package in `code` (a folder holding mgpu_provision)."""
    with tempfile.TemporaryDirectory(prefix="mgpu-bench-startup-") as work:
        measures, loads = cases(code, Path(work), node_python, example)
        return StartUp({name: Figure.of(measure, runs) for name, measure in measures.items()}, loads)
