"""Long runs say what they wait for: on a terminal, plan and facts name the hosts still pending; `-v` logs
each host's SSH steps with their times, to see which one is slow."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.commands.output import pending_line
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.pool import run_fleet
from tests.support.factories import local_target
from tests.support.hosts import fake_agent


def test_the_pending_line_names_what_is_left() -> None:
    assert pending_line("reading facts", 19, ["gpu-03", "gpu-07"]) == (
        "reading facts: 17 of 19 done, waiting for gpu-03, gpu-07"
    )
    many = [f"gpu-{n:02d}" for n in range(1, 12)]
    assert pending_line("reading", 11, many).endswith("gpu-08 and 3 more")


def test_each_host_is_reported_done_and_logged_with_its_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    done: list[str] = []
    options = FleetOptions(agent=fake_agent("progress"), on_host_done=done.append)
    targets = [local_target(name="a"), local_target(name="b"), local_target(name="c", python="/nonexistent")]

    def fn(session: Any) -> dict[str, Any]:
        return session.call("facts", {})

    with caplog.at_level(logging.INFO, logger="mgpu_provision.fleet"):
        outcomes = run_fleet(targets, fn, options)
    assert sorted(done) == ["a", "b", "c"]  # failed hosts too
    assert outcomes["c"].status == "failed"
    messages = [r.getMessage() for r in caplog.records]
    for name in ("a", "b", "c"):
        assert f"{name}: connecting" in messages
        assert any(m.startswith(f"{name}: connected and logged in after ") for m in messages)
        assert any(m.startswith(f"{name}: done after ") for m in messages)
