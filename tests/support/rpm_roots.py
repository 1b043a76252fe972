"""Test roots holding a real dnf or a real zypper, and a repository of stand-in NVIDIA RPMs to serve them.

The RHEL and SUSE driver paths must meet their real package managers, yet NVIDIA's RPM repositories cannot
be reached from here. Debian ships dnf 4.14 (with dnf-plugins-core for versionlock), zypper 1.14, rpm and
createrepo_c, so each manager gets a root of its own derived from the cached Debian root
(tests/support/debian_root.py; dnf-plugins-core and zypper conflict as Debian packages), cached beside it. The
packages are small noarch RPMs built here with rpmbuild, named and versioned like NVIDIA's (nvidia-driver,
nvidia-fabric-manager, ... at 550.54.15 and 550.90.07) and carrying the capabilities the agent asks rpm
about (libnvidia-ml.so.1), served as an rpm-md repository on 127.0.0.1 by a `python3 -m http.server` that
the test starts and stops by pid.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support import debian_root

MANAGERS = {
    # dnf-plugins-core brings `dnf versionlock`; python3-dnf-plugin-versionlock is the name RHEL gives it.
    "dnf": ("dnf", "dnf-plugins-core", "rpm"),
    "zypper": ("zypper", "rpm"),
}
# The distribution each root says it is (a recorded os-release), so that plan picks the manager it holds.
OS_RELEASE = {"dnf": "rhel-10.0", "zypper": "sles-15.6"}
OS_RELEASES = Path(__file__).resolve().parents[1] / "fixtures" / "os-release"
ROOT_RECIPE = 3  # bump when the derivation below changes
VERSIONS = ("550.54.15", "550.90.07")
# name -> extra spec lines: what NVIDIA's packages provide that the agent or the driver's deps look for.
STAND_INS = {
    # NVIDIA's RHEL names (node/packages/dnf.py); the driver provides the library the agent asks rpm about.
    "nvidia-driver": "Provides: libnvidia-ml.so.1()(64bit)\n",
    "nvidia-driver-cuda": "",
    "kmod-nvidia-latest-dkms": "",
    "kmod-nvidia-open-dkms": "",
    "cuda-drivers": "",
    "nvidia-open": "",
    "nvidia-fabric-manager": "Provides: nvidia-fabricmanager = %{version}\n",
    "libnvidia-nscq-550": "",
    "python3-dnf-plugin-versionlock": "",  # RHEL's name; the plugin itself is Debian's dnf-plugins-core
    # NVIDIA's SUSE names (node/packages/zypper.py): the branch metapackage pulls the G06 pieces in.
    "cuda-drivers-550": "Requires: nvidia-compute-utils-G06 = %{version}\n",
    "nvidia-open-550": "Requires: nvidia-compute-utils-G06 = %{version}\n",
    "nvidia-compute-utils-G06": "Provides: libnvidia-ml.so.1()(64bit)\n",
    "nvidia-driver-G06-kmp-default": "",
    "nvidia-open-driver-G06-signed-kmp-default": "",
}
# HGX B200 at 580: NVIDIA's names and version strings (gpu-driver-container rhel9/install.sh and
# ubuntu24.04/precompiled/nvidia-driver: FM, NSCQ, NVSDM at the driver's version, nvlsm and infiniband-diags
# at their own), SUSE's signed `-cuda-` KMP with the kernel after `_k` (nvidia-open-driver-G06-signed.spec),
# and RHEL 10's open set. name -> (version, release, extra spec lines).
NVLINK5_VERSION = "580.95.05"
SUSE_KMP = "nvidia-open-driver-G06-signed-cuda-kmp-default"
UNIT_FILE = (
    "%install\nmkdir -p %{buildroot}/usr/lib/systemd/system\n"
    "printf '[Service]\\nExecStart=/bin/true\\n[Install]\\nWantedBy=multi-user.target\\n' "
    "> %{buildroot}/usr/lib/systemd/system/nvidia-fabricmanager.service\n"
)
NVLINK5_STAND_INS: dict[str, tuple[str, str, str]] = {
    "nvidia-open-580": (NVLINK5_VERSION, "1", "Requires: nvidia-compute-utils-G06 = %{version}\n"),
    "nvidia-compute-utils-G06": (NVLINK5_VERSION, "1", "Provides: libnvidia-ml.so.1()(64bit)\n"),
    SUSE_KMP: (f"{NVLINK5_VERSION}_k6.4.0_150600.23.73", "1.1", ""),
    "nvidia-driver": (NVLINK5_VERSION, "1", "Provides: libnvidia-ml.so.1()(64bit)\n"),
    "nvidia-driver-cuda": (NVLINK5_VERSION, "1", ""),
    "kmod-nvidia-open-dkms": (NVLINK5_VERSION, "1", ""),
    "nvidia-fabricmanager": (NVLINK5_VERSION, "1", ""),
    "libnvidia-nscq": (NVLINK5_VERSION, "1", ""),
    "libnvsdm": (NVLINK5_VERSION, "1", ""),
    "nvlsm": ("2025.06.5", "1", ""),
    "infiniband-diags": ("50.0", "1.el10", ""),
    "python3-dnf-plugin-versionlock": ("4.3.0", "1", ""),
}
REPOSITORY_PORT = 8080
HOST_TOOLS = {"rpmbuild": "rpm", "createrepo_c": "createrepo-c"}


class RootUnavailable(debian_root.RootUnavailable):
    """The package-manager root or the repository cannot be made here."""


def missing_tools() -> list[str]:
    """Debian packages this machine lacks for building the stand-in repository."""
    return sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})


def ensure_manager_root(manager: str) -> Path:
    """The cached root with `manager` installed, derived from the cached Debian root on first use."""
    base = debian_root.ensure_root()
    root = base.with_name(f"{base.name}-{manager}-{ROOT_RECIPE}")
    if (root / ".complete").exists():
        return root
    with debian_root._locked(debian_root.CACHE / f".build-{manager}.lock"):
        if not (root / ".complete").exists():
            partial = root.with_name(root.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            _run(["cp", "-a", "--reflink=auto", str(base), str(partial)], f"copying the root for {manager}")
            (partial / ".complete").unlink()
            packages = " ".join(MANAGERS[manager])
            # Debian's rpm keeps root's database in ~/.rpmdb; RHEL's and SUSE's rpm, dnf and zypper use
            # /var/lib/rpm, so the root's rpm is told to as well. Debian enables dnf's `local` plugin (a
            # repository it rebuilds after every transaction), which no RHEL box has; $releasever is what
            # RHEL's system-release package gives dnf.
            debian_root.in_root(
                partial,
                f"apt-get install -q -y --no-install-recommends {packages} && apt-get clean"
                " && mkdir -p /etc/rpm /etc/dnf/vars && echo '%_dbpath /var/lib/rpm' > /etc/rpm/macros"
                " && echo 10 > /etc/dnf/vars/releasever"
                " && if [ -f /etc/dnf/plugins/local.conf ]; then"
                " sed -i 's/^enabled *= *true/enabled = false/' /etc/dnf/plugins/local.conf; fi",
            )
            release = partial / "etc" / "os-release"
            release.unlink()  # Debian's is a link to /usr/lib/os-release
            shutil.copy(OS_RELEASES / OS_RELEASE[manager], release)
            (partial / ".complete").write_text(f"{manager}\n")
            partial.rename(root)
    return root


class RpmBox:
    """A private overlay of a manager's root: commands run chrooted in it, each in throwaway mount and pid
    namespaces with /proc and a minimal /dev of its own (never the machine's), so the package managers
    change only the overlay's upper layer, which persists between commands like a box's disk."""

    def __init__(self, root: Path, folder: Path) -> None:
        self.root = root
        self.layers = {name: folder / name for name in ("upper", "work", "merged")}
        for layer in self.layers.values():
            layer.mkdir(parents=True, exist_ok=True)

    def run(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        merged = self.layers["merged"]
        lower, upper, work = self.root, self.layers["upper"], self.layers["work"]
        devices = " && ".join(
            f"mknod -m 666 {merged}/dev/{name} c {major} {minor}"
            for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("random", 1, 8), ("urandom", 1, 9))
        )
        script = " && ".join(
            [
                f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {merged}",
                f"mount -t proc proc {merged}/proc",
                f"mount -t tmpfs -o mode=755 tmpfs {merged}/dev",
                devices,
                f'exec chroot {merged} sh -c "$0"',
            ]
        )
        return subprocess.run(
            [*debian_root.NAMESPACES, "sh", "-c", script, command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def write(self, path: str, text: str) -> None:
        """Write a file of the box (into the upper layer, as the box's own disk would hold it)."""
        target = self.layers["upper"] / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def build_repository(folder: Path, versions: tuple[str, ...] = VERSIONS) -> Path:
    """An rpm-md repository of every stand-in at every version (cached under `folder`, which it returns)."""
    repo = folder / "repo"
    if (repo / "repodata" / "repomd.xml").exists():
        return repo
    missing = missing_tools()
    if missing:
        names = " ".join(missing)
        raise RootUnavailable(f"the stand-in RPMs need {names} (apt-get install {names})")
    top = folder / "rpmbuild"
    for version in versions:
        for name, extra in STAND_INS.items():
            spec = top / "SPECS" / f"{name}-{version}.spec"
            spec.parent.mkdir(parents=True, exist_ok=True)
            spec.write_text(
                f"Name: {name}\nVersion: {version}\nRelease: 1\nSummary: stand-in for NVIDIA's {name}\n"
                f"License: none\nBuildArch: noarch\n{extra}\n%description\nA test stand-in.\n\n%files\n"
            )
            _run(["rpmbuild", "--quiet", "--define", f"_topdir {top}", "-bb", str(spec)], f"rpmbuild {name}")
    repo.mkdir(parents=True, exist_ok=True)
    for rpm in (top / "RPMS" / "noarch").glob("*.rpm"):
        shutil.copy(rpm, repo / rpm.name)
    _run(["createrepo_c", "--quiet", str(repo)], "createrepo_c")
    return repo


@contextlib.contextmanager
def served(repo: Path, address: str, port: int) -> Iterator[str]:
    """Serve the repository folder over HTTP on a loopback address; yields its base URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", address, "--directory", str(repo)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(address, port)
        yield f"http://{address}:{port}/"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _wait_for(address: str, port: int) -> None:
    import socket
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex((address, port)) == 0:
                return
        time.sleep(0.05)
    raise RootUnavailable(f"the repository server on {address}:{port} did not start")


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RootUnavailable(f"{what} failed (exit {result.returncode}): " + " | ".join(tail))


def build_signed_repository(
    folder: Path, gnupg_home: Path, unsigned: tuple[str, ...] = ()
) -> tuple[Path, str]:
    """The HGX B200 stand-ins as an rpm-md repository whose packages (less `unsigned`) and metadata
    (`repomd.xml.asc`, with the key as `repomd.xml.key`, where zypper looks) are signed with a new key made
    in `gnupg_home`, as NVIDIA signs its repositories; (the folder, the armored public key)."""
    from tests.support import apt_repo

    missing = missing_tools()
    if missing or shutil.which("rpmsign") is None:
        raise RootUnavailable("a signed stand-in repository needs rpmbuild, rpmsign and createrepo_c")
    repo, top = folder / "repo", folder / "rpmbuild"
    repo.mkdir(parents=True)
    fingerprint = apt_repo.make_key(gnupg_home, f"mgpu stand-in {folder.name}")
    for name, (version, release, extra) in NVLINK5_STAND_INS.items():
        spec = top / "SPECS" / f"{name}.spec"
        spec.parent.mkdir(parents=True, exist_ok=True)
        files = (
            "/usr/lib/systemd/system/nvidia-fabricmanager.service\n" if name == "nvidia-fabricmanager" else ""
        )
        spec.write_text(
            f"Name: {name}\nVersion: {version}\nRelease: {release}\nSummary: stand-in for NVIDIA's {name}\n"
            f"License: none\nBuildArch: noarch\n{extra}\n%description\nA test stand-in.\n\n"
            f"{UNIT_FILE if files else ''}\n%files\n{files}"
        )
        _run(["rpmbuild", "--quiet", "--define", f"_topdir {top}", "-bb", str(spec)], f"rpmbuild {name}")
    sign = [
        "rpmsign",
        "--addsign",
        "--define",
        f"_gpg_name {fingerprint}",
        "--define",
        f"_gpg_path {gnupg_home}",
    ]
    sign += ["--define", f"__gpg {shutil.which('gpg')}"]  # Debian's rpm looks for gpg2
    for rpm in sorted((top / "RPMS" / "noarch").glob("*.rpm")):
        if rpm.name.rsplit("-", 2)[0] not in unsigned:
            _run([*sign, str(rpm)], f"rpmsign {rpm.name}")
        shutil.copy(rpm, repo / rpm.name)
    _run(["createrepo_c", "--quiet", str(repo)], "createrepo_c")
    repomd = repo / "repodata" / "repomd.xml"
    gpg = ["gpg", "--batch", "--quiet", "--homedir", str(gnupg_home), "--pinentry-mode", "loopback"]
    _run([*gpg, "--local-user", fingerprint, "--armor", "--detach-sign", str(repomd)], "signing repomd.xml")
    armored = subprocess.run([*gpg, "--armor", "--export", fingerprint], capture_output=True, text=True)
    (repo / "repodata" / "repomd.xml.key").write_text(armored.stdout)
    subprocess.run(["gpgconf", "--homedir", str(gnupg_home), "--kill", "gpg-agent"], capture_output=True)
    return repo, armored.stdout
