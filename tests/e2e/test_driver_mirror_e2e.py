"""`driver.repo` end to end: the Debian-root test host, whose own Debian sources are gone, gets NVIDIA's real
535.216.03 packages from a signed mirror on 127.0.0.1 (tests/support/apt_repo.py) through plan and apply. A
mirror missing a dependency, or signed with another key, is a failed check in plan naming it, and apply
changes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import cli
from tests.support import apt_repo
from tests.support.hosts import HostFactory, TestHost

OLD = "535.216.03"
DEB = "535.216.03-2~bpo12+1"


def write_rig(factory: HostFactory, path: Path, host: TestHost, repo: apt_repo.SignedRepo, key: str) -> None:
    (path.parent / "mirror.asc").write_text(key)
    rig = {
        "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 1},
        "driver": {
            "version": OLD,
            "source": "debian",
            "packages": ["nvidia-smi", "libnvidia-ml1"],
            "reboot": "never",
            "repo": {"url": repo.url, "key": "mirror.asc"},
        },
    }
    files = {"profile_d": None, "environment_file": None, "launcher": None}
    factory.write_rig(path, [host], rigs={host.rig: rig}, files=files)


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def failed_checks(plan: dict[str, Any], host: TestHost) -> list[str]:
    """The driver's failed checks (no GPU here: the GPU checks fail on every plan)."""
    changes = plan["hosts"][host.name]["changes"]
    return [c["summary"] for c in changes if c["action"] == "verify-failed" and c["resource"] == "driver"]


def test_the_driver_installs_from_the_mirror_alone_and_a_bad_mirror_is_named_in_plan(
    debian_host: TestHost,
    test_hosts: HostFactory,
    mirrors: Callable[..., apt_repo.SignedRepo],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    host = debian_host
    host.run_in_root("rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && rm -rf /var/lib/apt/lists/*")
    host.run_in_root("apt-get clean")
    rig = tmp_path / "rig.yaml"
    common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]

    partial = mirrors("partial", leave_out=("pciutils",))
    write_rig(test_hosts, rig, host, partial, partial.armored)
    code, plan = cli_json(capsys, "plan", *common)
    assert any("lacks pciutils" in s for s in failed_checks(plan, host)), plan

    full = mirrors("full")
    write_rig(test_hosts, rig, host, full, apt_repo.stranger_key(tmp_path / "stranger"))
    code, plan = cli_json(capsys, "plan", *common)
    assert any(full.fingerprint[-16:] in s for s in failed_checks(plan, host)), plan
    code, result = cli_json(capsys, "apply", *common, "--yes")
    assert result["hosts"][host.name]["status"] == "failed", result
    assert "not signed by the key given in driver.repo" in result["hosts"][host.name]["error"]
    assert host.run_in_root("ls /etc/apt/sources.list.d").stdout.strip() == ""  # nothing was changed

    write_rig(test_hosts, rig, host, full, full.armored)
    code, plan = cli_json(capsys, "plan", *common)
    assert failed_checks(plan, host) == [], plan
    code, result = cli_json(capsys, "apply", *common, "--yes")
    assert code == 2, result  # installed; the reboot it needs is a manual step (reboot: never)
    out = host.run_in_root("dpkg-query -W -f '${Package} ${Version}\\n' nvidia-smi libnvidia-ml1").stdout
    assert out.split() == ["libnvidia-ml1", DEB, "nvidia-smi", DEB]
    source = host.run_in_root("cat /etc/apt/sources.list.d/mgpu-provision-driver.sources").stdout
    assert (
        f"URIs: {full.url}" in source and "Signed-By: /etc/apt/keyrings/mgpu-provision-driver.asc" in source
    )
