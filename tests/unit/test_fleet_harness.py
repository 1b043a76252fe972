"""The e2e policy: skip with a reason where the test hosts cannot run, fail under CI=true."""

from __future__ import annotations

import pytest

from tests.support import hosts


def test_missing_harness_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts, "harness_unavailable", lambda: "OpenSSH test hosts need root")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="OpenSSH test hosts need root"):
        hosts.require_harness()


def test_missing_harness_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts, "harness_unavailable", lambda: "OpenSSH test hosts need /usr/sbin/sshd")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"CI=true but the e2e harness cannot run: .*sshd"):
        hosts.require_harness()


def test_available_harness_lets_the_test_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts, "harness_unavailable", lambda: None)
    monkeypatch.setenv("CI", "true")
    hosts.require_harness()


def test_addresses_are_loopback_unique_and_skip_busy_ones() -> None:
    pool = hosts._AddressPool()
    first, second = pool.take(), pool.take()
    assert first != second
    assert first.startswith("127.") and not first.startswith("127.0.0.")
    with hosts.SilentServer(pool.take()) as busy:
        nxt = pool.take()
        assert nxt != busy.address
