"""The signed local repository (tests/apt_repo.py) against the real apt of the Debian-root test host: NVIDIA's
real 535.216.03 packages resolve and install from it alone, a mirror missing a dependency names it, and a
mirror signed with another key is refused, naming the key."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import apt_repo, debian_root, hosts
from tests.hosts import TestHost

OLD = "535.216.03-2~bpo12+1"
KEYRING = "/etc/apt/keyrings/mgpu-test-mirror.gpg"


@pytest.fixture
def repos(tmp_path: Path) -> Iterator[list[apt_repo.SignedRepo]]:
    reason = apt_repo.available()
    if reason:
        hosts.skip_or_fail(reason)
    made: list[apt_repo.SignedRepo] = []
    yield made
    for repo in made:
        repo.stop()


def mirror(tmp_path: Path, name: str, leave_out: tuple[str, ...] = ()) -> apt_repo.SignedRepo:
    """The 535.216.03 set and its closure from the cached root, less `leave_out`, signed and served."""
    debs = [
        deb
        for deb in apt_repo.root_debs(debian_root.ensure_root())
        if "535.261" not in deb.name and deb.name.split("_")[0] not in leave_out
    ]
    repo = apt_repo.build(tmp_path / name, debs, tmp_path / f"{name}-gnupg", name=f"mgpu test {name}")
    repo.serve(hosts.loopback_address(80))
    return repo


def only_source(host: TestHost, repo: apt_repo.SignedRepo, keyring: Path) -> str:
    """Point the host's apt at the mirror alone (its Debian sources and cached packages gone); `apt-get
    update`'s output."""
    key = base64.b64encode(keyring.read_bytes()).decode()
    host.run_in_root(
        "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && rm -rf /var/lib/apt/lists/*"
        " && apt-get clean"
        f" && mkdir -p /etc/apt/keyrings && echo {key} | base64 -d > {KEYRING}"
        f" && printf '%s' '{repo.sources(KEYRING)}' > /etc/apt/sources.list.d/mirror.sources"
    )
    done = host.run_in_ns(f"chroot {host.chroot} apt-get update 2>&1", check=False)
    return done.stdout


def test_nvidia_packages_install_from_the_signed_mirror_alone(
    debian_host: TestHost, repos: list[apt_repo.SignedRepo], tmp_path: Path
) -> None:
    repo = mirror(tmp_path, "full")
    repos.append(repo)
    update = only_source(debian_host, repo, repo.keyring)
    assert "Err:" not in update and f"Get:1 {repo.url.rstrip('/')} ./ InRelease" in update, update
    install = debian_host.run_in_ns(
        f"chroot {debian_host.chroot} apt-get install -y --no-install-recommends nvidia-smi libnvidia-ml1"
        " 2>&1",
        check=False,
    )
    assert install.returncode == 0, install.stdout
    versions = debian_host.run_in_root("dpkg-query -W -f '${Package} ${Version}\\n' nvidia-smi libnvidia-ml1")
    assert versions.stdout.split() == ["libnvidia-ml1", OLD, "nvidia-smi", OLD]


def test_a_mirror_missing_a_dependency_names_it(
    debian_host: TestHost, repos: list[apt_repo.SignedRepo], tmp_path: Path
) -> None:
    repo = mirror(tmp_path, "partial", leave_out=("pciutils",))
    repos.append(repo)
    only_source(debian_host, repo, repo.keyring)
    simulated = debian_host.run_in_ns(
        f"chroot {debian_host.chroot} apt-get -s install --no-install-recommends nvidia-smi 2>&1", check=False
    )
    assert simulated.returncode != 0
    assert "pciutils" in simulated.stdout and "not installable" in simulated.stdout, simulated.stdout


def test_a_mirror_signed_with_another_key_is_refused_naming_the_key(
    debian_host: TestHost, repos: list[apt_repo.SignedRepo], tmp_path: Path
) -> None:
    repo = mirror(tmp_path, "signed")
    repos.append(repo)
    other = tmp_path / "other-gnupg"
    stranger = apt_repo.make_key(other, "someone else")
    keyring = tmp_path / "other.gpg"
    keyring.write_bytes(apt_repo._gpg(other, "--export", stranger))
    update = only_source(debian_host, repo, keyring)
    assert "is not signed" in update, update
    assert repo.fingerprint[-16:] in update.replace(" ", ""), update  # NO_PUBKEY <the mirror's key id>
