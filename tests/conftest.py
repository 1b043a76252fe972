"""Shared fixtures: the OpenSSH test hosts (tests/support/hosts.py) and the e2e skip-or-fail policy.

e2e tests skip with a reason where the harness cannot run (not root, no sshd, no unshare), but under
`CI=true` a missing harness is a failure: CI must never pass by skipping the tests that matter.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# `tests.hosts` must import the same way under `python -m pytest` (cwd on sys.path) and `pytest`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import apt_repo, debian_root, hosts, rpm_roots, systemd_host


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (.ci/run passes one on when it is stopped) ends the run as Ctrl-C does: pytest then tears
    every fixture down, so no test host, key or folder outlives a stopped run."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _not_the_developers_ssh_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No test reads the ~/.ssh/config of whoever runs the tests (its aliases, ProxyJump, Port lines would
    change what the tests connect to); a test that wants one passes --ssh-config or a HOME of its own."""
    from mgpu_provision.fleet import options

    monkeypatch.setattr(options, "USER_SSH_CONFIG", tmp_path_factory.getbasetemp() / "no-ssh-config")


@pytest.fixture(autouse=True)
def _not_the_machines_state_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A twin whose request names no state folder keeps its overlay in the node's default one
    (/var/lib/mgpu-provision); in tests that is a folder of the test session's, never this machine's."""
    from mgpu_provision.node.nvidia import twin

    monkeypatch.setattr(twin, "DEFAULT_STATE_DIR", str(tmp_path_factory.getbasetemp() / "node-state"))


@pytest.fixture(autouse=True, scope="session")
def _ansible_temp_in_the_sessions_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The product points Ansible's controller temp folder at the system's (rig/inventory.py), where Ansible
    removes its `ansible-local-*` only at exit: a worker ended by a stopped run would leave one in /tmp. In
    tests it lives under pytest's own folder instead (a test of that default clears the variable itself)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path_factory.getbasetemp() / "ansible-local"))
        yield


MACHINE_STATE_DIR = Path("/var/lib/mgpu-provision")


def _listing(folder: Path) -> dict[str, int]:
    try:
        return {entry.name: entry.stat().st_mtime_ns for entry in folder.iterdir()}
    except OSError:
        return {}


@pytest.fixture(autouse=True)
def _machine_state_folder_untouched(request: pytest.FixtureRequest) -> Iterator[None]:
    """No test writes this machine's /var/lib/mgpu-provision (a test host binds a private folder over it
    inside its own mount namespace; the empty mount point is all the machine keeps): a test that does fails,
    naming what it left there."""
    before = _listing(MACHINE_STATE_DIR)
    yield
    after = _listing(MACHINE_STATE_DIR)
    changed = sorted(name for name, mtime in after.items() if before.get(name) != mtime)
    if changed:
        pytest.fail(f"{request.node.nodeid} wrote this machine's {MACHINE_STATE_DIR}: {', '.join(changed)}")


@pytest.fixture(scope="session")
def _client_key() -> Iterator[hosts.ClientKey]:
    hosts.require_harness()
    key = hosts.ClientKey()
    yield key
    key.remove()


@pytest.fixture(scope="session")
def _address_pool() -> hosts._AddressPool:
    return hosts._AddressPool()


@pytest.fixture
def test_hosts(
    _client_key: hosts.ClientKey, _address_pool: hosts._AddressPool
) -> Iterator[hosts.HostFactory]:
    """Factory of real sshd test hosts: `test_hosts.start("gpu-a", twin)`; torn down after the test."""
    hosts.require_harness()
    yield from hosts.host_factory(_client_key, _address_pool)


@pytest.fixture
def debian_host(test_hosts: hosts.HostFactory) -> hosts.TestHost:
    """A test host whose root is a real Debian 12 system (tests/support/debian_root.py, built once and
    cached)."""
    try:
        root = debian_root.ensure_root()
    except debian_root.RootUnavailable as exc:
        hosts.skip_or_fail(str(exc))
        raise
    return test_hosts.start_root("deb-a", root)


@pytest.fixture(scope="session")
def rpm_repository() -> Iterator[str]:
    """URL of the stand-in NVIDIA RPM repository (tests/support/rpm_roots.py), served on 127.0.0.1 for the
    session."""
    hosts.require_harness()
    try:
        repo = rpm_roots.build_repository(debian_root.CACHE / "stand-in-rpms")
    except rpm_roots.RootUnavailable as exc:
        hosts.skip_or_fail(str(exc))
    address = hosts.loopback_address(rpm_roots.REPOSITORY_PORT)  # this session's own loopback range
    with rpm_roots.served(repo, address, rpm_roots.REPOSITORY_PORT) as url:
        yield url


@pytest.fixture
def booted_host(tmp_path: Path) -> Iterator[systemd_host.SystemdHost]:
    """A host with real systemd as PID 1 over an overlay of the cached Debian root, booted; killed after."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        hosts.skip_or_fail("a real-systemd host needs root, unshare and nsenter (util-linux)")
    try:
        root = debian_root.ensure_root()
    except debian_root.RootUnavailable as exc:
        hosts.skip_or_fail(str(exc))
        raise
    host = systemd_host.SystemdHost(root, tmp_path / "sd-host")
    try:
        host.boot()
        yield host
    finally:
        host.stop()


@pytest.fixture
def mirrors(tmp_path: Path) -> Iterator[Callable[..., apt_repo.SignedRepo]]:
    """Signed apt mirrors of NVIDIA's real packages on loopback: `mirrors("name", leave_out=(...))`; each
    server is stopped by its pid after the test."""
    reason = apt_repo.available()
    if reason:
        hosts.skip_or_fail(reason)
    made: list[apt_repo.SignedRepo] = []

    def make(name: str, leave_out: tuple[str, ...] = ()) -> apt_repo.SignedRepo:
        repo = apt_repo.nvidia_mirror(tmp_path / name, hosts.loopback_address(80), leave_out)
        made.append(repo)
        return repo

    yield make
    for repo in made:
        repo.stop()


# Tests that start real torch DDP runs (each rank imports torch: seconds of CPU). Run on one xdist worker, one
# after the other (with --dist loadgroup, set in pyproject.toml), so that two of them never fight over the two
# cores of a CI machine: their rendezvous timeouts are real and a starved peer would fail a healthy run.
def _torch_heavy(path: Path) -> bool:
    return path.name.startswith("test_smoke_") or path.name == "test_demo.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)
        if _torch_heavy(item.path):
            item.add_marker(pytest.mark.xdist_group("torch"))
        elif "booted_host" in getattr(item, "fixturenames", ()):
            # Two systemd PID 1s on the machine's one cgroup v1 tree claim the same slices; one boot then
            # hung in "starting" for 90 s under CI. One worker boots them one after the other.
            item.add_marker(pytest.mark.xdist_group("systemd-pid1"))
