"""The driver path against NVIDIA's real Debian packages: a test host whose root is a real Debian 12 system.

The host's sshd runs chrooted in an overlay of a cached Debian root (tests/support/debian_root.py), so `apply`
drives that root's own apt and dpkg, and facts run the bundled pynvml against the real libnvidia-ml.so.1
the packages install. The package set is `nvidia-smi` + `libnvidia-ml1` (the rig's `driver.packages`): the
userspace only, so the install completes without building a kernel module. Persistence mode is asked for,
so Debian's nvidia-persistenced (contrib, a version of its own) is installed after the driver and enabled
(systemctl works on unit files without a running systemd). No GPU and no NVIDIA kernel module exist here,
which is exactly the state right after a driver install before the reboot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import cli
from tests.support.hosts import HostFactory, TestHost

OLD, NEW = "535.216.03", "535.261.03"  # bookworm-backports and bookworm
DEB = {OLD: "535.216.03-2~bpo12+1", NEW: "535.261.03-1"}
SET = ["nvidia-smi", "libnvidia-ml1"]
# Everything at the driver's version (the two packages, what they pull in, and libnvidia-cfg1, which the
# persistence daemon pulls in), all of which must be held.
PINNED = ["libnvidia-cfg1", "libnvidia-ml1", "nvidia-alternative", "nvidia-legacy-check", "nvidia-smi"]


def write_rig(factory: HostFactory, path: Path, host: TestHost, version: str) -> Path:
    rig = {
        "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 1, "persistence_mode": True},
        "driver": {"version": version, "source": "debian", "packages": SET, "reboot": "never"},
    }
    return factory.write_rig(
        path,
        [host],
        rigs={host.rig: rig},
        files={"profile_d": None, "environment_file": None, "launcher": None},
    )


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def installed(host: TestHost) -> dict[str, str]:
    out = host.run_in_root(
        "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' '*nvidia*'"
    ).stdout
    return {p: v for p, v, s in (line.split() for line in out.splitlines() if len(line.split()) == 3)}


def held(host: TestHost) -> set[str]:
    return set(host.run_in_root("apt-mark showhold").stdout.split())


def test_debian_packages_install_hold_upgrade_downgrade_and_refuse_unknown_versions(
    debian_host: TestHost, test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = debian_host
    rig = tmp_path / "rig.yaml"
    common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]

    write_rig(test_hosts, rig, host, OLD)
    code, facts = cli_json(capsys, "facts", *common)
    assert facts["hosts"][host.name]["facts"]["driver"]["nvml"] == "no-driver"

    code, first = cli_json(capsys, "apply", *common, "--yes")
    assert code == 2, first  # installed; the reboot it needs is a manual step (reboot: never)
    assert {p: installed(host)[p] for p in PINNED} == dict.fromkeys(PINNED, DEB[OLD])
    assert set(PINNED) <= held(host)
    assert installed(host)["nvidia-persistenced"].startswith("535.171.04")  # contrib's own version
    assert host.run_in_root("systemctl is-enabled nvidia-persistenced").stdout.strip() == "enabled"

    code, facts = cli_json(capsys, "facts", *common)
    driver = facts["hosts"][host.name]["facts"]["driver"]
    assert (driver["nvml"], driver["installed"], driver["loaded"]) == ("driver-not-loaded", OLD, None)
    assert driver["reboot_required"] is True
    daemon = facts["hosts"][host.name]["facts"]["persistenced"]
    assert daemon == {  # starts at the boot that loads the driver, with the agent's drop-in
        "service": "inactive",
        "enabled": True,
        "exec_start": "/usr/bin/nvidia-persistenced --user nvpd --persistence-mode",
    }
    code, plan = cli_json(capsys, "plan", *common)
    summaries = [c["summary"] for c in plan["hosts"][host.name]["changes"]]
    assert f"installed {OLD}, no kernel module loaded: reboot required (policy: never)" in summaries

    code, again = cli_json(capsys, "apply", *common, "--yes")
    assert again["hosts"][host.name]["status"] != "changed", again

    host.run_in_root("apt-mark unhold nvidia-smi")  # by hand: unattended upgrades could now move it
    code, plan = cli_json(capsys, "plan", *common)
    summaries = [c["summary"] for c in plan["hosts"][host.name]["changes"]]
    assert f"hold driver {OLD} (1 package not held: nvidia-smi) (debian packages with apt)" in summaries
    code, result = cli_json(capsys, "apply", *common, "--yes")
    assert set(PINNED) <= held(host) and installed(host)["nvidia-smi"] == DEB[OLD]

    for version in (NEW, OLD):  # upgrade exactly, then downgrade exactly
        write_rig(test_hosts, rig, host, version)
        code, result = cli_json(capsys, "apply", *common, "--yes")
        assert result["hosts"][host.name]["status"] == "changed", result
        assert {p: installed(host)[p] for p in PINNED} == dict.fromkeys(PINNED, DEB[version])
        assert set(PINNED) <= held(host)

    before = installed(host), held(host)
    write_rig(test_hosts, rig, host, "535.999.99")
    code, result = cli_json(capsys, "apply", *common, "--yes")
    assert code != 0 and result["hosts"][host.name]["status"] == "failed"
    assert result["hosts"][host.name]["error"] == (
        "step 1 (driver) failed: nvidia-smi 535.999.99 is not available from the apt sources "
        "(they offer: 535.216.03, 535.261.03); nothing was changed"
    )
    assert (installed(host), held(host)) == before
