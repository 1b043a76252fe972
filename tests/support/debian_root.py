"""A real Debian 12 root filesystem for test hosts, built once from Debian's registry and cached.

The driver path must meet a real package manager: a test host started from this root (tests/support/hosts.py
`HostFactory.start_debian`) runs its sshd chrooted into an overlay of it, so the agent drives the root's own
apt and dpkg and installs NVIDIA's real Debian packages. The root is built with mmdebstrap (minbase, the
`main contrib non-free non-free-firmware` components of bookworm and bookworm-backports, from the mirror
this machine's own apt sources name), its package lists refreshed and the NVIDIA packages the e2e installs
downloaded into its apt cache, so a test reaches the mirror only to revalidate the lists. It lives outside
the repository and is reused while its recipe (the key of its folder name) is unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

CACHE = Path(os.environ.get("MGPU_TEST_ROOT_CACHE", "/var/cache/mgpu-provision-tests"))
SUITE = "bookworm"
COMPONENTS = "main contrib non-free non-free-firmware"
# systemd is there for its systemctl, which works on unit files without a running manager (enable, disable,
# is-enabled), so the e2e can enable nvidia-persistenced as on a real box.
INCLUDE = ("openssh-server", "python3", "ca-certificates", "systemd")
# What the e2e installs (userspace only: no kernel module is built; the persistence daemon and the library it
# pulls in), at both versions on offer, downloaded into the root's apt cache.
NVIDIA_SET = ("nvidia-smi", "libnvidia-ml1", "nvidia-persistenced")
NVIDIA_VERSIONS = ("535.216.03-2~bpo12+1", "535.261.03-1")
RECIPE = 2  # bump when the build below changes in a way the key would not see
PREFETCH_PIN = "/etc/apt/preferences.d/prefetch"
APT_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))


class RootUnavailable(Exception):
    """The root cannot be built here; the message says why and what to install."""


def debian_mirror(places: tuple[Path, ...] = APT_SOURCES) -> str:
    """The Debian mirror this machine's apt uses (deb822 `.sources` or one-line `.list`), read at run time."""
    files: list[Path] = []
    for place in places:
        if place.is_dir():
            files += sorted(place.glob("*.sources")) + sorted(place.glob("*.list"))
        elif place.exists():
            files.append(place)
    for path in files:
        text = path.read_text(errors="replace")
        for stanza in text.split("\n\n") if path.suffix == ".sources" else []:
            fields = dict(
                (key.strip().lower(), value.strip())
                for key, _, value in (line.partition(":") for line in stanza.splitlines())
                if not key.startswith("#")
            )
            if SUITE in fields.get("suites", "").split() and fields.get("uris"):
                return fields["uris"].split()[0]
        for line in text.splitlines() if path.suffix != ".sources" else []:
            words = [w for w in line.split() if not w.startswith("[")]
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                return words[1]
    raise RootUnavailable(
        f"no apt source of this machine names a Debian {SUITE} mirror; set MGPU_TEST_DEBIAN_MIRROR to one"
    )


def recipe(mirror: str) -> dict[str, object]:
    return {
        "recipe": RECIPE,
        "suite": SUITE,
        "components": COMPONENTS,
        "include": INCLUDE,
        "nvidia": NVIDIA_SET,
        "versions": NVIDIA_VERSIONS,
        "mirror": mirror,
    }


def ensure_root() -> Path:
    """The cached root for the current recipe, built first if it is missing (about a minute)."""
    if shutil.which("mmdebstrap") is None:
        raise RootUnavailable("the Debian test root needs mmdebstrap (apt-get install mmdebstrap)")
    mirror = os.environ.get("MGPU_TEST_DEBIAN_MIRROR") or debian_mirror()
    key = hashlib.sha256(json.dumps(recipe(mirror), sort_keys=True).encode()).hexdigest()[:16]
    root = CACHE / f"{SUITE}-{key}"
    if (root / ".complete").exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    with _locked(CACHE / ".build.lock"):  # xdist workers and other checkouts build it once
        if not (root / ".complete").exists():
            _build(root, mirror)
    return root


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _build(root: Path, mirror: str) -> None:
    started = time.monotonic()
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    sources = [f"deb {mirror} {suite} {COMPONENTS}" for suite in (SUITE, f"{SUITE}-backports")]
    _run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            f"--components={COMPONENTS.replace(' ', ',')}",
            f"--include={','.join(INCLUDE)}",
            SUITE,
            str(partial),
            *sources,
        ],
        "mmdebstrap",
    )
    # Lists and packages kept in the root: a test then only revalidates the lists against the mirror.
    steps = ["apt-get update -q"]
    for version in NVIDIA_VERSIONS:
        steps += [
            f"printf 'Package: *nvidia*\\nPin: version {version}\\nPin-Priority: 1001\\n' > {PREFETCH_PIN}",
            f"apt-get install -q -y --download-only --no-install-recommends {' '.join(NVIDIA_SET)}",
        ]
    steps.append(f"rm {PREFETCH_PIN}")
    in_root(partial, " && ".join(steps))
    (partial / ".complete").write_text(f"built in {time.monotonic() - started:.0f} s\n")
    partial.rename(root)


# Private mount, UTS and pid namespaces: the root's mounts and processes vanish with its first process.
NAMESPACES = ["unshare", "--mount", "--uts", "--pid", "--fork", "--propagation", "private"]


def root_mounts(root: Path) -> list[str]:
    """What a chroot into `root` needs mounted (inside NAMESPACES): /proc, and /dev with its devpts."""
    return [f"mount -t proc proc {root}/proc", f"mount --rbind /dev {root}/dev"]


def in_root(root: Path, command: str) -> None:
    """Run a shell command chrooted into `root`, with /proc and /dev, in throwaway namespaces."""
    script = " && ".join([*root_mounts(root), f'exec chroot {root} sh -c "$0"'])
    _run([*NAMESPACES, "sh", "-c", script, command], "building the Debian root")


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RootUnavailable(f"{what} failed (exit {result.returncode}): " + " | ".join(tail))
