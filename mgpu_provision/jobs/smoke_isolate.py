"""Naming the bad node of a DDP group: smaller smoke runs over parts of the group, until one node is left.

A 64-node group that fails or crawls says only that *some* node is bad. Two searches answer which, both pure
functions over a `run_round` callback (the shell in `jobs/smoke.py` runs each round's trials as real smoke
runs, every trial its own group), so the arithmetic is tested without a fleet:
- `bisect` (after a group failed or fell below its floor or baseline): run both halves of the suspects at
  once (halves of equal size; the middle node of an odd count is the suspect when both pass), keep the
  half that is bad, until two suspects are left, then pair each with a node that passed (`resolve`). At
  most ceil(log2 N) + 1 rounds.
- `pairwise` (`smoke --pairs`, for accepting new nodes): every node in a pair; the members of a bad pair each
  again with a node of a good pair.
A trial is bad when it failed (a node, a rank) or when its busbw is below SLOW_SHARE of the fastest trial of
the same size in its round: sub-groups differ in size from the group, so no floor applies to them, but two
trials of one round ran the same way at the same time. Evidence is kept per named node: the rank that failed,
or its trial's busbw against the others'. Each search stops before a round it has no time left for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A trial slower than this share of the fastest trial of its size in the same round is slow. A slow node
# drags every collective it joins (nccl-tests' busbw of a ring is its slowest link's); noise between two runs
# of one size on one fabric is within a few percent.
SLOW_SHARE = 0.7
DEFAULT_BUDGET_S = 900.0


@dataclass(frozen=True)
class Trial:
    """One smaller run: its nodes (node rank order), whether every node and rank passed, its plateau busbw,
    and the first problem it had."""

    nodes: tuple[str, ...]
    ok: bool
    busbw_gbps: float | None = None
    why: str | None = None


RunRound = Callable[[list[tuple[str, ...]]], list[Trial]]


@dataclass
class Isolation:
    """What the search found: the nodes it names, why each, and every round it ran."""

    mode: str  # bisect or pairs
    culprits: list[str] = field(default_factory=list)
    evidence: dict[str, str] = field(default_factory=dict)
    rounds: list[list[dict[str, Any]]] = field(default_factory=list)
    note: str | None = None  # why it named no node, or stopped early

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "culprits": self.culprits,
            "evidence": self.evidence,
            "rounds": self.rounds,
            "note": self.note,
        }


def slow_trials(trials: Sequence[Trial]) -> dict[tuple[str, ...], float]:
    """The passing trials slower than SLOW_SHARE of the fastest passing trial of their size: nodes -> the
    fastest figure they were measured against."""
    best: dict[int, float] = {}
    for t in trials:
        if t.ok and t.busbw_gbps is not None:
            best[len(t.nodes)] = max(best.get(len(t.nodes), 0.0), t.busbw_gbps)
    return {
        t.nodes: best[len(t.nodes)]
        for t in trials
        if t.ok and t.busbw_gbps is not None and t.busbw_gbps < SLOW_SHARE * best[len(t.nodes)]
    }


def bad_trials(trials: Sequence[Trial]) -> dict[tuple[str, ...], str]:
    """Each bad trial's nodes -> the evidence against it: why it failed, or its busbw against the fastest."""
    bad = {t.nodes: f"failed: {t.why or 'a node failed'}" for t in trials if not t.ok}
    for t in trials:
        if t.nodes in slow_trials(trials):
            fastest = slow_trials(trials)[t.nodes]
            bad[t.nodes] = (
                f"busbw {t.busbw_gbps:g} GB/s against {fastest:g} GB/s of the fastest "
                f"{len(t.nodes)}-node run beside it"
            )
    return bad


def _record(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    bad = bad_trials(trials)
    return [
        dict(nodes=list(t.nodes), ok=t.nodes not in bad, busbw_gbps=t.busbw_gbps, why=bad.get(t.nodes))
        for t in trials
    ]


def halves(suspects: Sequence[str]) -> tuple[list[tuple[str, ...]], list[str]]:
    """Two halves of equal size, so that their figures compare, and the middle node of an odd count that
    neither holds."""
    size = len(suspects) // 2
    return [tuple(suspects[:size]), tuple(suspects[len(suspects) - size :])], list(
        suspects[size : len(suspects) - size]
    )


def partnered(suspects: Sequence[str], good: Sequence[str]) -> list[tuple[str, ...]]:
    """Each suspect with a known-good partner, spread over the good nodes (the shell runs trials that share
    a node one after the other); a lone suspect's pair is run beside a pair of good nodes, the figure a
    slow pair is measured against."""
    trials: list[tuple[str, ...]] = [(s, good[i % len(good)]) for i, s in enumerate(suspects)]
    if len(trials) == 1 and len(good) >= 2:
        trials.append((good[0], good[1]))
    return trials


def _passed(trials: Sequence[Trial]) -> list[str]:
    bad = bad_trials(trials)
    return [n for t in trials if t.nodes not in bad for n in t.nodes]


def resolve(found: Isolation, suspects: Sequence[str], good: Sequence[str], run_round: RunRound) -> Isolation:
    """The last round: each suspect with a known-good partner; a suspect whose pair is bad is named. With
    no good node at all (a group of two), each suspect runs alone and the two are compared."""
    trials = run_round(partnered(suspects, good) if good else [(s,) for s in suspects])
    found.rounds.append(_record(trials))
    bad = bad_trials(trials)
    for t in trials:
        if t.nodes in bad and t.nodes[0] in suspects:
            node = t.nodes[0]
            found.culprits.append(node)
            partner = f" with {t.nodes[1]}" if len(t.nodes) > 1 else " alone"
            found.evidence[node] = f"{node}{partner}: {bad[t.nodes]}"
    if not found.culprits:
        found.note = f"every run of {', '.join(suspects)} with a known-good partner passed"
    return found


def bisect(
    nodes: Sequence[str], run_round: RunRound, time_left: Callable[[], bool], why: str | None = None
) -> Isolation:
    """Halve the suspects until two are left, then `resolve` them. `time_left` is asked before each round."""
    found = Isolation("bisect")
    suspects: list[str] = list(nodes)
    good: list[str] = []
    if len(suspects) == 1:
        found.culprits, found.evidence = [suspects[0]], {suspects[0]: why or "the group is this node alone"}
        return found
    while len(suspects) > 2:
        if not time_left():
            found.note = f"out of time with {', '.join(suspects)} still suspected"
            return found
        split, middle = halves(suspects)
        trials = run_round(split)
        found.rounds.append(_record(trials))
        bad = bad_trials(trials)
        good += [n for n in _passed(trials) if n not in good]
        if len(bad) > 1:
            found.note = "both halves are bad: more than one node, or a fault that is not one node's"
            return found
        if not bad and not middle:
            found.note = "both halves passed: the fault needs the whole group (scale, or a link between them)"
            return found
        suspects = list(next(iter(bad))) if bad else middle
        if len(suspects) == 1 and bad:
            (node,) = suspects
            found.culprits, found.evidence = [node], {node: _last_evidence(found, node)}
            return found
    if not time_left():
        found.note = f"out of time with {', '.join(suspects)} still suspected"
        return found
    return resolve(found, suspects, good, run_round)


def _last_evidence(found: Isolation, node: str) -> str:
    """The evidence of the last round against `node`: the bad trial it was in."""
    for trial in found.rounds[-1]:
        if node in trial["nodes"] and not trial["ok"]:
            return f"{'+'.join(trial['nodes'])}: {trial['why']}"
    return "the only node left"


def pairwise(nodes: Sequence[str], run_round: RunRound, time_left: Callable[[], bool]) -> Isolation:
    """Every node in a pair (an odd one out with the first node), then each member of a bad pair with a
    node of a good pair: names every bad node, not only one."""
    found = Isolation("pairs")
    if len(nodes) < 2:
        found.note = "a single node has no partner"
        return found
    pairs = [tuple(nodes[i : i + 2]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2:
        pairs.append((nodes[-1], nodes[0]))
    trials = run_round(pairs)
    found.rounds.append(_record(trials))
    bad = bad_trials(trials)
    good = [n for n in nodes if n in _passed(trials)]
    suspects = [n for n in nodes if any(n in b for b in bad) and n not in good]
    if not bad:
        return found
    if not good:
        found.note = "every pair is bad: no known-good partner to tell the nodes apart"
        return found
    if not time_left():
        found.note = f"out of time with {', '.join(suspects)} still suspected"
        return found
    return resolve(found, suspects, good, run_round)
