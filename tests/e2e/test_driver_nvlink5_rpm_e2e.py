"""An HGX B200 on RHEL 10 (real dnf) and SLES 15 SP6 (real zypper) gets NVLink5's whole set from a signed
mirror (`driver.repo`), through the CLI as a user runs it.

The mirror is stand-in RPMs with NVIDIA's and SUSE's names and version strings (tests/support/rpm_roots.py
`NVLINK5_STAND_INS`): Fabric Manager, NSCQ and NVSDM at the driver's 580.95.05, nvlsm 2025.06.5 and
infiniband-diags 50.0 at their own versions (NVIDIA/gpu-driver-container rhel9/install.sh installs those two
without one), SUSE's signed `-cuda-` KMP at `580.95.05_k6.4.0_150600.23.73`; packages and metadata signed
with a throwaway key, as NVIDIA signs its repositories. Proven here, against the real package managers:
issue 37 items 1 (the NVLink5 set installs, and a second apply changes nothing), 5 (signatures are checked:
an unsigned package is refused, the key is imported once) and 8 (the mirror is configured for dnf and
zypper; one signed with another key is refused and taken back before any package moves).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import cli
from tests.support import apt_repo, hosts, rpm_roots
from tests.support.hosts import HostFactory, TestHost, record_folder
from tests.support.nvlink5 import write_rig

VERSION = rpm_roots.NVLINK5_VERSION
# What each manager installs for an HGX B200 at 580 (open modules: Blackwell runs only those).
SETS = {
    "dnf": ["nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-open-dkms"],
    "zypper": ["nvidia-open-580", "nvidia-compute-utils-G06", rpm_roots.SUSE_KMP],
}
FABRIC = ["nvidia-fabricmanager", "libnvidia-nscq", "libnvsdm"]
OWN = {"nvlsm": "2025.06.5", "infiniband-diags": "50.0"}
REPO_FILES = {
    "dnf": "/etc/yum.repos.d/mgpu-provision-driver.repo",
    "zypper": "/etc/zypp/repos.d/mgpu-provision-driver.repo",
}


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def versions(host: TestHost) -> dict[str, str]:
    out = host.run_in_root("rpm -qa --qf '%{NAME} %{VERSION}\\n'").stdout
    return {p[0]: p[1] for p in (line.split() for line in out.splitlines()) if len(p) == 2}


@pytest.fixture
def signed_mirror(tmp_path: Path) -> Iterator[Any]:
    """Builds and serves signed stand-in repositories on this session's loopback range."""
    served: list[Any] = []

    # gpg-agent's socket lives in the home folder and a socket path has ~107 characters at most: under
    # xdist a parametrized test's tmp_path is longer than that, so the keys live in a short folder.
    homes = Path(tempfile.mkdtemp(prefix="mgpu-gpg-"))
    record_folder(homes)

    def make(name: str, unsigned: tuple[str, ...] = ()) -> tuple[str, str]:
        try:
            folder, key = rpm_roots.build_signed_repository(tmp_path / name, homes / name, unsigned)
        except rpm_roots.RootUnavailable as exc:
            hosts.skip_or_fail(str(exc))
        address = hosts.loopback_address(rpm_roots.REPOSITORY_PORT)
        context = rpm_roots.served(folder, address, rpm_roots.REPOSITORY_PORT)
        served.append(context)
        return context.__enter__(), key

    try:
        yield make
    finally:
        for context in served:
            context.__exit__(None, None, None)
        shutil.rmtree(homes, ignore_errors=True)


def start(manager: str, factory: HostFactory) -> TestHost:
    try:
        root = rpm_roots.ensure_manager_root(manager)
    except rpm_roots.RootUnavailable as exc:
        hosts.skip_or_fail(str(exc))
    return factory.start_root(f"{manager}-b200", root)


@pytest.mark.parametrize("manager", sorted(SETS))
def test_an_hgx_b200_gets_fabric_manager_nvlsm_nscq_and_nvsdm_from_a_signed_mirror(
    manager: str,
    signed_mirror: Any,
    test_hosts: HostFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    host = start(manager, test_hosts)
    url, key = signed_mirror("good")
    rig = tmp_path / "rig.yaml"
    common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]

    # Signed with another key: refused (gpgv, before anything is written), no package moved.
    write_rig(test_hosts, rig, host, url, apt_repo.stranger_key(tmp_path / "stranger"))
    before = versions(host)
    code, result = cli_json(capsys, "apply", *common, "--yes")
    assert result["hosts"][host.name]["status"] == "failed", result
    assert "is not signed by the key given in driver.repo.key" in result["hosts"][host.name]["error"]
    assert versions(host) == before
    assert host.run_in_root(f"test -e {REPO_FILES[manager]} || echo gone").stdout.strip() == "gone"

    write_rig(test_hosts, rig, host, url, key)
    code, plan = cli_json(capsys, "plan", *common)
    summaries = [c["summary"] for c in plan["hosts"][host.name]["changes"]]
    label = {"dnf": "rhel packages with dnf", "zypper": "cuda packages with zypper"}[manager]
    assert f"install driver {VERSION} ({label})" in summaries, summaries
    code, first = cli_json(capsys, "apply", *common, "--yes")
    assert first["hosts"][host.name]["status"] != "failed", first["hosts"][host.name]
    assert code == 2, first  # installed; the reboot it needs is a manual step (reboot: never)
    installed = versions(host)
    assert {n: installed.get(n, "").split("_k")[0] for n in SETS[manager] + FABRIC} == dict.fromkeys(
        SETS[manager] + FABRIC, VERSION
    )
    assert {n: installed.get(n) for n in OWN} == OWN  # at their own versions, never the driver's
    keys = host.run_in_root("rpm -q gpg-pubkey").stdout.split()
    assert len(keys) == 1, keys  # the mirror's key, imported once
    assert host.run_in_root("systemctl is-enabled nvidia-fabricmanager").stdout.strip() == "enabled"

    code, again = cli_json(capsys, "apply", *common, "--yes")
    assert again["hosts"][host.name]["status"] != "changed", again
    assert versions(host) == installed


@pytest.mark.parametrize("manager", sorted(SETS))
def test_an_unsigned_package_in_the_signed_mirror_is_refused(
    manager: str,
    signed_mirror: Any,
    test_hosts: HostFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    host = start(manager, test_hosts)
    url, key = signed_mirror("unsigned", unsigned=("libnvsdm",))
    rig = tmp_path / "rig.yaml"
    common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]
    write_rig(test_hosts, rig, host, url, key)
    _, result = cli_json(capsys, "apply", *common, "--yes")
    assert result["hosts"][host.name]["status"] == "failed", result
    error = result["hosts"][host.name]["error"]
    assert "libnvsdm" in error or "signed" in error.lower(), error
    assert "libnvsdm" not in versions(host)
