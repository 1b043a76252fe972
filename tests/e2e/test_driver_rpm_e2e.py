"""The driver on RHEL and SUSE boxes: plan picks dnf or zypper from the box's os-release, apply drives it.

Each test host's sshd runs chrooted in an overlay of a root that holds the real dnf (with versionlock) or
the real zypper and says it is RHEL 10 or SLES 15 SP6 (tests/support/rpm_roots.py). The repository is
stand-in RPMs named and versioned like NVIDIA's, served on 127.0.0.1. Through the CLI, as a user runs it:
install an exact version and lock it, the manager's own upgrade held back by the lock, a second apply
changing nothing, up and down between versions, and a version the repository lacks refused before anything
changes.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import cli
from tests.support import hosts, rpm_roots
from tests.support.hosts import HostFactory, TestHost

OLD, NEW = rpm_roots.VERSIONS
# manager -> (repository file, its text before the URL, the set apply installs, how to list the locks,
# the manager's own upgrade of everything, what plan says the source is)
MANAGERS: dict[str, tuple[str, str, list[str], str, str, str]] = {
    "dnf": (
        "/etc/yum.repos.d/cuda-rhel10.repo",
        "[cuda-rhel10]\nname=stand-in NVIDIA\ngpgcheck=0\nbaseurl=",
        ["nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-latest-dkms"],
        "dnf -q versionlock list",
        "dnf -y upgrade",
        "rhel packages with dnf",
    ),
    "zypper": (
        "/etc/zypp/repos.d/cuda-sles15.repo",
        "[cuda-sles15]\nname=stand-in NVIDIA\nenabled=1\nautorefresh=1\ntype=rpm-md\ngpgcheck=0\nbaseurl=",
        ["cuda-drivers-550", "nvidia-compute-utils-G06", "nvidia-driver-G06-kmp-default"],
        "zypper --non-interactive locks",
        "zypper --non-interactive --no-gpg-checks update",
        "cuda packages with zypper",
    ),
}


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def write_rig(factory: HostFactory, path: Path, host: TestHost, version: str) -> Path:
    rig = {"gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 1}, "driver": {"version": version}}
    return factory.write_rig(
        path,
        [host],
        rigs={host.rig: rig},
        files={"profile_d": None, "environment_file": None, "launcher": None},
    )


def versions(host: TestHost, names: list[str]) -> dict[str, str]:
    out = host.run_in_root(f"rpm -q --qf '%{{NAME}} %{{VERSION}}\\n' {' '.join(names)}").stdout
    return {p[0]: p[1] for p in (line.split() for line in out.splitlines()) if len(p) == 2}


@pytest.mark.parametrize("manager", sorted(MANAGERS))
def test_rpm_packages_install_lock_upgrade_downgrade_and_refuse_unknown_versions(
    manager: str,
    rpm_repository: str,
    test_hosts: HostFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    repo_file, repo_text, names, list_locks, upgrade_all, label = MANAGERS[manager]
    try:
        root = rpm_roots.ensure_manager_root(manager)
    except rpm_roots.RootUnavailable as exc:
        hosts.skip_or_fail(str(exc))
    host = test_hosts.start_root(f"{manager}-a", root)
    text = shlex.quote(f"{repo_text}{rpm_repository}\n")
    host.run_in_root(f"mkdir -p {Path(repo_file).parent} && printf %s {text} > {repo_file}")
    rig = tmp_path / "rig.yaml"
    common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]

    write_rig(test_hosts, rig, host, OLD)
    code, plan = cli_json(capsys, "plan", *common)
    summaries = [c["summary"] for c in plan["hosts"][host.name]["changes"]]
    assert f"install driver {OLD} ({label})" in summaries, summaries

    code, first = cli_json(capsys, "apply", *common, "--yes")
    assert code == 2, first  # installed; the reboot it needs is a manual step (reboot: never)
    assert versions(host, names) == dict.fromkeys(names, OLD)
    locks = host.run_in_root(list_locks).stdout
    assert all(name in locks for name in names), locks
    host.run_in_root(upgrade_all)
    assert versions(host, names) == dict.fromkeys(names, OLD)  # the locks hold NEW back

    code, facts = cli_json(capsys, "facts", *common)
    assert facts["hosts"][host.name]["facts"]["driver"]["installed"] == OLD
    code, again = cli_json(capsys, "apply", *common, "--yes")
    assert again["hosts"][host.name]["status"] != "changed", again

    for version in (NEW, OLD):  # upgrade exactly, then downgrade exactly
        write_rig(test_hosts, rig, host, version)
        code, result = cli_json(capsys, "apply", *common, "--yes")
        assert result["hosts"][host.name]["status"] == "changed", result
        assert versions(host, names) == dict.fromkeys(names, version)

    before = versions(host, names), host.run_in_root(list_locks).stdout
    write_rig(test_hosts, rig, host, "550.99.99")
    code, result = cli_json(capsys, "apply", *common, "--yes")
    assert code != 0 and result["hosts"][host.name]["status"] == "failed"
    error = result["hosts"][host.name]["error"]
    assert f"{names[0] if manager == 'dnf' else 'cuda-drivers-550'} 550.99.99 is not available" in error
    assert f"(they offer: {OLD}, {NEW}); nothing was changed" in error
    assert (versions(host, names), host.run_in_root(list_locks).stdout) == before
