"""The signed local repository (tests/apt_repo.py) against the real apt of the Debian-root test host: NVIDIA's
real 535.216.03 packages resolve and install from it alone, a mirror missing a dependency names it, and a
mirror signed with another key is refused, naming the key."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

from tests import apt_repo
from tests.hosts import TestHost

Mirrors = Callable[..., apt_repo.SignedRepo]

OLD = "535.216.03-2~bpo12+1"
KEYRING = "/etc/apt/keyrings/mgpu-test-mirror.asc"


def only_source(host: TestHost, repo: apt_repo.SignedRepo, keyring: str) -> str:
    """Point the host's apt at the mirror alone (its Debian sources and cached packages gone); `apt-get
    update`'s output."""
    key = base64.b64encode(keyring.encode()).decode()
    host.run_in_root(
        "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && rm -rf /var/lib/apt/lists/*"
        " && apt-get clean"
        f" && mkdir -p /etc/apt/keyrings && echo {key} | base64 -d > {KEYRING}"
        f" && printf '%s' '{repo.sources(KEYRING)}' > /etc/apt/sources.list.d/mirror.sources"
    )
    done = host.run_in_ns(f"chroot {host.chroot} apt-get update 2>&1", check=False)
    return done.stdout


def test_nvidia_packages_install_from_the_signed_mirror_alone(
    debian_host: TestHost, mirrors: Mirrors
) -> None:
    repo = mirrors("full")
    update = only_source(debian_host, repo, repo.armored)
    assert "Err:" not in update and f"Get:1 {repo.url.rstrip('/')} ./ InRelease" in update, update
    install = debian_host.run_in_ns(
        f"chroot {debian_host.chroot} apt-get install -y --no-install-recommends nvidia-smi libnvidia-ml1"
        " 2>&1",
        check=False,
    )
    assert install.returncode == 0, install.stdout
    versions = debian_host.run_in_root("dpkg-query -W -f '${Package} ${Version}\\n' nvidia-smi libnvidia-ml1")
    assert versions.stdout.split() == ["libnvidia-ml1", OLD, "nvidia-smi", OLD]


def test_a_mirror_missing_a_dependency_names_it(debian_host: TestHost, mirrors: Mirrors) -> None:
    repo = mirrors("partial", leave_out=("pciutils",))
    only_source(debian_host, repo, repo.armored)
    simulated = debian_host.run_in_ns(
        f"chroot {debian_host.chroot} apt-get -s install --no-install-recommends nvidia-smi 2>&1", check=False
    )
    assert simulated.returncode != 0
    assert "pciutils" in simulated.stdout and "not installable" in simulated.stdout, simulated.stdout


def test_a_mirror_signed_with_another_key_is_refused_naming_the_key(
    debian_host: TestHost, mirrors: Mirrors, tmp_path: Path
) -> None:
    repo = mirrors("signed")
    keyring = tmp_path / "other.asc"  # apt takes an armored keyring by its .asc name
    keyring.write_text(apt_repo.stranger_key(tmp_path / "other-gnupg"))
    update = only_source(debian_host, repo, keyring.read_text())
    assert "is not signed" in update, update
    assert repo.fingerprint[-16:] in update.replace(" ", ""), update  # NO_PUBKEY <the mirror's key id>
