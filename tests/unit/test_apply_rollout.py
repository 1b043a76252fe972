"""--serial and --max-fail-percent: parsing with clear errors, batch cutting, and the stop rule."""

from __future__ import annotations

import pytest

from mgpu_provision.jobs.rollout import (
    RolloutError,
    Serial,
    batches,
    parse_max_fail_percent,
    parse_serial,
    too_many_failed,
)


@pytest.mark.parametrize(
    ("text", "serial"), [("2", Serial(2, False)), ("25%", Serial(25, True)), (" 1 ", Serial(1, False))]
)
def test_parse_serial(text: str, serial: Serial) -> None:
    assert parse_serial(text) == serial


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("two", "--serial 'two': give a number of hosts (e.g. 2) or a percentage (e.g. 25%)"),
        ("-1", "--serial '-1': give a number of hosts"),
        ("0", "--serial '0': must be at least 1 and a percentage at most 100%"),
        ("150%", "--serial '150%': must be at least 1 and a percentage at most 100%"),
    ],
)
def test_bad_serial(text: str, message: str) -> None:
    with pytest.raises(RolloutError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_serial(text)


@pytest.mark.parametrize("text", ["x", "-1", "101"])
def test_bad_max_fail_percent(text: str) -> None:
    with pytest.raises(RolloutError, match=f"--max-fail-percent '{text}': give a percentage from 0 to 100"):
        parse_max_fail_percent(text)


def test_max_fail_percent_accepts_fractions() -> None:
    assert parse_max_fail_percent("12.5") == 12.5


def test_batches() -> None:
    hosts = list("abcde")
    assert batches(hosts, None) == [hosts]
    assert batches(hosts, Serial(2, False)) == [["a", "b"], ["c", "d"], ["e"]]
    assert batches(hosts, Serial(40, True)) == [["a", "b"], ["c", "d"], ["e"]]  # 40% of 5 = 2
    assert batches(hosts, Serial(1, True)) == [[h] for h in hosts]  # rounds up to at least 1
    assert batches([], Serial(1, False)) == []


def test_too_many_failed() -> None:
    assert not too_many_failed(3, 3, None)  # no limit given: never stop
    assert too_many_failed(1, 4, 0)
    assert not too_many_failed(0, 4, 0)
    assert not too_many_failed(1, 4, 25)  # exactly at the limit is allowed (Ansible: "exceeds")
    assert too_many_failed(2, 4, 25)
