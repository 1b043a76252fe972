"""An HGX B200 on Ubuntu 24.04 with NVIDIA's CUDA repository gets NVLink5's whole set through the real apt and
dpkg, from a signed mirror (`driver.repo`), through the CLI as a user runs it (issue 37 items 1 and 6 on apt).

The mirror is stand-in .debs with NVIDIA's names and version strings (tests/support/apt_repo.py
`NVLINK5_DEBS`): the open set `nvidia-open-580` and its library at 580.95.05-0ubuntu1, Fabric Manager, NSCQ
and NVSDM at 580.95.05-1, nvlsm 2025.06.5-1 and infiniband-diags 50.0-1 at their own versions. The Debian 12
test root is given Ubuntu 24.04's os-release (tests/fixtures/os-release/ubuntu-24.04), so the node plans as
an Ubuntu box does: the 580 set held by its branch patterns and the unversioned Fabric Manager set by name.
Proven: nvlsm and infiniband-diags are installed at their own versions, never pinned nor held (item 1); the
unversioned Fabric Manager, NSCQ and NVSDM are held, so the next plan has no hold left to make and a second
apply changes nothing (item 6).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.support import apt_repo, hosts
from tests.support.hosts import HostFactory, TestHost
from tests.support.nodes import run_in_process
from tests.support.nvlink5 import write_rig

OS_RELEASE = Path(__file__).resolve().parents[1] / "fixtures" / "os-release" / "ubuntu-24.04"
AT_DRIVER = ["nvidia-open-580", "libnvidia-compute-580", "nvidia-fabricmanager", "libnvidia-nscq", "libnvsdm"]
OWN = {"nvlsm": "2025.06.5-1", "infiniband-diags": "50.0-1"}


def installed(host: TestHost) -> dict[str, tuple[str, str]]:
    """name -> (version, dpkg's status letters: ii, or hi when held)."""
    out = host.run_in_root("dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n'").stdout
    return {p[0]: (p[1], p[2]) for p in (line.split() for line in out.splitlines()) if len(p) == 3}


def test_an_ubuntu_hgx_b200_gets_fabric_manager_nvlsm_nscq_and_nvsdm_held_and_a_second_apply_is_clean(
    debian_host: TestHost, test_hosts: HostFactory, tmp_path: Path
) -> None:
    reason = apt_repo.available()
    if reason:
        hosts.skip_or_fail(reason)
    host = debian_host
    host.run_in_root("rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && rm -rf /var/lib/apt/lists/*")
    ubuntu = shlex.quote(OS_RELEASE.read_text())
    host.run_in_root(f"rm -f /etc/os-release && printf %s {ubuntu} > /etc/os-release")
    repo = apt_repo.build(tmp_path / "mirror", apt_repo.stand_in_debs(tmp_path / "debs"), tmp_path / "gnupg")
    repo.serve(hosts.loopback_address(80))
    try:
        rig = tmp_path / "rig.yaml"
        write_rig(test_hosts, rig, host, repo.url, repo.armored, source="cuda", hold=True)
        common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]

        plan = run_in_process("plan", *common, "--json").host(host.name)
        summaries = [c["summary"] for c in plan["changes"]]
        assert "install driver 580.95.05 (cuda packages with apt)" in summaries, summaries

        first = run_in_process("apply", *common, "--yes", "--json")
        assert first.host(host.name)["status"] != "failed", first.host(host.name)
        assert first.code == 2, first.out  # installed; the reboot it needs is a manual step (reboot: never)
        after = installed(host)
        assert {n: after[n] for n in AT_DRIVER} == {
            n: (apt_repo.NVLINK5_DEBS[n][0], "hi") for n in AT_DRIVER
        }  # at the driver's version, and held (the unversioned Fabric Manager set by name: item 6)
        assert {n: after[n] for n in OWN} == {n: (v, "ii") for n, v in OWN.items()}  # own versions, not held
        pin = host.run_in_root("cat /etc/apt/preferences.d/mgpu-provision-nvidia").stdout
        assert "nvlsm" not in pin and "infiniband-diags" not in pin, pin
        assert host.run_in_root("systemctl is-enabled nvidia-fabricmanager").stdout.strip() == "enabled"

        again = run_in_process("plan", *common, "--json").host(host.name)
        acting = [c for c in again["changes"] if c["resource"] in ("driver", "fabricmanager")]
        assert acting == [], acting  # nothing left to install or hold (the reboot is the reboot's)
        second = run_in_process("apply", *common, "--yes", "--json")
        assert second.host(host.name)["status"] != "changed", second.host(host.name)
        assert installed(host) == after
    finally:
        repo.stop()
