"""The fleet under test: N OpenSSH test hosts sharing one simulated twin, converged before each fleet size.

Hosts come from the project's test harness (`tests/support/hosts.py`: one sshd per host in its own mount and
UTS namespaces, a clean HOME, private managed folders), so the benchmark measures the same boxes the e2e tests
use. The largest fleet is started once; smaller sizes are its first hosts. Before any timing the fleet is
converged (per size) with the tool's own `apply`, which also leaves the agent in every host's cache: the
runs then measure the fast path only (one cold connection and one agent command per host).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `tests.hosts` is not installed; it lives beside the package

from contenders import BenchHost, Fleet, agent_command  # noqa: E402
from smoke_clock import hook_source  # noqa: E402
from startup import stand_in_torch_python  # noqa: E402

from mgpu_provision.fleet.bundle import build_agent  # noqa: E402
from mgpu_provision.plan.host import facts_request  # noqa: E402
from mgpu_provision.rig import load_rig  # noqa: E402
from tests.support import hosts as harness  # noqa: E402

RIG_NAME = "bench"
AGENT_CACHE = ".cache/mgpu-provision"  # under the login user's HOME, the harness's <host>/home
TWIN = "twin-rtx3090-nvlink.yaml"
# The twin's 2x RTX 3090 with a 4-link bridge, driver pinned at the twin's version: converged from the start
# except for the files `apply` writes (profile.d script, EnvironmentFile, torchrun launcher).
RIG: dict[str, Any] = {
    "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
    "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
    "driver": {"version": "550.54.15", "method": "apt", "hold": True, "reboot": "never"},
    "visible_devices": [0, 1],
    "ddp": {"master": "h001", "port": 29500, "backend": "gloo", "nproc_per_node": 2, "ifname": "lo"},
}
ENV = {"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "WARN"}
# smoke on simulated nodes runs Gloo over loopback: small tensors, a deadline far beyond a slow start.
SMOKE = {"timeout_s": 240, "batch_size": 4, "sizes_mib": [0.0625, 0.25]}
ADDRESSES_PER_POOL = 254  # one 127.x.y.0/24, as the harness takes them
POOLS = 2
MAX_HOSTS = ADDRESSES_PER_POOL * POOLS
# `plan` checks that the smoke python imports torch. The real import costs ~2 CPU-seconds per host, the same
# node-side work for every contender, which on 2 cores would bury the differences being measured; so by
# default the smoke python is a venv whose torch is startup.py's stand-in (the twin's GPUs are simulated).
# sshd at LogLevel VERBOSE logs this once per exec or subsystem (sftp) channel: the SSH commands a client ran.
_SESSION = re.compile(r"Starting session: ")
_LOGIN = re.compile(r"Accepted publickey for ")


class TestbedError(RuntimeError):
    """The fleet could not be set up; the message says which step and why."""


@dataclass(frozen=True)
class Channels:
    """SSH logins and commands (exec or subsystem channels) per host during one run, from sshd's logs."""

    logins: tuple[int, ...]
    commands: tuple[int, ...]

    @property
    def commands_per_host(self) -> float:
        return sum(self.commands) / len(self.commands)

    @property
    def logins_per_host(self) -> float:
        return sum(self.logins) / len(self.logins)


class WidePool(harness._AddressPool):
    """The harness's pool, grown past one /24: 256 hosts need a second 127.x.y.0/24.

    The first block is the harness's own (derived from this pid); the next ones flip high bits of the third
    octet. Another process may use those blocks too: the bind probe skips every address already taken.
    """

    def __init__(self) -> None:
        super().__init__()
        first, third = self._prefix.rsplit(".", 1)
        self._prefixes = [f"{first}.{int(third) ^ (0x80 * n)}" for n in range(POOLS)]
        self._taken = 0

    def take(self, port: int = harness.SSH_PORT) -> str:
        with self._lock:
            while self._taken < MAX_HOSTS:
                block, offset = divmod(self._taken, ADDRESSES_PER_POOL)
                self._taken += 1
                address = f"{self._prefixes[block]}.{offset + 1}"
                if harness.port_free(address, port):
                    return address
        raise RuntimeError(f"no free loopback address left in {', '.join(self._prefixes)} (x.0/24 each)")


@dataclass(frozen=True)
class SmokeSetup:
    """A fleet converged for `smoke` with real torch, and the clock file its processes write to."""

    fleet: Fleet
    clock: Path


class Testbed:
    """Owns the running hosts; `fleet(n)` gives the first n of them ready for every contender."""

    def __init__(
        self,
        root: Path,
        size: int,
        tools_bin: Path,
        ansible: str,
        smoke_python: str | None,
        pyinfra: str = "pyinfra",
    ) -> None:
        reason = harness.harness_unavailable()
        if reason:
            raise TestbedError(reason)
        self.root = root
        self.tools_bin = tools_bin
        self.ansible = ansible
        self.pyinfra = pyinfra
        self.smoke_python = smoke_python or self._stand_in_torch_python()
        self.client = harness.ClientKey()
        self.factory = harness.HostFactory(root / "hosts", self.client.path, self.client.pub, WidePool())
        self.factory.root.mkdir(parents=True)
        twin = resources.files("mgpu_provision.demo").joinpath(TWIN).read_text(encoding="utf-8")
        try:
            self.hosts = [self.factory.start(f"h{i:03d}", twin, rig=RIG_NAME) for i in range(1, size + 1)]
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            self.close()
            raise TestbedError(f"starting {size} test hosts failed: {exc}") from exc
        self._log_offsets = [0] * size
        self.agent_name = build_agent().name

    def _stand_in_torch_python(self) -> str:
        try:
            return stand_in_torch_python(self.root / "smoke-venv", harness.NODE_PYTHON)
        except subprocess.CalledProcessError as exc:
            raise TestbedError(f"{harness.NODE_PYTHON} -m venv failed: {exc}") from None

    @property
    def mgpu_provision(self) -> str:
        return str(self.tools_bin / "mgpu-provision")

    def close(self) -> None:
        self.factory.teardown()
        self.client.remove()

    def write_rig(self, count: int) -> Path:
        path = self.root / f"rig-{count}.yaml"
        self.factory.write_rig(
            path, self.hosts[:count], rigs={RIG_NAME: RIG}, env=ENV, smoke={"python": self.smoke_python}
        )
        return path

    def write_smoke_rig(self, count: int, clock: Path) -> Path:
        """The rig for `smoke`: real torch (this venv's, on PYTHONPATH as tests/e2e do: the hosts' private
        /root hides the venv) behind the clock hook's folder, a free rendezvous port, Gloo on loopback."""
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            raise TestbedError(f"smoke needs real torch in {sys.executable}'s environment")
        hook = clock.parent / "hook"
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text(hook_source(clock))
        env = {**ENV, "PYTHONPATH": f"{hook}{os.pathsep}{Path(spec.origin).parents[1]}"}
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        rig = {**RIG, "ddp": {**RIG["ddp"], "port": port}}
        path = self.root / f"smoke-rig-{count}.yaml"
        self.factory.write_rig(
            path, self.hosts[:count], rigs={RIG_NAME: rig}, env=env,
            smoke={"python": harness.NODE_PYTHON, **SMOKE},
        )  # fmt: skip
        return path

    def smoke_setup(self, count: int) -> SmokeSetup:
        """The first `count` hosts converged for a smoke run whose processes note when they started."""
        clock = self.root / f"smoke-{count}" / "clock.txt"
        clock.parent.mkdir(exist_ok=True)
        rig = self.write_smoke_rig(count, clock)
        # The launcher and env files only, as a user does before smoke (and tests/e2e): plan's torch check
        # does not see the rig's PYTHONPATH, so on these hosts it would report torch missing.
        self._converge_rig(rig, count, [["apply", "--yes", "--playbook", "env"]])
        return SmokeSetup(self.fleet(count, rig), clock)

    def converge(self, count: int) -> None:
        """`apply --yes` on the first `count` hosts, then `plan` must say converged (exit 0).

        Per fleet size, because the torchrun launcher names the DDP world size: a host converged as one of
        64 has drifted as one of 8.
        """
        self._converge_rig(self.write_rig(count), count, [["apply", "--yes"], ["plan"]])

    def _converge_rig(self, rig: Path, count: int, verbs: list[list[str]]) -> None:
        for verb in verbs:
            done = subprocess.run(
                [
                    self.mgpu_provision,
                    verb[0],
                    str(rig),
                    *verb[1:],
                    "--known-hosts",
                    str(self.factory.known_hosts),
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                output = (done.stdout + done.stderr)[-3000:]
                raise TestbedError(f"{verb[0]} on {count} hosts exited {done.returncode}:\n{output}")

    def fleet(self, count: int, rig: Path | None = None) -> Fleet:
        rig = rig or self.write_rig(count)
        loaded = load_rig(rig)
        requests = {json.dumps(facts_request(loaded, h), sort_keys=True) for h in loaded.spec.hosts}
        if len(requests) != 1:
            raise TestbedError("the hosts' facts requests differ; one shared command cannot serve them all")
        request = {"args": json.loads(requests.pop()), "simulate": None}
        agent = self.agent_name
        unpacked = agent.removesuffix(".pyz")  # the agent's first run unpacks it beside the zipapp
        missing = [
            h.name
            for h in self.hosts[:count]
            if not (h.dir / "home" / AGENT_CACHE / unpacked / "__main__.py").exists()
        ]
        if missing:
            raise TestbedError(f"{agent} is not in the cache of {', '.join(missing[:5])} after `apply`")
        workdir = self.root / f"size-{count}"
        workdir.mkdir(exist_ok=True)
        return Fleet(
            hosts=tuple(BenchHost(h.name, h.address, h.port) for h in self.hosts[:count]),
            user="root",
            python=harness.NODE_PYTHON,
            key=self.client.path,
            known_hosts=self.factory.known_hosts,
            rig=rig,
            agent_command=agent_command(harness.NODE_PYTHON, agent, request),
            workdir=workdir,
            mgpu_provision=self.mgpu_provision,
            ansible=self.ansible,
            pyinfra=self.pyinfra,
        )

    def agent_call(self) -> tuple[list[str], str, str, bytes]:
        """How the first host's sshd would run the cached agent's facts verb, for timing it alone: (prefix
        entering the host's namespaces with a login's environment, python, agent folder, request)."""
        host = self.hosts[0]
        if host.process is None:
            raise TestbedError(f"test host {host.name} is not running")
        loaded = load_rig(self.write_rig(1))
        request = {"args": facts_request(loaded, loaded.spec.hosts[0]), "simulate": None}
        prefix = [
            "nsenter", "-t", str(host.process.pid), "-m", "-u", "--",
            # in the login's HOME, where sshd starts the command (the torch probe's `python -c` looks there)
            "env", "-C", "/root", "-i", "HOME=/root", "USER=root", "LOGNAME=root",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            f"MGPU_PROVISION_SIMULATE={host.twin_path}",
        ]  # fmt: skip
        agent = f"/root/{AGENT_CACHE}/{self.agent_name.removesuffix('.pyz')}"
        return prefix, harness.NODE_PYTHON, agent, json.dumps(request).encode()

    def mark_logs(self) -> None:
        """Remember where each sshd log ends, so `channels_since_mark` counts only what follows."""
        self._log_offsets = [self._log_size(h) for h in self.hosts]

    def channels_since_mark(self, count: int) -> Channels:
        logins, commands = [], []
        for host, offset in zip(self.hosts[:count], self._log_offsets, strict=False):
            with open(host.dir / "sshd.log", "rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
            logins.append(len(_LOGIN.findall(text)))
            commands.append(len(_SESSION.findall(text)))
        return Channels(tuple(logins), tuple(commands))

    @staticmethod
    def _log_size(host: harness.TestHost) -> int:
        path = host.dir / "sshd.log"
        return path.stat().st_size if path.exists() else 0
