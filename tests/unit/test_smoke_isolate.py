"""Naming the bad node: bisection and pairwise searches over a simulated fleet of N nodes, one of them bad
(failing, or slow: every run it joins is slower), checked for the node named, the evidence and the number
of rounds (bisection: at most ceil(log2 N) + 1)."""

from __future__ import annotations

import math

import pytest

from mgpu_provision.jobs.smoke_isolate import Trial, bisect, halves, pairwise


class Fleet:
    """Runs each trial as the simulated fleet would: a failing node fails every run it joins; a slow one
    divides its run's busbw by 10. Counts the rounds."""

    def __init__(self, bad: set[str], how: str = "fails") -> None:
        self.bad, self.how, self.rounds = bad, how, 0

    def run_round(self, groups: list[tuple[str, ...]]) -> list[Trial]:
        self.rounds += 1
        trials = []
        for nodes in groups:
            hit = sorted(self.bad & set(nodes))
            if hit and self.how == "fails":
                trials.append(Trial(nodes, False, None, f"{hit[0]}: rank 0: RuntimeError: drill"))
            else:
                trials.append(Trial(nodes, True, 1.0 if hit else 10.0))
        return trials


def always() -> bool:
    return True


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("how", ["fails", "slow"])
def test_bisection_names_the_bad_node_and_only_it_within_log2_rounds(count: int, how: str) -> None:
    nodes = [f"n{i}" for i in range(count)]
    for bad in (nodes[0], nodes[count // 2], nodes[-1]):
        fleet = Fleet({bad}, how)
        found = bisect(nodes, fleet.run_round, always)
        assert found.culprits == [bad], (count, bad, found)
        assert fleet.rounds <= math.ceil(math.log2(count)) + 1
        assert bad in found.evidence[bad]
        if how == "slow":
            assert "busbw 1 GB/s against 10" in found.evidence[bad]
        else:
            assert "RuntimeError: drill" in found.evidence[bad]


def test_pairwise_names_every_bad_node() -> None:
    nodes = [f"n{i}" for i in range(6)]
    fleet = Fleet({"n1", "n4"}, "slow")
    found = pairwise(nodes, fleet.run_round, always)
    assert sorted(found.culprits) == ["n1", "n4"] and fleet.rounds == 2
    assert found.rounds[0][0]["nodes"] == ["n0", "n1"] and not found.rounds[0][0]["ok"]


def test_pairwise_of_a_healthy_group_names_no_one() -> None:
    fleet = Fleet(set(), "slow")
    found = pairwise(["a", "b", "c"], fleet.run_round, always)
    assert found.culprits == [] and fleet.rounds == 1
    assert [t["nodes"] for t in found.rounds[0]] == [["a", "b"], ["c", "a"]]


def test_a_fault_of_the_whole_group_names_no_node() -> None:
    found = bisect(["a", "b", "c", "d"], Fleet(set()).run_round, always)
    assert found.culprits == [] and "both halves passed" in (found.note or "")


def test_two_bad_nodes_in_both_halves_are_not_blamed_on_one() -> None:
    found = bisect(["a", "b", "c", "d"], Fleet({"a", "d"}).run_round, always)
    assert found.culprits == [] and "more than one node" in (found.note or "")


def test_the_search_stops_when_its_time_is_spent() -> None:
    fleet = Fleet({"n5"})
    found = bisect([f"n{i}" for i in range(8)], fleet.run_round, lambda: fleet.rounds < 1)
    assert found.culprits == [] and fleet.rounds == 1
    assert found.note == "out of time with n4, n5, n6, n7 still suspected"


def test_a_lone_slow_suspect_is_measured_beside_a_pair_of_good_nodes() -> None:
    fleet = Fleet({"b"}, "slow")
    found = bisect(["a", "b", "c"], fleet.run_round, always)
    assert found.culprits == ["b"] and [t["nodes"] for t in found.rounds[-1]] == [["b", "a"], ["a", "c"]]


def test_odd_halves_leave_the_middle_node_out() -> None:
    assert halves(["a", "b", "c"]) == ([("a",), ("c",)], ["b"])
    assert halves(["a", "b", "c", "d"]) == ([("a", "b"), ("c", "d")], [])
