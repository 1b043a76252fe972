"""The zypper and dnf installers against the real package managers, on boxes whose roots hold them.

Each box is a private overlay of a root with a real zypper or a real dnf (tests/rpm_roots.py) that says it
is SLES 15 SP6 or RHEL 10; the repository is stand-in RPMs named and versioned like NVIDIA's, served on
127.0.0.1. The node's installer runs inside the box with the box's own python3, exactly as the agent runs
it, and the test reads back what rpm and the manager's locks say: an exact version installed and locked,
the lock holding an upgrade back, up and down between versions, a second run changing nothing, and a
version the repository lacks refused before anything changes.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.node.packages import zypper
from tests import hosts, rpm_roots

REPO = Path(__file__).resolve().parents[2]
OLD, NEW = rpm_roots.VERSIONS
SUSE_SET = zypper.package_set("550", "default", fabricmanager=True)
# Runs one installer inside a box on the node code copied there, as the agent bundle would.
RUNNER = """\
import importlib, json, sys
sys.path.insert(0, "/opt/mgpu")
from mgpu_provision.node.core.errors import AgentFailure
installer = importlib.import_module("mgpu_provision.node.packages." + sys.argv[1])
try:
    print(json.dumps(list(installer.install(json.loads(sys.argv[2])))))
except AgentFailure as exc:
    print(json.dumps(["failed", exc.message]))
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    hosts.require_harness()
    try:
        repo = rpm_roots.build_repository(rpm_roots.debian_root.CACHE / "stand-in-rpms")
    except rpm_roots.RootUnavailable as exc:
        hosts.skip_or_fail(str(exc))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with rpm_roots.served(repo, "127.0.0.1", port) as url:
        yield url


def box_of(manager: str, folder: Path) -> rpm_roots.RpmBox:
    try:
        root = rpm_roots.ensure_manager_root(manager)
    except rpm_roots.RootUnavailable as exc:
        hosts.skip_or_fail(str(exc))
    box = rpm_roots.RpmBox(root, folder)
    shutil.copytree(
        REPO / "mgpu_provision" / "node",
        box.layers["upper"] / "opt" / "mgpu" / "mgpu_provision" / "node",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(REPO / "mgpu_provision" / "__init__.py", box.layers["upper"] / "opt/mgpu/mgpu_provision")
    box.write("/opt/mgpu/run_step.py", RUNNER)
    return box


def run_step(box: rpm_roots.RpmBox, module: str, step: dict[str, Any]) -> list[Any]:
    result = box.run(f"python3 /opt/mgpu/run_step.py {module} {shlex.quote(json.dumps(step))}")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def rpm_versions(box: rpm_roots.RpmBox, names: list[str]) -> dict[str, str]:
    out = box.run(f"rpm -q --qf '%{{NAME}} %{{VERSION}}\\n' {' '.join(names)}").stdout
    return {p[0]: p[1] for p in (line.split() for line in out.splitlines()) if len(p) == 2}


def suse_step(version: str, hold: bool = True) -> dict[str, Any]:
    return {
        "branch": "550",
        "version": version,
        "hold": hold,
        "packages": SUSE_SET.install,
        "pinning": SUSE_SET.pinning,
        "hold_patterns": SUSE_SET.hold,
    }


def test_zypper_installs_locks_upgrades_downgrades_and_refuses_a_missing_version(
    repository: str, tmp_path: Path
) -> None:
    box = box_of("zypper", tmp_path)
    box.write(
        "/etc/zypp/repos.d/cuda-sles15.repo",
        f"[cuda-sles15]\nname=stand-in NVIDIA\nenabled=1\nautorefresh=1\nbaseurl={repository}\n"
        "type=rpm-md\ngpgcheck=0\n",
    )
    names = SUSE_SET.install
    assert "nvidia-fabric-manager" in names  # Fabric Manager by name, at the driver's version

    changed, message = run_step(box, "zypper", suse_step(OLD))
    assert changed is True and f"installed driver {OLD} with zypper" in message
    assert rpm_versions(box, names) == dict.fromkeys(names, OLD)
    locks = box.run("zypper --non-interactive locks").stdout
    assert all(f" {name} " in locks for name in names)
    update = box.run("zypper --non-interactive --no-gpg-checks update")
    assert update.returncode == 0, update.stdout
    assert rpm_versions(box, names) == dict.fromkeys(names, OLD)  # the locks hold NEW back

    assert run_step(box, "zypper", suse_step(OLD)) == [False, f"driver {OLD} already installed"]

    changed, _ = run_step(box, "zypper", suse_step(NEW))
    assert changed is True and rpm_versions(box, names) == dict.fromkeys(names, NEW)
    changed, _ = run_step(box, "zypper", suse_step(OLD))
    assert changed is True and rpm_versions(box, names) == dict.fromkeys(names, OLD)
    locked = box.run("zypper --non-interactive locks").stdout

    failed, message = run_step(box, "zypper", suse_step("550.99.99"))
    assert failed == "failed"
    assert message == (
        "cuda-drivers-550 550.99.99 is not available from the zypper repositories "
        f"(they offer: {OLD}, {NEW}); nothing was changed"
    )
    assert rpm_versions(box, names) == dict.fromkeys(names, OLD)
    assert box.run("zypper --non-interactive locks").stdout == locked
