"""OpenSSH test hosts: real sshd servers on loopback, each in its own mount + UTS namespace.

End-to-end tests need several "boxes" that the control side reaches over real SSH, whose managed folders
(`/etc/mgpu-provision`, `/etc/profile.d`, ...) and home directory are private to each box, and whose NVIDIA
layer is a twin file (docs/ARCHITECTURE.md "Test hosts"). Each host is one `sshd -D` started through
`unshare`, so the sshd process itself holds the namespaces: `nsenter` into its pid sees the box as the agent
sees it.

A root-filesystem host (`start_root`) instead runs its sshd chrooted into a private overlay of a real root
filesystem (tests/support/debian_root.py), with no twin: the agent there drives that root's own apt and dpkg
and the real NVIDIA libraries the packages install.

Addresses are 127.<a>.<b>.<n> with <a>.<b> derived from this process's pid, so concurrent test sessions
(xdist workers, other checkouts) never collide; a bind probe skips any address already in use.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import pytest
import yaml

from mgpu_provision.jobs.rehearse import port_free
from mgpu_provision.node.nvidia.twin import DEFAULT_STATE_DIR, state_file
from tests.support import debian_root

SSHD = "/usr/sbin/sshd"
APPLY_LOCK = "/var/lib/mgpu-provision/apply.lock"  # the default files.state_dir's lock
SSH_PORT = 2222
NODE_PYTHON = "/usr/bin/python3"
# Folders the tool manages on a node; each test host gets a private, initially empty copy.
MANAGED_DIRS = (
    "/etc/mgpu-provision",
    "/var/lib/mgpu-provision",
    "/etc/profile.d",
    "/etc/X11/xorg.conf.d",
    "/usr/local/bin",
    "/etc/systemd/system",  # the boot unit for compute mode and power limit (files.systemd_dir)
    "/usr/local/lib/mgpu-provision",  # the agent the node check runs (node_check.agent)
    "/etc/slurm",  # gres.conf, where a rig's slurm section has apply write it
    "/etc/cdi",  # CDI specs (podman reads these two folders: tests/support/podman.py runs it inside the host)
    "/var/run/cdi",
)
REPO = Path(__file__).resolve().parents[2]
TWINS_DIR = REPO / "examples" / "twins"


def record_pid(pid: int | Path, kind: str = "sshd") -> None:
    """Note a test host's pid (its process group), or the pid file a daemon will write, in
    $MGPU_TEST_HOST_PIDS, where .ci/run ends what a killed pytest could not tear down: a stopped CI run
    leaves no test server behind. `kind` is what the group's leader runs (`sshd`, `sleep` for a network
    namespace's holder, `slurmd`...): .ci/run ends a group only while its leader still runs that, never a
    process that reused the pid."""
    _note(f"{kind} {pid}")


def record_folder(folder: Path) -> None:
    """Note a folder the tests make outside pytest's own (client keys, host roots): .ci/run removes it
    after a killed run, once the test hosts that used it are gone."""
    _note(f"folder {folder}")


def _note(line: str) -> None:
    listing = os.environ.get("MGPU_TEST_HOST_PIDS")
    if listing:
        with open(listing, "a", encoding="utf-8") as out:
            out.write(f"{line}\n")


def harness_unavailable() -> str | None:
    """Why the test hosts cannot start here, or None when they can."""
    if os.geteuid() != 0:
        return "OpenSSH test hosts need root (mount namespaces and bind mounts)"
    for tool in (SSHD, "unshare", "nsenter", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"OpenSSH test hosts need {tool} (apt-get install openssh-server util-linux)"
    probe = subprocess.run(
        ["unshare", "--mount", "--uts", "--propagation", "private", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"unshare --mount --uts does not work here: {probe.stderr.strip()}"
    return None


def require_harness() -> None:
    """Skip the calling test with the reason the hosts cannot start; under CI=true, fail it instead."""
    reason = harness_unavailable()
    if reason is not None:
        skip_or_fail(reason)


def skip_or_fail(reason: str, missing: str = "the e2e harness cannot run") -> NoReturn:
    """Skip the calling test with the reason; under CI=true fail it instead (CI never passes by skipping:
    `.ci/run` installs whatever a test needs)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {missing}: {reason}", pytrace=False)
    pytest.skip(reason)


def loopback_address(port: int = SSH_PORT) -> str:
    """A loopback address of this process's own range with `port` free (tests without the harness)."""
    return _AddressPool().take(port)


_CLAIM_PORT = 2221  # the UDP port each pool's claim binds (nothing is ever sent to it)


class _AddressPool:
    """Loopback addresses unique to this process: 127.<a>.<b>.<1..254>, a /24 it claims for its lifetime.

    The /24 starts from the pid; the claim is a UDP socket bound to its .255 (never a host's address), held
    until the process ends, so two pytest processes whose pids map to the same /24 (a wrapped pid space on a
    busy machine) never hand out each other's addresses: the second moves on to the next free /24. Without
    it one could start a host on an address the other had just stopped a host on (seen: a refused-connection
    test reached the other run's sshd)."""

    def __init__(self) -> None:
        pid = os.getpid()
        start = ((pid >> 8) % 254) * 256 + (pid & 0xFF)
        for step in range(254 * 256):
            index = (start + step) % (254 * 256)
            prefix = f"127.{1 + index // 256}.{index % 256}"
            claim = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                claim.bind((f"{prefix}.255", _CLAIM_PORT))
            except OSError:
                claim.close()
                continue
            self._claim, self._prefix = claim, prefix
            break
        else:
            raise RuntimeError("no free /24 left in 127.0.0.0/8 for this process's test hosts")
        self._next = 1
        self._lock = threading.Lock()

    def take(self, port: int = SSH_PORT) -> str:
        with self._lock:
            for _ in range(254):
                address = f"{self._prefix}.{self._next}"
                self._next = self._next % 254 + 1
                if port_free(address, port):
                    return address
        raise RuntimeError(f"no free loopback address in {self._prefix}.0/24")


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def load_twin(name: str) -> str:
    """The text of an example twin under examples/twins/ (e.g. "rtx3090-nvlink"), verbatim, so the agent's
    own YAML reader parses exactly what users write."""
    path = TWINS_DIR / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    return path.read_text()


@dataclass
class TestHost:
    """One running test host: an sshd in its own namespaces with a twin file."""

    __test__ = False  # not a pytest test class

    name: str
    address: str
    port: int
    dir: Path
    rig: str
    host_key_pub: str
    process: subprocess.Popen[bytes] | None = None
    chroot: Path | None = None  # a root-filesystem host: where its root is mounted, inside its namespace

    @property
    def twin_path(self) -> Path:
        return self.dir / "twin.yaml"

    @property
    def twin_state_path(self) -> Path:
        """The agent's overlay of this host's twin, as this machine sees it: in the host's private state
        folder (files.state_dir's default), where a simulated node keeps it."""
        inside = Path(state_file(str(self.twin_path), DEFAULT_STATE_DIR)).relative_to(DEFAULT_STATE_DIR)
        return self.dir / "managed" / str(MANAGED_DIRS.index(DEFAULT_STATE_DIR)) / inside

    @property
    def known_hosts_line(self) -> str:
        key_type, key = self.host_key_pub.split()[:2]
        return f"[{self.address}]:{self.port} {key_type} {key}"

    def set_twin(self, twin: Mapping[str, Any] | str) -> None:
        """Replace the twin (YAML text, or a dict) and forget the agent's overlay state beside it."""
        # A dict is written as JSON: valid YAML that the agent's small YAML reader takes without surprises.
        text = twin if isinstance(twin, str) else json.dumps(twin, indent=2)
        self.twin_path.write_text(text)
        if (self.dir / "managed").exists():
            self.twin_state_path.unlink(missing_ok=True)

    def twin(self) -> dict[str, Any]:
        loaded: dict[str, Any] = yaml.safe_load(self.twin_path.read_text())
        return loaded

    def run_in_ns(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell command as this host sees the world (its mounts and hostname)."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"test host {self.name} is not running")
        return subprocess.run(
            ["nsenter", "-t", str(self.process.pid), "-m", "-u", "--", "sh", "-c", command],
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def run_in_root(self, command: str) -> subprocess.CompletedProcess[str]:
        """Run a shell command inside a root-filesystem host (its own apt, dpkg and files)."""
        assert self.chroot is not None, f"{self.name} has no root filesystem of its own"
        return self.run_in_ns(f"chroot {self.chroot} sh -c {shlex.quote(command)}")

    def log(self) -> str:
        path = self.dir / ("upper/var/log/sshd.log" if self.chroot else "sshd.log")
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop the server politely (SIGTERM to its process group), then make sure it is gone."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        # The leader can end before the rest of its group (the sshd holding the listening socket): a
        # connection in that moment was accepted, then reset, instead of refused.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None


class SilentServer:
    """Accepts TCP connections and never says a word: a box whose sshd hangs before the banner.

    With `hang_up`, it closes each connection at once instead, as sshd does past MaxStartups.
    """

    def __init__(self, address: str, port: int = SSH_PORT, hang_up: bool = False) -> None:
        self.address, self.port, self.hang_up = address, port, hang_up
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))
        self._sock.listen(16)
        self._held: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self.hang_up:
                conn.close()
            else:
                self._held.append(conn)

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        for conn in self._held:
            conn.close()


@dataclass
class HostFactory:
    """Starts test hosts for one test and tears all of them down afterwards."""

    root: Path
    client_key: Path
    client_key_pub: str
    pool: _AddressPool
    hosts: list[TestHost] = field(default_factory=list)
    silent: list[SilentServer] = field(default_factory=list)

    @property
    def known_hosts(self) -> Path:
        """known_hosts listing every host started so far (rewritten on each start)."""
        return self.root / "known_hosts"

    @property
    def node_tmp(self) -> Path:
        """The TMPDIR of every login on this factory's hosts (sshd's SetEnv): what an agent leaves in its
        temporary folder (a smoke killed with its host) goes with the factory's folder, never to /tmp. One
        folder for all the hosts, as the machine's /tmp was: a Slurm step finds the folder its job named."""
        return self.root / "node-tmp"

    def start(
        self,
        name: str,
        twin: Mapping[str, Any] | str | None = None,
        rig: str | None = None,
        extra_sshd_config: str = "",
        login_user: str | None = None,
        sudo: Literal["nopasswd", "password", "real"] | None = None,
        sftp: bool = True,
        netns: Sequence[str] = (),
        address: str | None = None,
    ) -> TestHost:
        """Start a host. `login_user` adds a non-root account (uid 1000) that only this host knows;
        `sudo` puts a stand-in `sudo` on its PATH that runs the command (nopasswd) or wants a password, or
        (real) gives the login user a NOPASSWD rule for the machine's real sudo, env_reset and all;
        `sftp=False` leaves the SFTP subsystem out, as hardened images do. `netns` (a command prefix that
        enters a network namespace, tests/support/netns.py) with `address` (one of that namespace's) puts
        the host where only that namespace's links reach it."""
        address = address or self.pool.take()
        host_dir = self.root / name
        host_dir.mkdir()
        host_key_pub = _keygen(host_dir / "ssh_host_ed25519_key", f"host-{name}")
        host = TestHost(name, address, SSH_PORT, host_dir, rig or f"rig-{name}", host_key_pub)
        host.set_twin(twin if twin is not None else {"driver": {"version": None}, "gpus": []})
        (host_dir / "authorized_keys").write_text(self.client_key_pub + "\n")
        (host_dir / "home").mkdir(mode=0o700)
        mounts = _clean_root_home(host_dir / "home")
        for index, target in enumerate(MANAGED_DIRS):
            private = host_dir / "managed" / str(index)
            private.mkdir(parents=True)
            Path(target).mkdir(parents=True, exist_ok=True)  # the mount point must exist on the real box
            mounts.append(f"mount --bind {private} {target}")
        if login_user:
            mounts += _private_account(host_dir, login_user)
        if sudo == "real":
            mounts.append(_sudo_rule(host_dir))
        elif sudo:
            fake = host_dir / "managed" / str(MANAGED_DIRS.index("/usr/local/bin")) / "sudo"
            fake.write_text(_FAKE_SUDO[sudo])
            fake.chmod(0o755)
        self.node_tmp.mkdir(mode=0o1777, exist_ok=True)
        self.node_tmp.chmod(0o1777)  # a login user's too, as /tmp is (mkdir's mode passes the umask)
        config = _sshd_config(host, host_dir / "authorized_keys", tmpdir=self.node_tmp) + extra_sshd_config
        if not sftp:
            config = config.replace("Subsystem sftp internal-sftp\n", "")
        (host_dir / "sshd_config").write_text(config)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        script = " && ".join(
            [
                *mounts,
                f"hostname {name}",
                f"exec {SSHD} -D -f {host_dir / 'sshd_config'} -E {host_dir / 'sshd.log'}",
            ]
        )
        host.process = subprocess.Popen(
            [*netns, "unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so teardown can end sshd and its children
        )
        record_pid(host.process.pid)
        self.hosts.append(host)
        _wait_listening(host, by_log=bool(netns))
        self._write_known_hosts()
        return host

    def start_root(self, name: str, root: Path) -> TestHost:
        """Start a host whose sshd runs chrooted in a private overlay of a real root filesystem
        (tests/support/debian_root.py): no twin, so the agent meets that root's real apt, dpkg and NVIDIA
        libraries. Its own mount, UTS and pid namespaces hold the overlay, /proc and /dev; they vanish with
        it."""
        address = self.pool.take()
        host_dir = self.root / name
        layers = {layer: host_dir / layer for layer in ("upper", "work", "merged")}
        for folder in layers.values():
            folder.mkdir(parents=True)
        host_key_pub = _keygen(host_dir / "ssh_host_ed25519_key", f"host-{name}")
        host = TestHost(
            name, address, SSH_PORT, host_dir, f"rig-{name}", host_key_pub, chroot=layers["merged"]
        )
        inside = layers["upper"] / "etc" / "mgpu-test"  # written into the overlay's upper layer
        inside.mkdir(parents=True)
        # Its own machine id, as a first boot gives one (machine-id(5)): a box of its own, not the machine
        # running the tests, although it shares this kernel's boot id and a loopback address (fleet/here.py).
        machine_id = hashlib.sha256(f"{address} {name}".encode()).hexdigest()[:32]
        (layers["upper"] / "etc" / "machine-id").write_text(machine_id + "\n")
        for suffix in ("", ".pub"):
            shutil.copy(host_dir / f"ssh_host_ed25519_key{suffix}", inside / f"host_key{suffix}")
        (inside / "authorized_keys").write_text(self.client_key_pub + "\n")
        config = _sshd_config(host, Path("/etc/mgpu-test/authorized_keys"), simulated=False)
        config = config.replace(str(host_dir / "ssh_host_ed25519_key"), "/etc/mgpu-test/host_key")
        (inside / "sshd_config").write_text(config.replace(str(host_dir / "sshd.pid"), "/run/sshd.pid"))
        merged = layers["merged"]
        lower, upper, work = root, layers["upper"], layers["work"]
        script = " && ".join(
            [
                f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {merged}",
                *debian_root.root_mounts(merged),
                f"mkdir -p {merged}/run/sshd",
                f"hostname {name}",
                f"exec chroot {merged} /usr/sbin/sshd -D -f /etc/mgpu-test/sshd_config -E /var/log/sshd.log",
            ]
        )
        host.process = subprocess.Popen(
            [*debian_root.NAMESPACES, "sh", "-c", script],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        record_pid(host.process.pid)
        self.hosts.append(host)
        _wait_listening(host)
        self._write_known_hosts()
        return host

    def dead_address(self) -> str:
        """A loopback address where nothing listens on the SSH port (connection refused)."""
        return self.pool.take()

    def silent_server(self) -> SilentServer:
        server = SilentServer(self.pool.take())
        self.silent.append(server)
        return server

    def _write_known_hosts(self) -> None:
        self.known_hosts.write_text("".join(h.known_hosts_line + "\n" for h in self.hosts))

    def write_rig(
        self,
        path: Path,
        hosts: Sequence[TestHost],
        rigs: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        host_fields: Mapping[str, Mapping[str, Any]] | None = None,
        extra_hosts: Sequence[Mapping[str, Any]] = (),
        **top_level: Any,
    ) -> Path:
        """A rig file whose hosts are these test hosts; rigs default to "the GPUs the twin has"."""
        entries: list[dict[str, Any]] = []
        for host in hosts:
            entry: dict[str, Any] = {
                "name": host.name,
                "address": host.address,
                "port": host.port,
                "rig": host.rig,
            }
            entry.update((host_fields or {}).get(host.name, {}))
            entries.append(entry)
        entries.extend(dict(e) for e in extra_hosts)
        if rigs is None:
            rigs = {h.rig: _rig_of_twin(h.twin()) for h in hosts}
            rigs.update({str(e["rig"]): {"gpus": {"model": "none", "count": 1}} for e in extra_hosts})
        document: dict[str, Any] = {
            "version": 1,
            "defaults": {
                "user": "root",
                "identity_file": str(self.client_key),
                "python": NODE_PYTHON,
                "connect_timeout_s": 5,
                **(defaults or {}),
            },
            "hosts": entries,
            "rigs": dict(rigs),
            **top_level,
        }
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def teardown(self) -> None:
        for server in self.silent:
            server.close()
        for host in self.hosts:
            host.kill()
        shutil.rmtree(self.root, ignore_errors=True)


# Stand-ins for `sudo -n CMD...` (no sudo package on the test machines): log the call, then run or refuse.
_LOG_SUDO = '#!/bin/sh\nprintf \'%s\\n\' "$*" >> "$HOME/sudo.log"\n'
_FAKE_SUDO = {
    "nopasswd": _LOG_SUDO + '[ "$1" = -n ] && shift\nexec "$@"\n',
    "password": _LOG_SUDO + 'echo "sudo: a password is required" >&2\nexit 1\n',
}


def on_host(host: TestHost, path: str) -> Path:
    """Where a node path lies on the real file system (each managed folder is a private bind mount)."""
    for index, folder in enumerate(MANAGED_DIRS):
        if path.startswith(folder + "/"):
            return host.dir / "managed" / str(index) / path[len(folder) + 1 :]
    raise AssertionError(f"{path} is not under a managed folder")


def _sudo_rule(host_dir: Path) -> str:
    """A private /etc/sudoers.d giving the login account (uid 1000) passwordless sudo on this host only, for
    the real sudo binary. By uid: the machine may already name uid 1000 otherwise, and sudo goes by name."""
    if shutil.which("sudo") is None:
        raise RuntimeError("test hosts with real sudo need the sudo package (apt-get install sudo)")
    rules = host_dir / "sudoers.d"
    rules.mkdir(mode=0o755)
    rule = rules / "mgpu-tests"
    rule.write_text("#1000 ALL=(ALL:ALL) NOPASSWD: ALL\n")
    rule.chmod(0o440)
    return f"mount --bind {rules} /etc/sudoers.d"


def _private_account(host_dir: Path, user: str) -> list[str]:
    """Copies of passwd/group/shadow with one more account, bind-mounted inside the host's namespace only."""
    home = host_dir / f"home-{user}"
    home.mkdir(mode=0o700)
    os.chown(home, 1000, 1000)
    for folder in (host_dir, host_dir.parent):  # the account must reach its home and the twin
        folder.chmod(0o755)
    extra = {
        "passwd": f"{user}:x:1000:1000::{home}:/bin/sh\n",
        "group": f"{user}:x:1000:\n",
        "shadow": f"{user}:*:19000:0:99999:7:::\n",
    }
    mounts = []
    for name, line in extra.items():
        copy = host_dir / f"etc-{name}"
        copy.write_text(Path(f"/etc/{name}").read_text() + line)
        mounts.append(f"mount --bind {copy} /etc/{name}")
    return mounts


def _rig_of_twin(twin: Mapping[str, Any]) -> dict[str, Any]:
    gpus = twin.get("gpus") or []
    model = gpus[0]["name"] if gpus else "none"
    return {"gpus": {"model": model, "count": max(len(gpus), 1)}}


def _sshd_config(
    host: TestHost, authorized_keys: Path, simulated: bool = True, tmpdir: Path | None = None
) -> str:
    pairs = [f"MGPU_PROVISION_SIMULATE={host.twin_path}"] if simulated else []
    pairs += [f"TMPDIR={tmpdir}"] if tmpdir is not None else []
    simulate = f"SetEnv {' '.join(pairs)}\n" if pairs else ""
    return f"""\
ListenAddress {host.address}
Port {host.port}
HostKey {host.dir / "ssh_host_ed25519_key"}
PidFile {host.dir / "sshd.pid"}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel VERBOSE
MaxStartups 100:30:200
{simulate}Subsystem sftp internal-sftp
"""


def _clean_root_home(home: Path) -> list[str]:
    """Mounts giving root a clean home: the real one's start-up files (pyenv) would distort every timing.

    The folders under /root that hold the interpreter running the tests (a pyenv python, which this
    virtualenv links to) are carried into the clean home, so `smoke.python` and friends still run there.
    A recursive bind, because the carried folders are mounts of their own inside `home`.
    """
    mounts = []
    for path in {Path(sys.executable).resolve(), Path(sys.base_prefix).resolve()}:
        if path.is_relative_to("/root") and len(path.parts) > 2:
            keep = Path("/root", path.parts[2])
            (home / keep.name).mkdir(exist_ok=True)
            mounts.append(f"mount --bind {keep} {home / keep.name}")
    return [*sorted(set(mounts)), f"mount --rbind {home} /root"]


def _wait_listening(host: TestHost, timeout_s: float = 10.0, by_log: bool = False) -> None:
    """Wait until the host's sshd listens: a connection from here, or (`by_log`: a host in another network
    namespace, which this one cannot reach) sshd's own "Server listening" line."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert host.process is not None
        if host.process.poll() is not None:
            raise RuntimeError(f"sshd for test host {host.name} exited: {host.log()[-2000:]}")
        if by_log:
            if f"Server listening on {host.address}" in host.log():
                return
            time.sleep(0.02)
            continue
        try:
            with socket.create_connection((host.address, host.port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    host.kill()
    raise RuntimeError(
        f"sshd for test host {host.name} did not listen within {timeout_s}s: {host.log()[-2000:]}"
    )


class ClientKey:
    """The user key every test host authorises; made once per test session."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="mgpu-client-"))
        record_folder(self.dir)
        self.path = self.dir / "id_ed25519"
        self.pub = _keygen(self.path, "mgpu-provision-tests")

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def over_ssh(factory: HostFactory, host: TestHost, command: str) -> subprocess.CompletedProcess[str]:
    """`command` on the box through OpenSSH, as an admin (or a cron job on another machine) runs it."""
    argv = [
        "ssh", "-i", str(factory.client_key), "-o", f"UserKnownHostsFile={factory.known_hosts}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-p", str(host.port), f"root@{host.address}", command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def host_factory(client: ClientKey, pool: _AddressPool) -> Iterator[HostFactory]:
    """Generator behind the `test_hosts` fixture: yields a factory, always tears everything down."""
    folder = Path(tempfile.mkdtemp(prefix="mgpu-hosts-"))
    record_folder(folder)
    factory = HostFactory(folder, client.path, client.pub, pool)
    try:
        yield factory
    finally:
        factory.teardown()


_FAKE_AGENT_MAIN = """\
import json, os, socket, sys, time
verb = sys.argv[1]
request = json.load(sys.stdin)
if verb == "crash":
    sys.stderr.write("Traceback (most recent call last):\\nRuntimeError: the fake agent crashed\\n")
    sys.exit(3)
if verb == "garbage":
    print("this is not json")
    sys.exit(0)
if verb == "sleep":
    time.sleep(request["args"]["seconds"])
if verb == "fork-sleep":  # like sudo: the work runs in a child, which a kill of the parent alone leaves
    child = os.fork()
    if child == 0:
        time.sleep(request["args"]["seconds"])
        os._exit(0)
    os.waitpid(child, 0)
if verb == "refuse":
    error = {"kind": "locked", "message": "held by 42"}
    print(json.dumps({"ok": False, "agent_version": "fake", "error": error}))
    sys.exit(0)
result = {"verb": verb, "args": request["args"], "simulate": request["simulate"],
          "hostname": socket.gethostname(), "env_simulate": os.environ.get("MGPU_PROVISION_SIMULATE"),
          "uid": os.getuid(), "argv0": sys.argv[0]}
print(json.dumps({"ok": True, "agent_version": "fake", "result": result}))
"""


@dataclass(frozen=True)
class FakeAgent:
    """A tiny zipapp that speaks the agent protocol, to test the fleet layer apart from the real agent."""

    data: bytes
    name: str


def fake_agent(tag: str = "") -> FakeAgent:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        entry = zipfile.ZipInfo("__main__.py", (2020, 1, 1, 0, 0, 0))
        archive.writestr(entry, _FAKE_AGENT_MAIN + f"# {tag}\n")
    data = buffer.getvalue()
    return FakeAgent(data, f"agent-{hashlib.sha256(data).hexdigest()[:16]}.pyz")


def hold_lock(host: TestHost, seconds: float, lock: str = APPLY_LOCK) -> subprocess.Popen[bytes]:
    """Take the host's apply lock from inside its namespaces, as another apply's agent would."""
    assert host.process is not None
    # -o: only flock itself holds the lock, so killing it releases the lock at once.
    script = f"mkdir -p {Path(lock).parent} && echo $$ > {lock} && exec flock -o {lock} sleep {seconds}"
    holder = subprocess.Popen(
        ["nsenter", "-t", str(host.process.pid), "-m", "-u", "--", "sh", "-c", script], start_new_session=True
    )
    deadline = time.monotonic() + 10
    while host.run_in_ns(f"flock -n {lock} true", check=False).returncode == 0:
        assert time.monotonic() < deadline, "the lock holder did not start"
        time.sleep(0.05)
    return holder


def desired_files_on(rig: Path, known_hosts: Path) -> dict[str, list[Any]]:
    """Per host of `rig`: the files apply must leave there, rendered from the facts the host really reports
    (bus ids, interfaces, torch, cores), as plan renders them."""
    from mgpu_provision import cli
    from mgpu_provision.facts import Facts
    from mgpu_provision.plan.change import HostContext
    from mgpu_provision.plan.resources import envfiles, sli
    from mgpu_provision.rig import load_rig

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["facts", str(rig), "--known-hosts", str(known_hosts), "--json"])
    loaded = load_rig(rig)
    contexts = {
        name: HostContext(loaded, loaded.host(name), Facts.model_validate(report["facts"]))
        for name, report in json.loads(out.getvalue())["hosts"].items()
    }
    return {name: envfiles.desired(ctx) + sli.desired(ctx) for name, ctx in contexts.items()}
