"""Faults injected into one test host while `apply` runs: the fleet must shrug them off.

Each test starts a faulty host and a healthy one. The fault must end in a clear error for the faulty host
within the timeouts, the healthy host must converge all the same, no managed file may be left half-written,
and once the fault is removed the next apply must converge the faulty host too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import yaml

from tests.support.factories import pair_rig_file as rig_file
from tests.support.factories import rtx3090_twin as twin
from tests.support.hosts import _FAKE_SUDO, MANAGED_DIRS, HostFactory, TestHost, hold_lock
from tests.support.nodes import (
    Run,
    agent_pids,
    assert_converged,
    assert_no_partial_files,
    finish,
    run_in_process,
    session_sshds,
    set_defaults,
    signal_all,
    start_cli,
    wait_for,
    want_files,
)
from tests.support.trial import Trial

PROFILE = "/etc/profile.d/mgpu-provision.sh"
OLD_PROFILE = "export OLD=1\n"


def pair(
    factory: HostFactory,
    tmp_path: Path,
    login_user: str | None = None,
    sudo: Literal["nopasswd", "password"] | None = None,
) -> tuple[TestHost, TestHost, Path]:
    """A faulty-to-be host (with a stale profile script to protect) and a healthy one, drifted alike."""
    bad = factory.start(
        "gpu-bad", twin(persistence=(True, True)), rig="pair", login_user=login_user, sudo=sudo
    )
    good = factory.start("gpu-good", twin(persistence=(True, True)), rig="pair")
    bad.run_in_ns(f"printf '{OLD_PROFILE}' > {PROFILE}")
    rig = rig_file(factory, tmp_path / "rig.yaml", [bad, good])
    return bad, good, rig


def apply_args(rig: Path, factory: HostFactory, *more: str) -> list[str]:
    return ["apply", str(rig), "--known-hosts", str(factory.known_hosts), "--yes", "--json", *more]


def check_outcome(trial: Trial, run: Run, bad: TestHost, good: TestHost, *words: str) -> None:
    assert run.code == 2, run.out + run.err
    error = run.host(bad.name)["error"] or ""
    trial.figures["error"] = error[:160]
    assert run.host(bad.name)["status"] in ("failed", "unreachable")
    assert all(word in error for word in words), error
    assert "Traceback" not in run.out + run.err
    assert run.host(good.name)["status"] == "changed", run.host(good.name)


def converge_again(trial: Trial, rig: Path, factory: HostFactory, bad: TestHost, good: TestHost) -> None:
    again = run_in_process(*apply_args(rig, factory))
    assert again.code == 0, again.out + again.err  # apply reads the facts again: 0 means no drift is left
    for host in (bad, good):
        assert_converged(host, want_files(rig, host, factory))
    trial.figures["next apply"] = "converged"


@pytest.fixture
def lock_holder(request: pytest.FixtureRequest) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Lock holders a test starts (to keep the agent busy on a host); always ended afterwards."""
    holders: list[subprocess.Popen[bytes]] = []
    yield holders
    for holder in holders:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()


def mid_apply(
    factory: HostFactory,
    bad: TestHost,
    rig: Path,
    holders: list[subprocess.Popen[bytes]],
    lock_wait: int = 60,
) -> subprocess.Popen[str]:
    """Start an apply and return once the faulty host's agent is inside its `apply` verb, waiting on a lock
    that a stand-in for another apply holds: a moment that is surely mid-apply, reached without racing."""
    holders.append(hold_lock(bad, 120))
    proc = start_cli(*apply_args(rig, factory, "--lock-wait", str(lock_wait)))
    try:
        wait_for(lambda: agent_pids(bad, "apply"), f"the agent's apply on {bad.name}")
    except AssertionError:
        proc.kill()
        raise AssertionError(f"apply never reached {bad.name}'s agent: {finish(proc).err[-1500:]}") from None
    return proc


def release(holders: list[subprocess.Popen[bytes]], bad: TestHost) -> None:
    for holder in holders:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    # An agent cut off from its connection still finishes (or fails) on its own; let it, before checking.
    wait_for(lambda: not agent_pids(bad, "apply"), f"the orphaned agent on {bad.name} to end", timeout=30)


def test_sshd_sessions_killed_mid_apply(
    test_hosts: HostFactory, tmp_path: Path, trial: Trial, lock_holder: list[subprocess.Popen[bytes]]
) -> None:
    trial.area, trial.tried = "fault", "one host's sshd session processes SIGKILLed mid-apply (2 hosts)"
    trial.expect = "per-host error, other host converges, no partial file, next apply converges"
    bad, good, rig = pair(test_hosts, tmp_path)
    want = want_files(rig, bad, test_hosts)
    started = time.monotonic()
    proc = mid_apply(test_hosts, bad, rig, lock_holder)
    killed = session_sshds(bad)
    assert killed
    signal_all(killed, signal.SIGKILL)
    run = finish(proc)
    trial.figures.update(hosts=2, seconds_to_error=round(time.monotonic() - started, 1))
    check_outcome(trial, run, bad, good, "gpu-bad")
    release(lock_holder, bad)
    assert_no_partial_files(bad, want, {PROFILE: OLD_PROFILE})
    converge_again(trial, rig, test_hosts, bad, good)


def test_connection_stalls_mid_apply(
    test_hosts: HostFactory, tmp_path: Path, trial: Trial, lock_holder: list[subprocess.Popen[bytes]]
) -> None:
    trial.area, trial.tried = "fault", "one host's connection stalls mid-apply (sshd sessions SIGSTOPped)"
    trial.expect = (
        "per-host timeout error (command_timeout_s + lock wait + the facts after), other host converges, "
        "next converges"
    )
    bad, good, rig = pair(test_hosts, tmp_path)
    set_defaults(rig, command_timeout_s=5)
    want = want_files(rig, bad, test_hosts)
    # The apply verb's limit is command_timeout_s plus the lock wait, plus command_timeout_s for the facts
    # its reply brings back (jobs/apply.py): 5 + 10 + 5 s.
    proc = mid_apply(test_hosts, bad, rig, lock_holder, lock_wait=10)
    stopped = session_sshds(bad)
    signal_all(stopped, signal.SIGSTOP)
    started = time.monotonic()
    try:
        run = finish(proc, timeout=60)
    finally:
        signal_all(stopped, signal.SIGCONT)
    elapsed = time.monotonic() - started
    trial.figures.update(hosts=2, limit_s=20, seconds_to_error=round(elapsed, 1))
    check_outcome(trial, run, bad, good, "within 20s")
    assert elapsed < 20 + 10, f"the stalled host held the run for {elapsed:.0f}s after the stall"
    release(lock_holder, bad)
    assert_no_partial_files(bad, want, {PROFILE: OLD_PROFILE})
    converge_again(trial, rig, test_hosts, bad, good)


def test_managed_folder_on_a_full_filesystem(test_hosts: HostFactory, tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "fault", "/etc/profile.d on a 16 KiB tmpfs that is full"
    trial.expect = (
        "per-host 'No space left' error, old file intact, other host converges, next apply converges"
    )
    bad, good, rig = pair(test_hosts, tmp_path)
    bad.run_in_ns(
        f"mount -t tmpfs -o size=16k tmpfs /etc/profile.d && printf '{OLD_PROFILE}' > {PROFILE}"
        " && (dd if=/dev/zero of=/etc/profile.d/filler bs=1k count=64 2>/dev/null; true)"
    )
    want = want_files(rig, bad, test_hosts)
    run = run_in_process(*apply_args(rig, test_hosts))
    trial.figures.update(hosts=2, tmpfs="16 KiB")
    check_outcome(trial, run, bad, good, f"(file {PROFILE}) failed", "No space left on device")
    assert_no_partial_files(bad, want, {PROFILE: OLD_PROFILE})
    assert bad.run_in_ns(f"cat {PROFILE}").stdout == OLD_PROFILE
    bad.run_in_ns("rm /etc/profile.d/filler")
    converge_again(trial, rig, test_hosts, bad, good)


def test_read_only_etc(test_hosts: HostFactory, tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "fault", "/etc/mgpu-provision and /etc/profile.d remounted read-only"
    trial.expect = "per-host 'Read-only file system' error, other host converges, next apply converges"
    bad, good, rig = pair(test_hosts, tmp_path)
    folders = [d for d in MANAGED_DIRS if d.startswith("/etc/")]
    bad.run_in_ns(" && ".join(f"mount -o remount,bind,ro {d}" for d in folders))
    want = want_files(rig, bad, test_hosts)
    run = run_in_process(*apply_args(rig, test_hosts))
    trial.figures.update(hosts=2, read_only=len(folders))
    check_outcome(trial, run, bad, good, "failed", "Read-only file system")
    assert_no_partial_files(bad, want, {PROFILE: OLD_PROFILE})
    bad.run_in_ns(" && ".join(f"mount -o remount,bind,rw {d}" for d in folders))
    converge_again(trial, rig, test_hosts, bad, good)


def test_sudo_that_asks_for_a_password(test_hosts: HostFactory, tmp_path: Path, trial: Trial) -> None:
    trial.area, trial.tried = "fault", "login user `ops` whose sudo asks for a password (become: true)"
    trial.expect = "per-host 'sudo needs a password' error, nothing written, other host converges"
    bad, good, rig = pair(test_hosts, tmp_path, login_user="ops", sudo="password")
    document = yaml.safe_load(rig.read_text())
    document["hosts"][0].update(user="ops", become=True)
    rig.write_text(yaml.safe_dump(document, sort_keys=False))
    run = run_in_process(*apply_args(rig, test_hosts))
    trial.figures.update(hosts=2)
    check_outcome(trial, run, bad, good, "sudo needs a password")
    assert bad.run_in_ns(f"cat {PROFILE}").stdout == OLD_PROFILE
    # The fault removed: the box's sudo lets `ops` run the agent without a password.
    sudo = bad.dir / "managed" / str(MANAGED_DIRS.index("/usr/local/bin")) / "sudo"
    sudo.write_text(_FAKE_SUDO["nopasswd"])
    again = run_in_process(*apply_args(rig, test_hosts))
    # The stand-in sudo cannot make `ops` root, so the writes now fail on permissions, not on sudo.
    assert "sudo needs a password" not in (again.host(bad.name)["error"] or "")
    trial.figures["after sudo fixed"] = "agent ran"
