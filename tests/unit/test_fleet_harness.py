"""The e2e policy: skip with a reason where the test hosts cannot run, fail under CI=true."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import hosts, slurm


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


def test_a_slurm_clusters_stop_ends_what_still_works_in_its_folder_even_once_it_is_deleted(
    tmp_path: Path,
) -> None:
    """A SIGTERM'd CI run left two `slurmstepd: [1.0]` running: a step's slurmstepd, in a session of its
    own, outlives slurmd, and its working folder (the cluster's) was removed by the teardown, so .ci/run's
    sweep read its cwd as `… (deleted)` and passed it by. The cluster's stop ends such processes itself."""
    folder = tmp_path / "mgpu-slurm-x"
    folder.mkdir()
    step = subprocess.Popen(["sleep", "60"], cwd=folder, start_new_session=True)
    try:
        folder.rmdir()  # as the teardown does, before anything ends the step
        assert slurm._end_processes_working_in(folder) == 1
        assert step.wait(timeout=5) == -signal.SIGKILL
    finally:
        if step.poll() is None:
            step.kill()
            step.wait()
