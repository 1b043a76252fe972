"""A test host with real systemd as PID 1, booted from an overlay of the cached Debian root.

What systemd holds across a boot (a unit's effective ExecStart after a drop-in, what is enabled and ordered
after what) cannot be shown by `systemctl` on unit files alone: only a running manager merges drop-ins and
starts units at boot. So the host runs `/lib/systemd/systemd` as PID 1 of its own PID, mount, UTS and IPC
namespaces, chrooted into an overlay of tests/support/debian_root.py's root (lower: the cached root, shared
and never written; upper: this host's folder, which survives a reboot). It gets /proc, the machine's /sys,
tmpfs on /run and /tmp and a minimal /dev of its own: never the machine's /dev, whose ttys would get gettys
(the getty units are masked too). A reboot is the namespace's PID 1 killed and the same overlay booted again.

Nothing here needs a network: the namespaces have none of their own, and nothing in the root listens.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from tests.support.hosts import record_pid

# Masked in every host: gettys (they would take the ttys) and the root's OpenSSH server, which would listen on
# this machine's own network (the host has no network namespace of its own) — no test may serve there.
MASKED_UNITS = (
    "getty@.service", "console-getty.service", "serial-getty@.service", "getty-static.service",
    "ssh.service", "ssh.socket",
)  # fmt: skip
# Character devices of a minimal /dev (name, major, minor), all mode 666 as on a real box.
DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0))
NAMESPACES = ["unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", "--propagation", "private"]
BOOT_TIMEOUT_S = 90.0  # 14 s measured on 2 busy cores; a loaded CI machine gets room


class SystemdHost:
    """One booted (or bootable) systemd host; `boot()`, `systemctl(...)`, `reboot()`, `stop()`."""

    def __init__(self, root: Path, folder: Path, name: str = "sd-host") -> None:
        self.root, self.folder, self.name = root, folder, name
        self.layers = {layer: folder / layer for layer in ("upper", "work", "merged")}
        for path in self.layers.values():
            path.mkdir(parents=True, exist_ok=True)
        self._mask_units()
        self._short_timeouts()
        self.process: subprocess.Popen[bytes] | None = None
        self.boots = 0

    @property
    def merged(self) -> Path:
        return self.layers["merged"]

    @property
    def upper(self) -> Path:
        """The host's own layer: what it wrote (in /etc, /var) lands here and survives a reboot."""
        return self.layers["upper"]

    def _short_timeouts(self) -> None:
        """A unit that hangs starting or stopping ends in seconds, not systemd's 90 s: without a GPU the
        NVIDIA daemons fail, and a failed nvidia-persistenced once sat in stop-sigterm for 90 s, holding the
        boot in "starting" past BOOT_TIMEOUT_S. The tests judge what systemd holds, not how long it waits."""
        conf = self.upper / "etc" / "systemd" / "system.conf.d"
        conf.mkdir(parents=True, exist_ok=True)
        settings = "[Manager]\nDefaultTimeoutStartSec=10s\nDefaultTimeoutStopSec=5s\n"
        (conf / "mgpu-test-host.conf").write_text(settings)

    def _mask_units(self) -> None:
        system = self.upper / "etc" / "systemd" / "system"
        system.mkdir(parents=True, exist_ok=True)
        for unit in MASKED_UNITS:
            link = system / unit
            if not link.is_symlink():
                link.symlink_to("/dev/null")

    def _script(self) -> str:
        merged = self.merged
        lower, upper, work = self.root, self.upper, self.layers["work"]
        dev = merged / "dev"
        nodes = [f"mknod -m 666 {dev}/{name} c {major} {minor}" for name, major, minor in DEVICES]
        return " && ".join(
            [
                f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {merged}",
                f"mount -t proc proc {merged}/proc",
                f"mount --rbind /sys {merged}/sys",
                f"mount -t tmpfs -o mode=755 tmpfs {merged}/run",
                f"mount -t tmpfs -o mode=1777 tmpfs {merged}/tmp",
                f"mount -t tmpfs -o mode=755 tmpfs {dev}",
                *nodes,
                f"mkdir {dev}/pts {dev}/shm",
                f"mount -t devpts -o newinstance,ptmxmode=0666 devpts {dev}/pts",
                f"ln -s pts/ptmx {dev}/ptmx",
                f"hostname {shlex.quote(self.name)}",
                f"exec chroot {merged} env container=other /lib/systemd/systemd",
            ]
        )

    def boot(self, wait: bool = True) -> str:
        """Start PID 1 and (by default) wait until systemd says the boot is over; return its state."""
        if self.process is not None:
            raise RuntimeError(f"{self.name} is already booted")
        log = open(self.folder / f"boot-{self.boots}.log", "wb")  # noqa: SIM115 (closed with the process)
        self.process = subprocess.Popen(
            [*NAMESPACES, "sh", "-c", self._script()],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        # Both: PID 1 leads a session of its own once systemd runs, out of reach of its unshare's group.
        record_pid(self.process.pid, "systemd")
        record_pid(self.pid1(), "systemd")
        self.boots += 1
        return self.wait_running() if wait else "starting"

    def pid1(self) -> int:
        """The machine's pid of the namespace's PID 1 (the child `unshare --fork` made)."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"{self.name} is not running (see {self.folder}/boot-*.log)")
        deadline = time.monotonic() + 10
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        while time.monotonic() < deadline:
            found = children.read_text().split()
            if found:
                return int(found[0])
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: unshare made no PID 1")

    def run(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A shell command inside the host (its mounts, pids and root), as root."""
        argv = ["nsenter", "-t", str(self.pid1()), "-m", "-u", "-i", "-p", "--"]
        argv += ["chroot", str(self.merged), "sh", "-c", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def copy_in(self, source: Path, destination: str) -> None:
        """Copy a folder of this machine into the host (through tar: the overlay is mounted only inside)."""
        packed = subprocess.run(
            ["tar", "-C", str(source.parent), "-cf", "-", source.name], capture_output=True, check=True
        ).stdout
        argv = ["nsenter", "-t", str(self.pid1()), "-m", "-p", "--", "chroot", str(self.merged)]
        where = shlex.quote(destination)
        argv += ["sh", "-c", f"mkdir -p {where} && tar -C {where} -xf -"]
        subprocess.run(argv, input=packed, capture_output=True, check=True, timeout=60)

    def systemctl(self, *args: str) -> str:
        """systemctl's stdout (stripped); its exit status is part of many answers, so it is not checked."""
        return self.run("systemctl " + " ".join(shlex.quote(a) for a in args)).stdout.strip()

    def wait_running(self, timeout_s: float = BOOT_TIMEOUT_S) -> str:
        """Poll `systemctl is-system-running` until the boot is over (running or degraded)."""
        deadline = time.monotonic() + timeout_s
        state = "unknown"
        while time.monotonic() < deadline:
            state = self.systemctl("is-system-running") or "unknown"
            if state in ("running", "degraded"):
                return state
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} did not finish booting in {timeout_s:.0f} s (last state: {state})")

    def reboot(self) -> str:
        """Kill PID 1 (its namespace and every process in it go with it) and boot the same overlay again."""
        self.stop()
        return self.boot()

    def stop(self) -> None:
        """SIGKILL to PID 1 (systemd ignores SIGTERM as PID 1); the namespaces and mounts vanish with it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(RuntimeError, ProcessLookupError):
                os.kill(self.pid1(), signal.SIGKILL)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
