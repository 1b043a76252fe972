"""Issue 37 item 8 at plan: a box whose package manager has none of NVIDIA's repositories (no CUDA repository
configured, no `driver.repo`) fails the driver's check in plan, naming the installation guide's repository
step for its distribution (the keyring package for apt, the .repo file for dnf, `zypper addrepo` for zypper),
before any install is asked of the agent. The node reads the package manager's own repository files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mgpu_provision.node.core import system
from mgpu_provision.node.packages import common
from tests.support.converge import changes_of

TWINS = Path(__file__).resolve().parents[2] / "examples" / "twins"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "packages"
RIG = """\
version: 1
hosts: [{{name: box, address: 10.0.0.5, rig: one}}]
rigs:
  one: {{gpus: {{model: "NVIDIA GeForce RTX 4090", count: 1}}, driver: {{version: "580.95.05"{driver}}}}}
files: {{profile_d: null, environment_file: null, launcher: null}}
"""
RELEASES = {
    "ubuntu": (
        "{id: ubuntu, version_id: '24.04', like: [debian]}",
        ", source: cuda",
        "cuda-keyring_1.1-1_all.deb",
    ),
    "rhel": ("{id: rhel, version_id: '9.6', like: [fedora]}", "", "config-manager --add-repo"),
    "sles": ("{id: sles, version_id: '15.6', like: [suse]}", "", "zypper addrepo"),
}


def _box(tmp_path: Path, distro: str, nvidia_repository: bool) -> tuple[Path, Path]:
    release, driver, _ = RELEASES[distro]
    twin = tmp_path / "box.yaml"
    text = (TWINS / "rtx4090-pcie.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("os_release")]
    lines += [f"os_release: {release}", f"nvidia_repository: {str(nvidia_repository).lower()}"]
    twin.write_text("\n".join(lines) + "\n")
    (tmp_path / "rig.yaml").write_text(RIG.format(driver=driver))
    return tmp_path / "rig.yaml", twin


@pytest.mark.parametrize("distro", sorted(RELEASES))
def test_no_nvidia_repository_fails_the_plan_before_any_install(tmp_path: Path, distro: str) -> None:
    rig, twin = _box(tmp_path, distro, nvidia_repository=False)
    (check,) = changes_of(rig, "box", twin, ("driver", "reboot"))
    assert check.action == "verify-failed" and check.agent_step is None
    assert "NVIDIA's CUDA repository is not configured on this box" in check.summary
    assert RELEASES[distro][2] in check.summary

    configured, _ = _box(tmp_path, distro, nvidia_repository=True)
    install, _reboot = changes_of(configured, "box", twin.with_name("box.yaml"), ("driver", "reboot"))
    assert install.action in ("create", "update") and install.agent_step is not None


def test_a_driver_repo_is_not_asked_about(tmp_path: Path) -> None:
    rig, twin = _box(tmp_path, "rhel", nvidia_repository=False)
    (tmp_path / "mirror.asc").write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    rig.write_text(
        rig.read_text().replace('"580.95.05"', '"580.95.05", repo: {url: "http://m.lab/", key: mirror.asc}')
    )
    install, _reboot = changes_of(rig, "box", twin, ("driver", "reboot"))
    assert install.agent_step is not None and install.agent_step["repo"] is not None


@pytest.mark.parametrize(
    ("release", "pattern", "fixture"),
    [
        ('ID=ubuntu\nVERSION_ID="24.04"\nID_LIKE=debian\n', "apt", "cuda-ubuntu2404-x86_64.list"),
        ('ID="rhel"\nVERSION_ID="9.6"\nID_LIKE="fedora"\n', "dnf", "cuda-rhel9.repo"),
    ],
)
def test_the_node_reads_its_package_managers_repository_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: str, pattern: str, fixture: str
) -> None:
    monkeypatch.setitem(common.REPOSITORY_FILES, pattern, (str(tmp_path / "*"),))
    parsed = system.os_release(release)
    (tmp_path / "other.list").write_text("deb http://deb.debian.org/debian bookworm main\n")
    assert "not configured on this box" in (common.nvidia_repository_missing(parsed) or "")
    shutil.copy(FIXTURES / fixture, tmp_path / "mirror")  # NVIDIA's path, under another name
    assert common.nvidia_repository_missing(parsed) is None
    (tmp_path / "mirror").unlink()
    (tmp_path / fixture).write_text("[cuda]\nbaseurl=http://127.0.0.1/\n")  # NVIDIA's name, another address
    assert common.nvidia_repository_missing(parsed) is None
