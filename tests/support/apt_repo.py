"""A signed apt repository on 127.0.0.1 holding NVIDIA's real Debian packages and what they depend on.

An internal mirror (`driver.repo`) is where air-gapped sites get their driver: apt must resolve the whole set
from it alone, trust it only through the keyring its source names, and say what is missing before anything
changes. This builds such a mirror as a flat repository (`Packages`, `Release`, clear-signed `InRelease`)
from .deb files, signs it with a throwaway ed25519 key made in its own GNUPGHOME, and serves it with
Python's http.server on a loopback address, stopped by its pid.

The packages come from the cached Debian root's apt cache (tests/support/debian_root.py downloads NVIDIA's
535.216.03 and 535.261.03 sets with their closure there), so building a repository reaches no network.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support import debian_root, rpm_roots

ARCHIVES = Path("var/cache/apt/archives")


@dataclass
class SignedRepo:
    """A built repository: its folder, the key's fingerprint and its armored public half (what
    `driver.repo.key` names, and what apt takes as an `.asc` keyring)."""

    folder: Path
    fingerprint: str
    armored: str
    address: str = ""
    port: int = 0
    server: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"

    def sources(self, keyring_path: str) -> str:
        """A deb822 source naming this repository, trusted only through `keyring_path` (as apply writes)."""
        return f"Types: deb\nURIs: {self.url}\nSuites: ./\nSigned-By: {keyring_path}\n"

    def serve(self, address: str) -> None:
        """Serve the folder on `address` (a loopback address) at a free port, until `stop()`."""
        self.address, self.port = address, _free_port(address)
        self.server = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(self.port), "--bind", address, "-d", str(self.folder)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex((address, self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"http.server did not listen on {address}:{self.port}")

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.kill(self.server.pid, signal.SIGTERM)
            self.server.wait(timeout=10)
        self.server = None


def root_debs(root: Path, names: tuple[str, ...] | None = None) -> list[Path]:
    """The .deb files of the cached root's apt cache (NVIDIA's sets and their closure), optionally only
    those whose package name is in `names`."""
    debs = sorted((root / ARCHIVES).glob("*.deb"))
    return [deb for deb in debs if names is None or deb.name.split("_")[0] in names]


def build(folder: Path, debs: list[Path], gnupg_home: Path, name: str = "mgpu test mirror") -> SignedRepo:
    """A flat repository of `debs` in `folder`, signed with a new key made in `gnupg_home`."""
    pool = folder / "pool"
    pool.mkdir(parents=True)
    stanzas = []
    for deb in debs:
        shutil.copy(deb, pool / deb.name)
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True)
        data = deb.read_bytes()
        stanzas.append(
            control.stdout.rstrip("\n")
            + f"\nFilename: pool/{deb.name}\nSize: {len(data)}\n"
            + f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    packages = ("\n".join(stanzas)).encode()
    (folder / "Packages").write_bytes(packages)
    release = (
        f"Origin: {name}\nLabel: {name}\nSuite: ./\nArchitectures: amd64 all\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}\n"
        f"SHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
    )
    (folder / "Release").write_text(release)
    fingerprint = make_key(gnupg_home, name)
    _gpg(
        gnupg_home,
        "--local-user",
        fingerprint,
        "--clearsign",
        "-o",
        str(folder / "InRelease"),
        str(folder / "Release"),
    )
    armored = _gpg(gnupg_home, "--armor", "--export", fingerprint).decode()
    return SignedRepo(folder, fingerprint, armored)


def make_key(gnupg_home: Path, name: str) -> str:
    """A throwaway ed25519 signing key without passphrase; its fingerprint."""
    gnupg_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    _gpg(gnupg_home, "--passphrase", "", "--quick-gen-key", name, "ed25519", "sign", "never")
    listing = _gpg(gnupg_home, "--with-colons", "--list-secret-keys", name).decode()
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def _gpg(home: Path, *args: str) -> bytes:
    argv = ["gpg", "--batch", "--quiet", "--homedir", str(home), "--pinentry-mode", "loopback", *args]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    finally:
        # gpg starts a gpg-agent per home folder that outlives the test; the next call starts it again.
        stop = ["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"]
        subprocess.run(stop, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"gpg {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port


def nvidia_mirror(folder: Path, address: str, leave_out: tuple[str, ...] = ()) -> SignedRepo:
    """NVIDIA's 535.216.03 set and its closure from the cached root (less `leave_out`), signed and served."""
    debs = [
        deb
        for deb in root_debs(debian_root.ensure_root())
        if "535.261" not in deb.name and deb.name.split("_")[0] not in leave_out
    ]
    repo = build(folder / "mirror", debs, folder / "gnupg", name=f"mgpu test {folder.name}")
    repo.serve(address)
    return repo


# HGX B200 at 580 from NVIDIA's CUDA repository for Ubuntu 24.04, as NVIDIA names and versions its debs
# (tests/fixtures/packages/cuda-ubuntu2404-madison-fabricmanager-580.txt; NVIDIA/gpu-driver-container
# ubuntu24.04/precompiled/nvidia-driver installs Fabric Manager, NSCQ and NVSDM at the driver's version and
# nvlsm and infiniband-diags at their own): the open driver set `nvidia-open-580` (tests hold it by its
# branch) pulling the library facts read the installed driver from, name -> (version, Depends).
NVLINK5_DRIVER = rpm_roots.NVLINK5_VERSION
NVLINK5_DEBS: dict[str, tuple[str, str]] = {
    "nvidia-open-580": (f"{NVLINK5_DRIVER}-0ubuntu1", f"libnvidia-compute-580 (= {NVLINK5_DRIVER}-0ubuntu1)"),
    "libnvidia-compute-580": (f"{NVLINK5_DRIVER}-0ubuntu1", ""),
    "nvidia-fabricmanager": (f"{NVLINK5_DRIVER}-1", ""),
    "libnvidia-nscq": (f"{NVLINK5_DRIVER}-1", ""),
    "libnvsdm": (f"{NVLINK5_DRIVER}-1", ""),
    "nvlsm": ("2025.06.5-1", ""),
    "infiniband-diags": ("50.0-1", ""),
}
FABRICMANAGER_UNIT = (
    "[Unit]\nDescription=stand-in\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"
)


def stand_in_debs(folder: Path) -> list[Path]:
    """NVLINK5_DEBS as .deb files (dpkg-deb --build) holding nothing but Fabric Manager's unit, which apply
    enables."""
    built = []
    for name, (version, depends) in NVLINK5_DEBS.items():
        tree = folder / name
        (tree / "DEBIAN").mkdir(parents=True)
        control = f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: test\n"
        control += f"Depends: {depends}\n" if depends else ""
        (tree / "DEBIAN" / "control").write_text(control + f"Description: stand-in for NVIDIA's {name}\n")
        if name == "nvidia-fabricmanager":
            unit = tree / "usr" / "lib" / "systemd" / "system" / "nvidia-fabricmanager.service"
            unit.parent.mkdir(parents=True)
            unit.write_text(FABRICMANAGER_UNIT)
        deb = folder / f"{name}_{version}_amd64.deb"
        subprocess.run(
            ["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)],
            check=True,
            capture_output=True,
        )
        built.append(deb)
    return built


def stranger_key(folder: Path) -> str:
    """Another throwaway key's armored public half: a mirror is not signed with it."""
    return _gpg(folder, "--armor", "--export", make_key(folder, "someone else")).decode()


def available() -> str | None:
    """Why a signed repository cannot be built here (None: it can)."""
    for tool in ("gpg", "dpkg-deb"):
        if shutil.which(tool) is None:
            return f"a signed test repository needs {tool} (apt-get install gnupg dpkg)"
    try:
        debian_root.ensure_root()
    except debian_root.RootUnavailable as exc:
        return str(exc)
    return None
