"""The fleet under test: N OpenSSH test hosts sharing one simulated twin, converged before each fleet size.

Hosts come from the project's test harness (`tests/hosts.py`: one sshd per host in its own mount and UTS
namespaces, a clean HOME, private managed folders), so the benchmark measures the same boxes the e2e tests
use. The largest fleet is started once; smaller sizes are its first hosts. Before any timing the fleet is
converged (per size) with the tool's own `apply`, which also leaves the agent in every host's cache: the
runs then measure the fast path only (one cold connection and one agent command per host).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `tests.hosts` is not installed; it lives beside the package

from contenders import BenchHost, Fleet, agent_command  # noqa: E402

from mgpu_provision.fleet.bundle import build_agent  # noqa: E402
from mgpu_provision.plan.host import facts_request  # noqa: E402
from mgpu_provision.spec import load_rig  # noqa: E402
from tests import hosts as harness  # noqa: E402

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
# `plan` checks that the smoke python imports torch. The real import costs ~2 CPU-seconds per host, the same
# node-side work for every contender, which on 2 cores would bury the differences being measured; so by
# default the smoke python is a venv whose torch is this stand-in (the twin's GPUs are simulated anyway).
STAND_IN_TORCH = '''"""Benchmark stand-in for torch: answers the agent's probe without the real import."""
__version__ = "0.0.0+mgpu-bench"


class cuda:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0
'''
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


class Testbed:
    """Owns the running hosts; `fleet(n)` gives the first n of them ready for every contender."""

    def __init__(
        self, root: Path, size: int, tools_bin: Path, ansible: str, smoke_python: str | None
    ) -> None:
        reason = harness.harness_unavailable()
        if reason:
            raise TestbedError(reason)
        self.root = root
        self.tools_bin = tools_bin
        self.ansible = ansible
        self.smoke_python = smoke_python or self._stand_in_torch_python()
        self.client = harness.ClientKey()
        self.factory = harness.HostFactory(
            root / "hosts", self.client.path, self.client.pub, harness._AddressPool()
        )
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
        venv = self.root / "smoke-venv"
        made = subprocess.run(
            [harness.NODE_PYTHON, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True
        )
        if made.returncode != 0:
            raise TestbedError(f"{harness.NODE_PYTHON} -m venv failed: {made.stderr.strip()[-500:]}")
        site = next(venv.glob("lib/python3*/site-packages"))
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
        return str(venv / "bin" / "python")

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

    def converge(self, count: int) -> None:
        """`apply --yes` on the first `count` hosts, then `plan` must say converged (exit 0).

        Per fleet size, because the torchrun launcher names the DDP world size: a host converged as one of
        64 has drifted as one of 8.
        """
        rig = self.write_rig(count)
        for verb in (["apply", "--yes"], ["plan"]):
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

    def fleet(self, count: int) -> Fleet:
        rig = self.write_rig(count)
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
        )

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
