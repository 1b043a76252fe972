"""The zypper and dnf installers against the real package managers, on boxes whose roots hold them.

Each box is a private overlay of a root with a real zypper or a real dnf (tests/support/rpm_roots.py) that
says it is SLES 15 SP6 or RHEL 10; the repository is stand-in RPMs named and versioned like NVIDIA's, served
on 127.0.0.1. The node's installer runs inside the box with the box's own python3, exactly as the agent runs
it, and the test reads back what rpm and the manager's locks say: an exact version installed and locked,
old NVIDIA locks cleared (and no other), Fabric Manager in the same transaction, found by what it provides,
and a version the repository lacks refused before anything changes. (Up, down and a second apply through the
CLI: tests/e2e/test_driver_rpm_e2e.py.)
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from mgpu_provision import protocol
from mgpu_provision.catalog import sources
from mgpu_provision.fleet.bundle import agent_files
from mgpu_provision.node.packages import zypper
from tests.support import hosts, rpm_roots

OLD, NEW = rpm_roots.VERSIONS
SUSE_SET = sources.zypper_set("550", "default", fabricmanager=True)
# Carries one driver step out inside a box, on the node code copied there, as the agent's apply does; then
# reads the installed driver and Fabric Manager versions as facts do.
RUNNER = """\
import json, sys
sys.path.insert(0, "/opt/mgpu")
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.packages import driver, services
step = json.loads(sys.argv[1])
try:
    changed, message = driver.install(step, driver.installed_version())
except AgentFailure as exc:
    changed, message = "failed", exc.message
print(json.dumps([changed, message, driver.installed_version(), services.fabric_manager_version()]))
"""


def box_of(manager: str, folder: Path) -> rpm_roots.RpmBox:
    try:
        root = rpm_roots.ensure_manager_root(manager)
    except rpm_roots.RootUnavailable as exc:
        hosts.skip_or_fail(str(exc))
    box = rpm_roots.RpmBox(root, folder)
    for name, content in agent_files().items():  # what the agent ships, as it ships it
        if name.startswith("mgpu_provision/"):
            target = box.layers["upper"] / "opt" / "mgpu" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    box.write("/opt/mgpu/run_step.py", RUNNER)
    return box


def run_step(box: rpm_roots.RpmBox, step: dict[str, Any]) -> list[Any]:
    result = box.run(f"python3 /opt/mgpu/run_step.py {shlex.quote(json.dumps(step))}")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def rpm_versions(box: rpm_roots.RpmBox, names: list[str]) -> dict[str, str]:
    out = box.run(f"rpm -q --qf '%{{NAME}} %{{VERSION}}\\n' {' '.join(names)}").stdout
    return {p[0]: p[1] for p in (line.split() for line in out.splitlines()) if len(p) == 2}


def suse_step(version: str) -> dict[str, Any]:
    return protocol.driver_step("zypper", "cuda", "default", "550", version, True, True, packages=SUSE_SET)


def rhel10_step(version: str) -> dict[str, Any]:
    names = sources.dnf_packages("550", "default", exact=True, fabricmanager=True)
    packages = protocol.PackageSet([], names, [])
    return protocol.driver_step(
        "dnf", "rhel", "default", "550", version, True, True, packages=packages, modules=False
    )


def test_zypper_clears_old_nvidia_locks_and_locks_the_set_with_fabric_manager_by_name(
    rpm_repository: str, tmp_path: Path
) -> None:
    box = box_of("zypper", tmp_path)
    box.write(
        "/etc/zypp/repos.d/cuda-sles15.repo",
        f"[cuda-sles15]\nname=stand-in NVIDIA\nenabled=1\nautorefresh=1\nbaseurl={rpm_repository}\n"
        "type=rpm-md\ngpgcheck=0\n",
    )
    # A previous branch's lock (it would block nothing here, but stays wrong) and the admin's own lock.
    assert box.run("zypper --non-interactive addlock cuda-drivers-535 kernel-default").returncode == 0
    names = SUSE_SET.install
    assert "nvidia-fabric-manager" in names  # Fabric Manager by name, at the driver's version

    changed, message, installed, fabricmanager = run_step(box, suse_step(OLD))
    assert changed is True and f"installed driver {OLD} with zypper, {len(names)} packages locked" in message
    assert (installed, fabricmanager) == (OLD, OLD)  # as facts read them: by what the packages provide
    assert rpm_versions(box, names) == dict.fromkeys(names, OLD)
    locked = zypper.lock_names(box.run("zypper --non-interactive locks").stdout)
    assert sorted(locked) == sorted([*names, "kernel-default"])  # the old NVIDIA lock gone, the admin's kept


def test_dnf_clears_old_locks_installs_with_fabric_manager_and_refuses_a_missing_version_first(
    rpm_repository: str, tmp_path: Path
) -> None:
    box = box_of("dnf", tmp_path)
    repo = f"[cuda-rhel10]\nname=stand-in\ngpgcheck=0\nbaseurl={rpm_repository}\n"
    box.write("/etc/yum.repos.d/cuda-rhel10.repo", repo)
    # A lock a previous install left at another version: kept, it would make this one unresolvable.
    box.write("/etc/dnf/plugins/versionlock.list", f"nvidia-driver-0:{NEW}-1.*\n")
    names = ["nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-latest-dkms", "nvidia-fabric-manager"]

    changed, message, installed, fabricmanager = run_step(box, rhel10_step(OLD))
    assert changed is True, message
    assert rpm_versions(box, names) == dict.fromkeys(names, OLD)
    assert (installed, fabricmanager) == (OLD, OLD)  # FM found by what it provides: nvidia-fabricmanager
    locks = box.run("dnf -q versionlock list").stdout
    assert f"nvidia-driver-0:{OLD}" in locks and NEW not in locks
    assert run_step(box, rhel10_step(OLD))[:2] == [False, f"driver {OLD} already installed"]

    failed, message, *_ = run_step(box, rhel10_step("550.99.99"))
    assert (failed, message) == (
        "failed",
        f"nvidia-driver 550.99.99 is not available from the dnf repositories (they offer: {OLD}, {NEW}); "
        "nothing was changed",
    )
    assert box.run("dnf -q versionlock list").stdout == locks
