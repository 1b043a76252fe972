"""The real podman of the container tests: a local image made without any registry, run inside a test host's
mount namespace so that it reads that host's /etc/cdi and /var/run/cdi.

What this sandbox needs (podman 4.3.1 of Debian 12, found by trying): a storage root and run root of the
test's own (`--root`/`--runroot` under a temporary folder: the machine's podman state is never touched),
`--storage-driver vfs` (no overlay in the sandbox), `--runtime runc` (crun 1.8 refuses cgroup v1 "hybrid"
mode here, and runc refuses `--cgroups disabled`, so `--cgroup-manager cgroupfs` with cgroups on),
`--ulimit nofile=1024:1024 --ulimit nproc=1024:1024` (podman's root defaults exceed this sandbox's hard
limits: setrlimit EPERM), `--network none` and `--events-backend none` (no journald), `--tmpdir` of its
own (else /run/libpod). An import still writes containers/image's blob cache to /var/lib/containers/cache
whatever `--root` says, so every podman command runs in a mount namespace of its own with a private folder
over /var/lib/containers. The image is `podman import` of a tarball holding Debian's static busybox
(package busybox-static).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.support.hosts import record_folder

IMAGE = "localhost/mgpu-busybox:test"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: no library to carry into the image
SHARED_STATE = "/var/lib/containers"  # where containers/image keeps its blob cache for root


def unavailable() -> str | None:
    """Why podman cannot run here, or None."""
    missing = [name for name in ("podman", "runc", "nsenter") if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (.ci/system-packages: podman, runc, busybox-static)"
    if not BUSYBOX.exists():
        return "busybox-static is not installed (/bin/busybox)"
    return None


class Podman:
    """podman with storage of its own in a folder of its own, its image imported once."""

    def __init__(self) -> None:
        # Short: podman refuses a run root longer than 50 characters (pytest's tmp_path is longer).
        self.folder = folder = Path(tempfile.mkdtemp(prefix="mgpu-podman-", dir="/tmp"))
        record_folder(folder)
        self.base = [
            "podman",
            "--root", str(folder / "root"),
            "--runroot", str(folder / "runroot"),
            "--storage-driver", "vfs",
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "none",
            "--runtime", "runc",
            "--tmpdir", str(folder / "tmp"),
        ]  # fmt: skip
        (folder / "cache").mkdir(exist_ok=True)
        Path(SHARED_STATE).mkdir(parents=True, exist_ok=True)  # the mount point (empty on the machine)
        image = folder / "busybox.tar"
        with tarfile.open(image, "w") as tar:
            tar.add(BUSYBOX, arcname="bin/busybox")
            for applet in ("sh", "ls", "cat", "test"):
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        done = subprocess.run(self._private([*self.base, "import", str(image), IMAGE]), capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"podman import failed (exit {done.returncode}): {done.stderr.strip()}")

    def _private(self, argv: list[str]) -> list[str]:
        """`argv` in a mount namespace of its own whose /var/lib/containers is this podman's folder."""
        script = f'mount --bind "$1" {SHARED_STATE} && shift && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                str(self.folder / "cache"), *argv]  # fmt: skip

    def run_in(self, pid: int, device: str, command: str) -> subprocess.CompletedProcess[str]:
        """`podman run --device <device>` inside the mount namespace of process `pid` (a test host)."""
        run = [
            *self.base, "run", "--rm", "--network", "none",
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
            "--device", device, IMAGE, "/bin/sh", "-c", command,
        ]  # fmt: skip
        argv = ["nsenter", "-t", str(pid), "-m", "--", *self._private(run)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def close(self) -> None:
        """Remove what the runs left (containers are --rm; the image and the storage go with the folder)."""
        subprocess.run(self._private([*self.base, "rm", "--all", "--force"]), capture_output=True, timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)
