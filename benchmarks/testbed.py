"""The fleet under test: N OpenSSH test hosts sharing one simulated twin, converged before each fleet size.

Hosts come from the project's test harness (`tests/support/hosts.py`: one sshd per host in its own mount and
UTS namespaces, a clean HOME, private managed folders), so the benchmark measures the same boxes the e2e tests
use. They live in two racks (tests/support/netns.py's lab: network namespaces, h001 in rack 1, h002 in rack
2, and so on), each behind a gateway of its own: the flat contenders run in a client namespace linked to every
rack, the tree's head in one linked only to the gateways, and each rack's firewall admits SSH from its
gateway and that client only; every contender asks the same hosts. The largest fleet is started once; smaller
sizes are its first hosts. Before any timing the fleet is converged (per size) with the tool's own `apply`,
which also leaves the agent in every host's cache: the runs then measure the fast path only (one cold
connection and one agent command per host). sshd's logs say who logged in from where (`Channels`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `tests.hosts` is not installed; it lives beside the package

from contenders import BenchHost, Fleet, agent_command  # noqa: E402
from measure import GNU_TIME as GNU_TIME_PATH  # noqa: E402
from smoke_clock import hook_source  # noqa: E402
from startup import stand_in_torch_python  # noqa: E402

from mgpu_provision.fleet.bundle import build_agent  # noqa: E402
from mgpu_provision.plan.host import facts_request  # noqa: E402
from mgpu_provision.rig import load_rig  # noqa: E402
from tests.support import hosts as harness  # noqa: E402
from tests.support.netns import TreeLab  # noqa: E402

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
# smoke on simulated nodes runs Gloo over loopback: small tensors, a deadline far beyond a slow start. Its
# bandwidth on 2 shared cores halves from one run to the next: the benchmark times smoke's start-up, so the
# box's own baseline (smoke fails past a 20% drop by default) must not fail a run for the load.
SMOKE = {"timeout_s": 240, "batch_size": 4, "sizes_mib": [0.0625, 0.25], "baseline_drop": 0.99}
RACKS = 2  # each behind its own gateway: ClusterShell's tree through 2 gateways
PER_RACK = 245  # a rack's nodes are 10.42.<rack>.10-254 (netns.TreeLab.node_address)
MAX_HOSTS = RACKS * PER_RACK
# `plan` checks that the smoke python imports torch. The real import costs ~2 CPU-seconds per host, the same
# node-side work for every contender, which on 2 cores would bury the differences being measured; so by
# default the smoke python is a venv whose torch is startup.py's stand-in (the twin's GPUs are simulated).
# sshd at LogLevel VERBOSE logs this once per exec or subsystem (sftp) channel: the SSH commands a client ran.
_SESSION = re.compile(r"Starting session: ")
_LOGIN = re.compile(r"Accepted publickey for \S+ from (\S+) ")
# ClusterShell's gateway under GNU time: one line per start on a gateway, its CPU with its reaped children
# (the OpenSSH clients to its rack). sshd hangs up on the session when the head ends the channel: the timing
# parent ignores that, the gateway itself does not.
GATEWAY_WRAPPER = """#!/bin/sh
trap '' HUP
exec {time} -a -o {log} -f '%U %S' env --default-signal=HUP {python} "$@"
"""


class TestbedError(RuntimeError):
    """The fleet could not be set up; the message says which step and why."""


@dataclass(frozen=True)
class Channels:
    """SSH logins and commands (exec or subsystem channels) per host during one run, from sshd's logs; the
    nodes' logins by where they came from (`client`, `gateway`, `head`, or the address), and the logins
    at the gateways."""

    logins: tuple[int, ...]
    commands: tuple[int, ...]
    node_logins_from: tuple[tuple[str, int], ...] = ()
    gateway_logins: int = 0

    @property
    def commands_per_host(self) -> float:
        return sum(self.commands) / len(self.commands)

    @property
    def logins_per_host(self) -> float:
        return sum(self.logins) / len(self.logins)


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
        pool = harness._AddressPool()  # unused: every host has its rack's address
        self.factory = harness.HostFactory(root / "hosts", self.client.path, self.client.pub, pool)
        self.factory.root.mkdir(parents=True)
        twin = resources.files("mgpu_provision.demo").joinpath(TWIN).read_text(encoding="utf-8")
        self.lab: TreeLab | None = None
        try:
            self.lab = TreeLab(
                self.factory, RACKS, nodes_per_rack=-(-size // RACKS), flat_client=True, firewall=True
            )
            self.hosts = [
                self.lab.start_node(f"h{i:03d}", rack_of(i), twin, rig=RIG_NAME) for i in range(1, size + 1)
            ]
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            self.close()
            raise TestbedError(f"starting {size} test hosts in 2 racks failed: {exc}") from exc
        self.gateways_ssh_config = self.lab.write_ssh_config(root / "gateways.ssh_config")
        self.gateway_cpu_log = root / "gateway-cpu.log"
        self.gateway_python = root / "gateway-python"
        self.gateway_python.write_text(
            GATEWAY_WRAPPER.format(time=GNU_TIME_PATH, log=self.gateway_cpu_log, python=sys.executable)
        )
        self.gateway_python.chmod(0o755)
        self._log_offsets = [0] * (size + RACKS)
        self.agent_name = build_agent().name

    def _stand_in_torch_python(self) -> str:
        try:
            return stand_in_torch_python(self.root / "smoke-venv", harness.NODE_PYTHON)
        except subprocess.CalledProcessError as exc:
            raise TestbedError(f"{harness.NODE_PYTHON} -m venv failed: {exc}") from None

    @property
    def mgpu_provision(self) -> str:
        return str(self.tools_bin / "mgpu-provision")

    @property
    def flat(self) -> tuple[str, ...]:
        """The command prefix that enters the flat client's namespace (a direct link to every rack)."""
        assert self.lab is not None and self.lab.flat is not None
        return tuple(self.lab.flat.prefix)

    def close(self) -> None:
        if self.lab is not None:
            self.lab.close()
        self.factory.teardown()
        self.client.remove()

    def write_rig(self, count: int) -> Path:
        path = self.root / f"rig-{count}.yaml"
        self.factory.write_rig(
            path, self.hosts[:count], rigs={RIG_NAME: RIG}, env=ENV, smoke={"python": self.smoke_python}
        )
        return path

    def smoke_hosts(self, count: int) -> list[harness.TestHost]:
        """smoke's fleet: the first `count` hosts of rack 1 (its ranks talk Gloo over their rack's loopback,
        and racks have no link to each other)."""
        return [h for i, h in enumerate(self.hosts, start=1) if rack_of(i) == 1][:count]

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
            path, self.smoke_hosts(count), rigs={RIG_NAME: rig}, env=env,
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
        return SmokeSetup(self.fleet(count, rig, self.smoke_hosts(count)), clock)

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
                    *self.flat,
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

    def fleet(
        self, count: int, rig: Path | None = None, hosts: list[harness.TestHost] | None = None
    ) -> Fleet:
        """The first `count` hosts (or `hosts`) as every contender needs them, with this size's topology."""
        chosen = hosts or self.hosts[:count]
        rig = rig or self.write_rig(count)
        loaded = load_rig(rig)
        requests = {json.dumps(facts_request(loaded, h), sort_keys=True) for h in loaded.spec.hosts}
        if len(requests) != 1:
            raise TestbedError("the hosts' facts requests differ; one shared command cannot serve them all")
        request = {"args": json.loads(requests.pop()), "simulate": None}
        agent = self.agent_name
        unpacked = agent.removesuffix(".pyz")  # the agent's first run unpacks it beside the zipapp
        missing = [
            h.name for h in chosen if not (h.dir / "home" / AGENT_CACHE / unpacked / "__main__.py").exists()
        ]
        if missing:
            raise TestbedError(f"{agent} is not in the cache of {', '.join(missing[:5])} after `apply`")
        workdir = self.root / f"size-{count}"
        workdir.mkdir(exist_ok=True)
        assert self.lab is not None and self.lab.flat is not None
        topology = self.lab.write_topology(workdir / "topology.conf", hosts=[h.name for h in chosen])
        return Fleet(
            hosts=tuple(BenchHost(h.name, h.address, h.port) for h in chosen),
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
            flat=self.flat,
            head=tuple(self.lab.head.prefix),
            topology=topology,
            gateways_ssh_config=self.gateways_ssh_config,
            gateway_python=str(self.gateway_python),
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
        """Remember where each sshd log ends (the nodes', then the gateways'), so `channels_since_mark`
        counts only what follows; forget the gateways' CPU so far."""
        self._log_offsets = [self._log_size(h) for h in self._logged()]
        self.gateway_cpu_log.unlink(missing_ok=True)

    def _logged(self) -> list[harness.TestHost]:
        return [*self.hosts, *(self.lab.gateways if self.lab else [])]

    def _sources(self) -> dict[str, str]:
        """Who each address a node or gateway may see a login from is."""
        assert self.lab is not None
        roles: dict[str, str] = {}
        for rack in range(1, RACKS + 1):
            roles[self.lab.flat_address(rack)] = "client"
            roles[self.lab.gateway_address(rack)] = "gateway"
            roles[self.lab.head_address(rack)] = "head"
        return roles

    def channels_since_mark(self, hosts: list[str]) -> Channels:
        """The logins and commands of one run at these hosts, and who made them (from sshd's logs)."""
        logins, commands, sources = [], [], Counter[str]()
        gateway_logins = 0
        roles = self._sources()
        wanted = set(hosts)
        for host, offset in zip(self._logged(), self._log_offsets, strict=True):
            with open(host.dir / "sshd.log", "rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
            found = login_sources(text, roles)
            if host.name in wanted:
                logins.append(len(found))
                commands.append(len(_SESSION.findall(text)))
                sources.update(found)
            elif host not in self.hosts:
                gateway_logins += len(found)
        return Channels(tuple(logins), tuple(commands), tuple(sorted(sources.items())), gateway_logins)

    def gateway_cpu_since_mark(self, quiet_s: float = 20.0) -> float | None:
        """The gateways' CPU since the mark (None where no gateway ran), once every gateway has finished:
        a gateway's ClusterShell ends after the head's command, and writes its line then."""
        assert self.lab is not None
        deadline = time.monotonic() + quiet_s
        sshds = {h.process.pid for h in self.lab.gateways if h.process is not None}
        while any(set(ns.pids()) - sshds for ns in self.lab.gateway_ns) and time.monotonic() < deadline:
            time.sleep(0.05)
        return gateway_cpu(self.gateway_cpu_log.read_text()) if self.gateway_cpu_log.exists() else None

    @staticmethod
    def _log_size(host: harness.TestHost) -> int:
        path = host.dir / "sshd.log"
        return path.stat().st_size if path.exists() else 0


def login_sources(log: str, roles: dict[str, str]) -> list[str]:
    """Who made each login in this stretch of an sshd log (LogLevel VERBOSE): a role, or the address."""
    return [roles.get(address, address) for address in _LOGIN.findall(log)]


def gateway_cpu(report: str) -> float:
    """CPU seconds in the gateway wrapper's GNU time lines ("user system" each; GNU time may first say how
    the command ended, e.g. "Command terminated by signal 1")."""
    total = 0.0
    for line in report.splitlines():
        words = line.split()
        if len(words) == 2 and all(w.replace(".", "", 1).isdigit() for w in words):
            total += float(words[0]) + float(words[1])
    return total


def rack_of(number: int) -> int:
    """Host h<number>'s rack: they alternate, so any fleet of two or more uses both gateways."""
    return 1 + (number - 1) % RACKS


def hosts_needed(sizes: list[int], smoke_sizes: list[int]) -> int:
    """How many hosts the run starts: the largest fleet, and enough for smoke's in rack 1 alone."""
    return max([*sizes, *(RACKS * (n - 1) + 1 for n in smoke_sizes)])
