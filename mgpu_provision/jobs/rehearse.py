"""A fleet to rehearse on: N simulated boxes behind real OpenSSH servers on loopback, up and down by command.

A fleet operator's first wish is a few boxes to try `plan`, `apply --serial`, `smoke` and the node check on
before a real fleet. Each rehearsal host is one `sshd -D` of the user's own on a 127.x address, logging in
as that same user, with a twin file standing in for its NVIDIA layer (docs/ARCHITECTURE.md "Simulated
nodes"). The rig file points every managed path into one folder, `<dir>/box`, and each sshd runs in a mount
namespace of its own where a private folder is mounted over `<dir>/box`: the hosts share the rig's paths as
real boxes do, and none sees another's files. HOME is the host's own folder too (the agent's cache, torch's
probe), so nothing lands in the user's home.

Without root the namespaces come from a user namespace (the sshd runs as the user, mapped back to the
user's own uid inside it); as root, from plain mount namespaces, as the test hosts
(tests/support/hosts.py) do. Only 127.0.0.0/8 is ever listened on, and the hosts are stopped by the pids
written at start.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import ProvisionError
from ..rig.models import schema_comment

STATE_FILE = "rehearsal.json"
TWIN = "twin-rtx3090-nvlink.yaml"  # the demo's box: 2x RTX 3090 with a 4-link NVLink bridge
MAX_HOSTS = 64
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
USERNS_ADVICE = (
    "this kernel does not let a user make namespaces: run the rehearsal as root, or allow unprivileged "
    "user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 "
    "kernel.apparmor_restrict_unprivileged_userns=0)"
)


@dataclass(frozen=True)
class RehearsalHost:
    name: str
    address: str
    port: int
    pid: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "port": self.port, "pid": self.pid}


@dataclass(frozen=True)
class Rehearsal:
    """A rehearsal's folder and what it wrote there: the rig, known_hosts and an ssh_config for `ssh -F`."""

    folder: Path
    hosts: tuple[RehearsalHost, ...]
    user: str
    smoke: bool  # whether the rig names a python with torch (else smoke is left out of the rig)

    @property
    def rig(self) -> Path:
        return self.folder / "rig.yaml"

    @property
    def known_hosts(self) -> Path:
        return self.folder / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.folder / "ssh_config"

    @property
    def check_command(self) -> str:
        """The node check apply installs on every rehearsal host (the rig's node_check.command)."""
        return str(self.folder / "box" / "usr" / "local" / "bin" / "mgpu-provision-check")


def has_torch(python: str) -> bool:
    """Whether `python` can import torch (smoke runs a real DDP job with it; the demo's probe too)."""
    probe = subprocess.run(
        [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def addresses(first: str, count: int) -> list[str]:
    """`count` loopback addresses from `first` up, all in 127.0.0.0/8 and in `first`'s /24 (no .0, .255)."""
    try:
        start = ipaddress.IPv4Address(first)
    except ValueError:
        raise ProvisionError(f"--address {first}: not an IPv4 address (e.g. 127.0.100.1)") from None
    if start not in ipaddress.IPv4Network("127.0.0.0/8"):
        raise ProvisionError(f"--address {first}: rehearsal hosts listen on loopback only (127.0.0.0/8)")
    last = int(start) % 256 + count - 1
    if int(start) % 256 == 0 or last > 254:
        raise ProvisionError(
            f"--address {first}: {count} hosts from there leave {start}'s /24 (.1 to .254); start lower"
        )
    return [str(start + i) for i in range(count)]


def port_free(address: str, port: int) -> bool:
    """Whether `port` on `address` can be bound now (the rehearsal's hosts and the test harness ask)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


def _tool(name: str, package: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.exists()), None
    )
    if found is None:
        raise ProvisionError(f"the rehearsal needs {name} (apt-get install {package})")
    return found


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        [
            _tool("ssh-keygen", "openssh-client"),
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            comment,
            "-f",
            str(path),
        ],
        check=True,
        capture_output=True,
    )
    return path.with_name(path.name + ".pub").read_text(encoding="utf-8").strip()


def rig_document(
    folder: Path, hosts: list[RehearsalHost], user: str, node_python: str, smoke_python: str | None
) -> str:
    """The rehearsal's rig file: every host a simulated 2x RTX 3090 box, one DDP group over all of them
    (Gloo on loopback), every managed path under `<folder>/box` (each host's own in its namespace)."""
    box = folder / "box"
    document: dict[str, Any] = {
        "version": 1,
        "defaults": {
            "user": user,
            "identity_file": str(folder / "client_key"),
            "python": node_python,
            "connect_timeout_s": 10,
        },
        "hosts": [
            {
                "name": h.name,
                "address": h.address,
                "port": h.port,
                "rig": "rtx3090-pair",
                "simulate": str(folder / "hosts" / h.name / "twin.yaml"),
            }
            for h in hosts
        ],
        "rigs": {
            "rtx3090-pair": {
                "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2, "persistence_mode": True},
                "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
                "driver": {"version": "550.54.15", "method": "apt", "hold": True, "reboot": "never"},
                "ddp": {
                    "master": hosts[0].name,
                    "port": free_port(hosts[0].address),
                    "backend": "gloo",
                    "nproc_per_node": 1,
                    "ifname": "lo",
                },
            }
        },
        "env": {"OMP_NUM_THREADS": "1"},
        "files": {
            "profile_d": str(box / "etc/profile.d/mgpu-provision.sh"),
            "environment_file": str(box / "etc/mgpu-provision/environment"),
            "launcher": str(box / "usr/local/bin/mgpu-torchrun"),
            "xorg_conf": str(box / "etc/X11/xorg.conf.d/20-mgpu-provision.conf"),
            "state_dir": str(box / "var/lib/mgpu-provision"),
            "systemd_dir": str(box / "etc/systemd/system"),
        },
        "node_check": {
            "command": str(box / "usr/local/bin/mgpu-provision-check"),
            "agent": str(box / "usr/local/lib/mgpu-provision/agent.pyz"),
            "expectations": str(box / "etc/mgpu-provision/expectation.json"),
        },
        "smoke": {"timeout_s": 300, "batch_size": 8, **({"python": smoke_python} if smoke_python else {})},
    }
    header = (
        f"{schema_comment(folder)}\n"
        "# A rehearsal fleet written by `mgpu-provision rehearse up`: each host is an sshd of your own on\n"
        "# loopback with a twin file for its NVIDIA layer; `mgpu-provision rehearse down` removes it all.\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False, width=120)


def _sshd_config(folder: Path, host: RehearsalHost, root: bool) -> str:
    home = folder / "hosts" / host.name
    # Without root sshd cannot read /etc/shadow and, without PAM, takes every account for locked; PAM's
    # account check asks its setgid helper instead. As root PAM would start a real login session.
    return f"""\
ListenAddress {host.address}
Port {host.port}
HostKey {home / "ssh_host_ed25519_key"}
PidFile {home / "sshd.pid"}
AuthorizedKeysFile {folder / "authorized_keys"}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM {"no" if root else "yes"}
StrictModes no
PrintMotd no
MaxStartups 100:30:200
SetEnv HOME={home / "home"}
Subsystem sftp internal-sftp
"""


def _start_command(folder: Path, host: RehearsalHost, sshd: str) -> list[str]:
    """unshare + sh: the host's box mounted over `<folder>/box`, its hostname, then sshd in the foreground."""
    home = folder / "hosts" / host.name
    q = shlex.quote
    sshd_line = f"{q(sshd)} -D -f {q(str(home / 'sshd_config'))} -E {q(str(home / 'sshd.log'))}"
    setup = f"mount --bind {q(str(home / 'box'))} {q(str(folder / 'box'))} && hostname {q(host.name)}"
    if os.geteuid() == 0:
        return [
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"{setup} && exec {sshd_line}",
        ]
    # A user namespace where this user is root (to mount), then one inside it where the user is itself
    # again: sshd run as root would switch to its privilege-separation user, which is not mapped.
    inner = f"unshare --user --map-user={os.getuid()} --map-group={os.getgid()} {sshd_line}"
    return [
        "unshare", "--user", "--map-root-user", "--mount", "--uts", "--propagation", "private",
        "sh", "-c", f"{setup} && exec {inner}",
    ]  # fmt: skip


def _wait_listening(folder: Path, host: RehearsalHost, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    home = folder / "hosts" / host.name
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = " ".join(
                (home / name).read_text(errors="replace").strip()[-600:]
                for name in ("start.log", "sshd.log")
                if (home / name).exists()
            )
            advice = USERNS_ADVICE if "unshare" in said and os.geteuid() != 0 else f"see {home}"
            raise ProvisionError(
                f"rehearsal host {host.name} did not start: {said or 'no message'}; {advice}"
            )
        with contextlib.suppress(OSError), socket.create_connection((host.address, host.port), timeout=0.5):
            return
        time.sleep(0.05)
    raise ProvisionError(f"rehearsal host {host.name} did not listen on {host.address}:{host.port} within "
                         f"{START_TIMEOUT_S:g} s; see {home / 'sshd.log'}")  # fmt: skip


def _ssh_config(folder: Path, hosts: list[RehearsalHost], user: str) -> str:
    return "".join(
        f"Host {h.name}\n  HostName {h.address}\n  Port {h.port}\n  User {user}\n"
        f"  IdentityFile {folder / 'client_key'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {folder / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
        for h in hosts
    )


def up(
    folder: Path, count: int, first: str, port: int, node_python: str, smoke_python: str | None
) -> Rehearsal:
    """Start `count` rehearsal hosts, write the rig, known_hosts and ssh_config in `folder`; on any failure
    stop what was started and leave no folder behind."""
    if not 1 <= count <= MAX_HOSTS:
        raise ProvisionError(f"--hosts {count}: a rehearsal has 1 to {MAX_HOSTS} hosts")
    folder = folder.absolute()
    if any(ch.isspace() for ch in str(folder)):
        raise ProvisionError(f"the rehearsal folder {folder} contains spaces; choose another with --dir")
    if (folder / STATE_FILE).exists():
        raise ProvisionError(
            f"{folder} holds a rehearsal already: `mgpu-provision rehearse down --dir {folder}`"
        )
    if folder.exists() and any(folder.iterdir()):
        raise ProvisionError(f"--dir {folder}: the folder is not empty; choose another with --dir")
    sshd = _tool("sshd", "openssh-server")
    _tool("unshare", "util-linux")
    hosts = [RehearsalHost(f"node-{i + 1:02d}", a, port) for i, a in enumerate(addresses(first, count))]
    taken = [f"{h.address}:{port}" for h in hosts if not port_free(h.address, port)]
    if taken:
        raise ProvisionError(f"{', '.join(taken)} in use: choose another --address or --port")
    user = pwd.getpwuid(os.getuid()).pw_name
    started: list[RehearsalHost] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "box").mkdir()
        client_pub = _keygen(folder / "client_key", "mgpu-provision-rehearsal")
        (folder / "authorized_keys").write_text(client_pub + "\n", encoding="utf-8")
        twin = resources.files("mgpu_provision.demo").joinpath(TWIN).read_text(encoding="utf-8")
        known = []
        root = os.geteuid() == 0
        for host in hosts:
            home = folder / "hosts" / host.name
            for sub in ("box", "home"):
                (home / sub).mkdir(parents=True)
            (home / "twin.yaml").write_text(twin, encoding="utf-8")
            key = _keygen(home / "ssh_host_ed25519_key", f"rehearsal-{host.name}").split()[:2]
            known.append(f"[{host.address}]:{host.port} {key[0]} {key[1]}\n")
            (home / "sshd_config").write_text(_sshd_config(folder, host, root), encoding="utf-8")
            if root:
                Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
            with open(home / "start.log", "wb") as log:
                process = subprocess.Popen(
                    _start_command(folder, host, sshd),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # its own process group: down ends sshd and its helpers
                )
            started.append(RehearsalHost(host.name, host.address, host.port, process.pid))
            _write_state(folder, started, user, smoke_python is not None)
            _wait_listening(folder, host, process)
        (folder / "known_hosts").write_text("".join(known), encoding="utf-8")
        (folder / "ssh_config").write_text(_ssh_config(folder, hosts, user), encoding="utf-8")
        (folder / "rig.yaml").write_text(
            rig_document(folder, hosts, user, node_python, smoke_python), encoding="utf-8"
        )
    except BaseException:  # an error or Ctrl-C half way: nothing is left running, nothing left written
        _stop(folder, started)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Rehearsal(folder, tuple(started), user, smoke_python is not None)


def _write_state(folder: Path, hosts: list[RehearsalHost], user: str, smoke: bool) -> None:
    state = {"format": 1, "user": user, "smoke": smoke, "hosts": [h.as_dict() for h in hosts]}
    (folder / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")


def load(folder: Path) -> Rehearsal:
    folder = folder.absolute()
    try:
        state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
        hosts = tuple(
            RehearsalHost(h["name"], h["address"], int(h["port"]), h.get("pid")) for h in state["hosts"]
        )
        return Rehearsal(folder, hosts, str(state["user"]), bool(state["smoke"]))
    except FileNotFoundError:
        raise ProvisionError(
            f"{folder} holds no rehearsal (no {STATE_FILE}): start one with rehearse up"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProvisionError(f"{folder / STATE_FILE}: cannot read it ({exc})") from None


def _ours(folder: Path, host: RehearsalHost) -> bool:
    """Whether the pid still is this host's sshd (a pid is reused once its process is gone)."""
    try:
        cmdline = Path(f"/proc/{host.pid}/cmdline").read_bytes()
    except OSError:
        return False
    # A substring: sshd rewrites its own title ("sshd: /usr/sbin/sshd -D -f <config> ... [listener]").
    return str(folder / "hosts" / host.name / "sshd_config").encode() in cmdline


def _stop(folder: Path, hosts: list[RehearsalHost] | tuple[RehearsalHost, ...]) -> list[str]:
    stopped = []
    for host in hosts:
        if host.pid is None or not _ours(folder, host):
            continue
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host.pid, sig)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline and _alive(host.pid):
                time.sleep(0.05)
            if not _alive(host.pid):
                break
        stopped.append(host.name)
    return stopped


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child (up failed half way): reaped
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat.split(") ")[-1].startswith("Z")  # a zombie has ended: its parent has not waited yet


def down(folder: Path) -> tuple[Rehearsal, list[str]]:
    """Stop every host of the rehearsal in `folder` (by the pids up wrote) and remove the folder; the
    rehearsal and the names of the hosts that were still running."""
    rehearsal = load(folder)
    stopped = _stop(rehearsal.folder, rehearsal.hosts)
    shutil.rmtree(rehearsal.folder)
    return rehearsal, stopped
