"""A real Slurm cluster over the OpenSSH test hosts: munged, slurmctld and one slurmd per host, on loopback.

Debian's `slurmctld slurmd slurm-client munge` (22.05 on Debian 12) run as the issue's recipe found them
working without systemd or cgroups: `proctrack/linuxproc`, `task/none`, every state, spool, pid and log file
in the cluster's scratch folder. Each slurmd runs inside its test host's own mount + UTS namespaces, so its
hostname is its NodeName and `/etc/slurm` (slurm.conf, gres.conf) is private to that host: what the agent
writes there over SSH is what that slurmd reads. Fake GPUs are character devices `/dev/nvidiaN` (195:N) on a
private /dev of the host's own (a tmpfs with the usual nodes; the machine's /dev is never touched).
Every daemon is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_provision.node.host.machine import parse_key_values
from tests.support.hosts import TestHost, record_pid, skip_or_fail

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/mungekey", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("scontrol", "sinfo", "srun")
# The nodes of a private /dev: what sshd, a shell and Python open (null, zero, full, random, urandom, tty).
_DEV_NODES = (
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
)
NVIDIA_MAJOR = 195


def require_slurm() -> None:
    """Skip (fail under CI=true) where Debian's Slurm and munge are not installed."""
    missing = [p for p in DAEMONS if not os.access(p, os.X_OK)]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        skip_or_fail(
            f"missing {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)",
            "Slurm is not installed",
        )


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


@dataclass
class SlurmNode:
    host: TestHost
    port: int
    etc: Path  # the host's private /etc/slurm, seen from outside
    # configless (configless_slurm.shtml): no local slurm.conf, slurmd started with --conf-server keeps the
    # controller's files in a private /run/slurm/conf
    configless: bool = False

    @property
    def name(self) -> str:
        return self.host.name


@dataclass
class SlurmCluster:
    """slurmctld on `address` and a slurmd per test host; `node_lines` are slurm.conf's NodeName lines."""

    dir: Path
    address: str
    nodes: list[SlurmNode] = field(default_factory=list)
    node_lines: dict[str, str] = field(default_factory=dict)
    extra_conf: str = ""
    slurmd_parameters: str = "config_overrides"  # slurmd registers slurm.conf's layout, not this machine's
    _munged: subprocess.Popen[bytes] | None = None
    _ctld: subprocess.Popen[bytes] | None = None
    _ctld_port: int = 0

    # --- setup ---
    def add_node(self, host: TestHost, node_line: str, gpus: int = 0, configless: bool = False) -> SlurmNode:
        """Give `host` a private /etc/slurm and /dev with `gpus` fake /dev/nvidiaN; `node_line` is its
        slurm.conf line after `NodeName=<name> NodeAddr=<address> Port=<port>`. A `configless` node gets
        a private /run/slurm (slurmd makes /run/slurm/conf there) and no local slurm.conf."""
        etc = host.dir / "etc-slurm"
        etc.mkdir()
        dev = host.dir / "dev"
        nodes = " && ".join(
            f"mknod -m 666 /dev/{name} c {major} {minor}" for name, major, minor in _DEV_NODES
        )
        fake_gpus = "".join(f" && mknod -m 666 /dev/nvidia{n} c {NVIDIA_MAJOR} {n}" for n in range(gpus))
        dev.mkdir()
        run = ""
        if configless:
            Path("/run/slurm").mkdir(exist_ok=True)  # the mount point must exist on the real box
            run = " && mount -t tmpfs -o mode=755 tmpfs /run/slurm"
        host.run_in_ns(
            f"mount --bind {etc} /etc/slurm && mount -t tmpfs -o mode=755 tmpfs /dev && {nodes}{fake_gpus}"
            " && mkdir /dev/pts /dev/shm && mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts"
            f" && ln -s pts/ptmx /dev/ptmx && mount -t tmpfs tmpfs /dev/shm{run}"
        )
        node = SlurmNode(host, _free_port(host.address), etc, configless)
        self.nodes.append(node)
        self.node_lines[host.name] = node_line
        return node

    def conf(self) -> str:
        d = self.dir
        lines = [
            f"ClusterName=mgpu{os.getpid()}",
            f"SlurmctldHost={socket.gethostname()}({self.address})",
            f"SlurmctldPort={self._ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={d / 'munge' / 'munge.socket.2'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            f"SlurmdParameters={self.slurmd_parameters}",
            *(["SlurmctldParameters=enable_configless"] if any(n.configless for n in self.nodes) else []),
            f"SrunPortRange={self._srun_ports()}",
            "GresTypes=gpu",
            "MpiDefault=none",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool' / '%n'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            "SlurmctldTimeout=10",
            "SlurmdTimeout=10",
            "InactiveLimit=0",
            "KillWait=2",
        ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node.name} NodeAddr={node.host.address} Port={node.port} "
                + self.node_lines[node.name]
            )
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName=gpu Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n" + self.extra_conf

    def _srun_ports(self) -> str:
        base = 40000 + (os.getpid() * 37) % 20000
        return f"{base}-{base + 99}"

    @property
    def conf_path(self) -> Path:
        return self.dir / "slurm.conf"

    def write_conf(self) -> None:
        text = self.conf()
        self.conf_path.write_text(text)
        for node in self.nodes:
            if not node.configless:
                (node.etc / "slurm.conf").write_text(text)

    # --- daemons ---
    def start(self, slurmd: bool = True) -> None:
        """munged, then slurmctld, then (with `slurmd`) every slurmd; returns once slurmctld answers."""
        munge = self.dir / "munge"
        munge.mkdir(mode=0o755)
        for folder in (self.dir, *self.dir.parents):  # munge wants the socket's folders searchable by all
            if folder == Path("/"):
                break
            folder.chmod(folder.stat().st_mode | 0o755)
        key = munge / "munge.key"
        subprocess.run(["/usr/sbin/mungekey", "-c", "-k", str(key), "-b", "1024"], check=True)
        key.chmod(0o400)
        self._munged = subprocess.Popen(
            [
                "/usr/sbin/munged", "-F", "--force", f"--socket={munge / 'munge.socket.2'}",
                f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'seed'}", f"--log-file={munge / 'munged.log'}",
            ],
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        record_pid(self._munged.pid, "munged")
        self._wait(lambda: (munge / "munge.socket.2").exists(), "munged", munge / "munged.log")
        for sub in ("state", *(f"spool/{n.name}" for n in self.nodes)):
            (self.dir / sub).mkdir(parents=True)
        self._ctld_port = _free_port(self.address)
        self.write_conf()
        self._ctld = subprocess.Popen(
            ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env(),
            start_new_session=True,
        )
        record_pid(self._ctld.pid, "slurmctld")
        self._wait(
            lambda: self.scontrol("ping", check=False).returncode == 0,
            "slurmctld",
            self.dir / "slurmctld.log",
        )
        for node in self.nodes:
            # A daemon of its own session, out of its test host's process group, whoever starts it (this,
            # or apply's restart): noted by the pid file slurm.conf gives it.
            record_pid(self.dir / f"slurmd-{node.name}.pid", "slurmd")
        for node in self.nodes if slurmd else ():
            self.start_slurmd(node)

    def start_slurmd(self, node: SlurmNode) -> None:
        """slurmd (daemonised: its pid file is how it is found and stopped) inside the host's namespaces,
        without SLURM_CONF (an inherited one makes it look for gres.conf beside that file instead)."""
        if node.configless:  # -N: %n in SlurmdSpoolDir and SlurmdPidFile (configless_slurm.shtml)
            # Before it has slurm.conf (and its AuthInfo) slurmd asks munge at the default socket.
            Path("/run/munge").mkdir(exist_ok=True)  # the mount point must exist on the real box
            server = f"{self.address}:{self._ctld_port}"
            done = node.host.run_in_ns(
                f"(mountpoint -q /run/munge || mount --bind {self.dir / 'munge'} /run/munge)"
                f" && env -u SLURM_CONF /usr/sbin/slurmd --conf-server {server} -N {node.name}",
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"configless slurmd: {done.stdout}{done.stderr}{self.logs(node.name)}")
        else:
            node.host.run_in_ns("env -u SLURM_CONF /usr/sbin/slurmd")

    def slurmd_pid(self, node: SlurmNode) -> int | None:
        path = self.dir / f"slurmd-{node.name}.pid"
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
        return None

    def stop_slurmd(self, node: SlurmNode, timeout_s: float = 10.0) -> None:
        pid = self.slurmd_pid(node)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        for node in self.nodes:
            self.stop_slurmd(node)
        # A step's slurmstepd runs in a session of its own and outlives its slurmd (by design: a slurmd
        # restart keeps running jobs); one that slurmd started just before it stopped works in this
        # cluster's folder, which the caller removes next.
        for _ in range(3):
            if not _end_processes_working_in(self.dir):
                break
            time.sleep(0.2)
        for process in (self._ctld, self._munged):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=5)

    # --- asking ---
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf_path))

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.client("scontrol", *args, check=check)

    def client(
        self, tool: str, *args: str, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [tool, *args], capture_output=True, text=True, env=self.env(), check=check, timeout=timeout
        )

    def node_state(self, name: str) -> dict[str, str]:
        """`scontrol show node -o` of one node as key=value pairs (Reason keeps its spaces)."""
        line = self.scontrol("show", "node", "-o", name).stdout.strip()
        return parse_key_values(line)

    def wait_state(self, name: str, wanted: Sequence[str], timeout_s: float = 30.0) -> dict[str, str]:
        """Wait until the node's State starts with one of `wanted` (e.g. IDLE, DOWN, INVAL)."""
        deadline = time.monotonic() + timeout_s
        state: dict[str, str] = {}
        while time.monotonic() < deadline:
            state = self.node_state(name)
            if any(state.get("State", "").startswith(w) for w in wanted):
                return state
            time.sleep(0.2)
        raise AssertionError(
            f"node {name} not {'/'.join(wanted)} within {timeout_s}s: {state}\n{self.logs(name)}"
        )

    def sinfo_gres(self) -> dict[str, str]:
        """Node name -> `%G` column of sinfo (e.g. `gpu:rtx_3090:2(S:0-1)`)."""
        out = self.client("sinfo", "-h", "-N", "-o", "%N %G").stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def logs(self, name: str | None = None) -> str:
        path = self.dir / (f"slurmd-{name}.log" if name else "slurmctld.log")
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def _wait(self, ready: object, what: str, log: Path, timeout_s: float = 15.0) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.05)
        text = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise RuntimeError(f"{what} did not start within {timeout_s}s: {text}")


def _end_processes_working_in(folder: Path) -> int:
    """SIGKILL every process whose working folder is inside `folder` (also once it is deleted); how many."""
    inside, ended = str(folder.resolve()), 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
        except OSError:
            continue
        if cwd == inside or cwd.startswith(inside + "/"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                ended += 1
    return ended


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
