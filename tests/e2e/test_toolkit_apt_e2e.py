"""The NVIDIA Container Toolkit through the real apt and dpkg of the Debian-root test host: pinned, held,
moved to a new pin, from a signed repository on loopback (tests/apt_repo.py).

NVIDIA's libnvidia-container repository cannot be reached here, so it holds stand-in packages of the same
names, versions and dependencies (all four at one version: NVIDIA's install guide,
docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html; each version of
nvidia-container-toolkit depends on the others at exactly its version, as NVIDIA's debian/control does),
whose `nvidia-ctk --version` answers as the real CLI does ("NVIDIA Container Toolkit CLI version 1.17.8").
The source is configured by hand, as the install guide has a person do it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import cli
from mgpu_provision.catalog.containers import TOOLKIT_PACKAGES
from tests.support import apt_repo
from tests.support.hosts import HostFactory, TestHost, loopback_address, skip_or_fail

VERSIONS = ("1.17.8", "1.18.0")


def stand_in_debs(folder: Path) -> list[Path]:
    """The toolkit's four packages at each version, built with dpkg-deb."""
    debs = []
    for version in VERSIONS:
        for name in TOOLKIT_PACKAGES:
            tree = folder / f"{name}_{version}"
            (tree / "DEBIAN").mkdir(parents=True)
            depends = ""
            if name == "nvidia-container-toolkit":
                others = [p for p in TOOLKIT_PACKAGES if p != name]
                depends = "Depends: " + ", ".join(f"{p} (= {version}-1)" for p in others) + "\n"
            (tree / "DEBIAN" / "control").write_text(
                f"Package: {name}\nVersion: {version}-1\nArchitecture: all\n"
                f"Maintainer: test <t@example.com>\n{depends}Description: stand-in for NVIDIA's {name}\n"
            )
            if name == "nvidia-container-toolkit-base":
                cli_path = tree / "usr" / "bin" / "nvidia-ctk"
                cli_path.parent.mkdir(parents=True)
                cli_path.write_text(
                    '#!/bin/sh\n[ "$1" = --version ] && '
                    f'echo "NVIDIA Container Toolkit CLI version {version}"\necho "commit: stand-in"\n'
                )
                cli_path.chmod(0o755)
            deb = folder / f"{name}_{version}-1_all.deb"
            subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)], check=True,
                           capture_output=True)  # fmt: skip
            debs.append(deb)
    return debs


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def toolkit_changes(plan: dict[str, Any], host: TestHost) -> list[dict[str, Any]]:
    return [c for c in plan["hosts"][host.name]["changes"] if c["resource"] == "container-toolkit"]


def test_the_toolkit_is_pinned_and_held_with_the_real_apt_and_moves_with_the_pin(
    debian_host: TestHost, test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = apt_repo.available()
    if reason:
        skip_or_fail(reason)
    host = debian_host
    repo = apt_repo.build(tmp_path / "repo", stand_in_debs(tmp_path / "debs"), tmp_path / "gnupg", "toolkit")
    repo.serve(loopback_address(80))
    try:
        (host.dir / "toolkit.asc").write_text(repo.armored)
        host.run_in_root(
            "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && rm -rf /var/lib/apt/lists/*"
        )
        host.run_in_root(
            f"mkdir -p /etc/apt/keyrings && cat > /etc/apt/keyrings/nvidia-container-toolkit.asc <<'EOF'\n"
            f"{repo.armored}EOF\n"
            f"printf '{repo.sources('/etc/apt/keyrings/nvidia-container-toolkit.asc')}' "
            "> /etc/apt/sources.list.d/nvidia-container-toolkit.sources"
        )
        rig = tmp_path / "rig.yaml"
        common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]
        files = {"profile_d": None, "environment_file": None, "launcher": None}
        for version in VERSIONS:
            rigs = {host.rig: {"gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 1},
                               "containers": {"toolkit": version}}}  # fmt: skip
            test_hosts.write_rig(rig, [host], rigs=rigs, files=files)
            _, plan = cli_json(capsys, "plan", *common)
            [change] = toolkit_changes(plan, host)
            assert change["desired"] == version and change["applies"], change
            _, done = cli_json(capsys, "apply", *common, "--yes")
            assert any(
                line.startswith("container-toolkit: installed") for line in done["hosts"][host.name]["done"]
            )
            installed = host.run_in_root(
                "dpkg-query -W -f='${Package} ${Version}\\n' " + " ".join(TOOLKIT_PACKAGES)
            ).stdout.split("\n")
            assert sorted(filter(None, installed)) == sorted(f"{p} {version}-1" for p in TOOLKIT_PACKAGES)
            held = host.run_in_root("apt-mark showhold").stdout.split()
            assert sorted(held) == sorted(TOOLKIT_PACKAGES)
            _, plan = cli_json(capsys, "plan", *common)
            assert toolkit_changes(plan, host) == [], plan  # `nvidia-ctk --version` says the pinned one
    finally:
        repo.stop()
