"""The ways the benchmark gathers facts from a fleet, each as client processes plus a success check.

All of them end in the same thing on every host: the cached node agent's `facts` verb with the request that
`plan` sends. The floor is plain OpenSSH (one cold `ssh` per host, all in parallel); the peer is Ansible
ad-hoc, with its `shell` module and with `raw`; the tool is `mgpu-provision facts` and `plan` (over Fabric,
or ClusterShell flat or through gateways); plain Fabric and pyinfra are the Python peers.
A run only counts when every host answered: a contender that fails fast must not look fast.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from measure import Spawn, Usage

# The floor and Ansible use the key exchange paramiko negotiates, so the floor is what the tool could reach.
KEX = "curve25519-sha256"
SSH_OPTIONS = (
    "-F", "none",
    "-o", "BatchMode=yes",
    "-o", "ControlMaster=no",
    "-o", "ControlPath=none",
    "-o", f"KexAlgorithms={KEX}",
    "-o", "StrictHostKeyChecking=yes",
    "-o", "GlobalKnownHostsFile=/dev/null",
    "-o", "ConnectTimeout=10",
)  # fmt: skip
ANSIBLE_FORKS = 64


@dataclass(frozen=True)
class BenchHost:
    name: str
    address: str
    port: int


@dataclass(frozen=True)
class Fleet:
    """One fleet size, as every contender needs it."""

    hosts: tuple[BenchHost, ...]
    user: str
    python: str  # the node's python3, as the rig file names it
    key: Path
    known_hosts: Path
    rig: Path
    agent_command: str  # the remote shell command: the request piped into the cached agent's `facts`
    workdir: Path  # per-size files (inventory, ansible.cfg)
    mgpu_provision: str  # path of the `mgpu-provision` console script
    ansible: str  # path of the `ansible` ad-hoc command
    pyinfra: str = "pyinfra"  # path of the `pyinfra` command (its own venv, like Ansible's)
    fabric_python: str = sys.executable  # a python with Fabric: the project's (the library the tool uses)
    # Where the clients run (testbed.py): the flat contenders in a namespace with a link to every rack, the
    # tree's head in one linked only to the gateways; each a command prefix entering it.
    flat: tuple[str, ...] = ()
    head: tuple[str, ...] = ()
    topology: Path | None = None  # this size's ClusterShell topology: head -> gateways -> these hosts
    gateways_ssh_config: Path | None = None  # how the head reaches the gateways (not hosts of the rig)
    gateway_python: str = "python3"  # the gateways' interpreter (CLUSTERSHELL_GW_PYTHON_EXECUTABLE)


# How the tool's own command starts the agent's python (fleet/session.py): no site, isolated.
AGENT_FLAGS = ("-S", "-I")


def agent_command(python: str, agent_name: str, request: Mapping[str, object]) -> str:
    """The remote command all contenders but the tool run: `echo '<request>' | python3 -S -I <agent> facts`.

    <agent> is the folder the agent unpacked itself into on its first run (beside `agent-H.pyz`), and the
    interpreter flags are the tool's: what the tool's own command runs once the agent is there, so every
    contender does the same node-side work.
    """
    body = json.dumps(request, separators=(",", ":"), sort_keys=True)
    agent = f"~/.cache/mgpu-provision/{agent_name.removesuffix('.pyz')}"
    return f"echo {shlex.quote(body)} | {shlex.quote(python)} {' '.join(AGENT_FLAGS)} {agent} facts"


class Contender(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def at_once(self) -> int | None:
        """How many of its processes may run at a time (None: all)."""
        ...

    def spawns(self, fleet: Fleet) -> list[Spawn]: ...

    def problem(self, fleet: Fleet, usage: Usage) -> str | None:
        """Why this run does not count (some host did not answer), or None."""
        ...


def _agent_reply_problem(text: str) -> str | None:
    try:
        reply = json.loads(text)
    except ValueError:
        return f"not one JSON object: {text[-200:]!r}"
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        return f"agent failed: {text[-300:]!r}"
    return None


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no output)"


# What `smoke` needs at the least before its ranks run, besides what the ssh floor does (a cold connection and
# the agent's facts): a launcher process (torchrun) that starts a rank process, neither importing torch.
TWO_PYTHON_STARTS = " && {python} -c pass && {python} -c pass"


@dataclass(frozen=True)
class PlainSsh:
    """The floor: one OpenSSH client per host, all started at once (or `at_once` at a time), cold
    connections, running the agent's facts command and then `then` (a shell suffix; {python} is the node's
    python)."""

    name: str = "ssh"
    then: str = ""
    at_once: int | None = None

    def spawns(self, fleet: Fleet) -> list[Spawn]:
        base = (*SSH_OPTIONS, "-o", f"UserKnownHostsFile={fleet.known_hosts}", "-i", str(fleet.key))
        command = fleet.agent_command + self.then.format(python=shlex.quote(fleet.python))
        return [
            Spawn(("ssh", *base, "-p", str(h.port), "-l", fleet.user, h.address, command), netns=fleet.flat)
            for h in fleet.hosts
        ]

    def problem(self, fleet: Fleet, usage: Usage) -> str | None:
        for host, finished in zip(fleet.hosts, usage.processes, strict=True):
            if finished.returncode != 0:
                return f"ssh to {host.name} exited {finished.returncode}: {_last_line(finished.stderr)}"
            trouble = _agent_reply_problem(finished.stdout)
            if trouble:
                return f"{host.name}: {trouble}"
        return None


# `ansible -m shell` and `-m raw` print "<host> | CHANGED | rc=0 >>" and then the command's output, per host.
_ANSIBLE_HEADER = re.compile(r"^(\S+) \| (\w+)(?: \| rc=(-?\d+))? >>$|^(\S+) \| (UNREACHABLE!|FAILED!)", re.M)
# raw runs the command on a pty (ssh -tt), so ssh's own goodbye lands in the same stream.
_SSH_GOODBYE = re.compile(r"^Connection to \S+ closed\.\r?$", re.M)


def ansible_results(stdout: str) -> dict[str, tuple[str, str]]:
    """Per host: (status, output) from the default output of an ad-hoc `shell` or `raw` command."""
    results: dict[str, tuple[str, str]] = {}
    matches = list(_ANSIBLE_HEADER.finditer(stdout))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(stdout)
        host = match.group(1) or match.group(4)
        status = f"{match.group(2)} rc={match.group(3)}" if match.group(1) else match.group(5)
        results[host] = (status, _SSH_GOODBYE.sub("", stdout[match.end() : end]).strip())
    return results


def ansible_files(fleet: Fleet) -> tuple[Path, Path]:
    """Write the inventory and the ansible.cfg for this fleet; return (config, inventory).

    Host keys are checked against the same known_hosts file the other contenders use; multiplexing and
    compression are off so every run opens cold connections, as the floor's do. Otherwise Ansible gets its
    documented fast settings: pipelining (a module costs one SSH command, not four) and a fixed interpreter
    (no discovery round trip).
    """
    inventory = fleet.workdir / "inventory.ini"
    lines = ["[bench]"]
    lines += [f"{h.name} ansible_host={h.address} ansible_port={h.port}" for h in fleet.hosts]
    lines += [
        "[bench:vars]",
        f"ansible_user={fleet.user}",
        f"ansible_ssh_private_key_file={fleet.key}",
        f"ansible_python_interpreter={fleet.python}",
    ]
    inventory.write_text("\n".join(lines) + "\n")
    config = fleet.workdir / "ansible.cfg"
    ssh_args = " ".join([*SSH_OPTIONS, "-o", f"UserKnownHostsFile={fleet.known_hosts}"])
    config.write_text(
        "[defaults]\n"
        f"inventory = {inventory}\n"
        "host_key_checking = True\n"
        f"forks = {ANSIBLE_FORKS}\n"
        "gathering = explicit\n"
        "deprecation_warnings = False\n"
        "nocows = True\n"
        f"local_tmp = {fleet.workdir / 'ansible-tmp'}\n"
        "[ssh_connection]\n"
        f"ssh_args = {ssh_args}\n"
        "pipelining = True\n"
    )
    return config, inventory


@dataclass(frozen=True)
class AnsibleAdHoc:
    """The peer tool: `ansible all -m <module> -a '<agent command>' -f 64`.

    `shell` is how people run a command ad hoc (Ansible ships its module to each host and runs it with
    python); `raw` skips the module and is the least Ansible can do per host.
    """

    name: str
    module: str
    at_once: int | None = None

    def spawns(self, fleet: Fleet) -> list[Spawn]:
        config, _ = ansible_files(fleet)
        argv = (fleet.ansible, "all", "-f", str(ANSIBLE_FORKS), "-m", self.module, "-a", fleet.agent_command)
        env = {"ANSIBLE_CONFIG": str(config), "ANSIBLE_FORCE_COLOR": "0"}
        return [Spawn(argv, env=env, netns=fleet.flat)]

    def problem(self, fleet: Fleet, usage: Usage) -> str | None:
        finished = usage.processes[0]
        results = ansible_results(finished.stdout)
        for host in fleet.hosts:
            if host.name not in results:
                return f"ansible printed nothing for {host.name} (exit {finished.returncode}): " + _last_line(
                    finished.stderr or finished.stdout
                )
            status, output = results[host.name]
            if status != "CHANGED rc=0":
                return f"ansible: {host.name} {status}: {output[-300:]}"
            trouble = _agent_reply_problem(output)
            if trouble:
                return f"ansible: {host.name}: {trouble}"
        return None


FABRIC_GROUP = Path(__file__).resolve().with_name("fabric_group.py")


def _per_host_replies(fleet: Fleet, replies: Mapping[str, str], label: str, exit_code: int) -> str | None:
    """The first host whose reply is missing or not an ok agent reply, as a problem; None when all are."""
    for host in fleet.hosts:
        reply = replies.get(host.name)
        if reply is None:
            return f"{label} printed nothing for {host.name} (exit {exit_code})"
        trouble = _agent_reply_problem(reply)
        if trouble:
            return f"{label}: {host.name}: {trouble}"
    return None


@dataclass(frozen=True)
class PlainFabric:
    """The floor of a tool built on Fabric: one `ThreadingGroup(...).run(<agent command>)` (fabric_group.py),
    one thread and one cold Paramiko connection per host, host keys checked."""

    name: str = "fabric"
    at_once: int | None = None

    def spawns(self, fleet: Fleet) -> list[Spawn]:
        targets = [f"{h.address}:{h.port}" for h in fleet.hosts]
        argv = (fleet.fabric_python, str(FABRIC_GROUP), str(fleet.known_hosts), str(fleet.key), fleet.user)
        return [Spawn((*argv, fleet.agent_command, *targets), netns=fleet.flat)]

    def problem(self, fleet: Fleet, usage: Usage) -> str | None:
        finished = usage.processes[0]
        try:
            by_target = json.loads(finished.stdout)
        except ValueError:
            return f"fabric exited {finished.returncode}: {_last_line(finished.stderr or finished.stdout)}"
        replies = {h.name: by_target.get(f"{h.address}:{h.port}") for h in fleet.hosts}
        found = {name: reply for name, reply in replies.items() if isinstance(reply, str)}
        return _per_host_replies(fleet, found, "fabric", finished.returncode)


# `pyinfra INVENTORY exec -- CMD` prints each host's output lines to stderr as "[<host>] <line>" (padded
# after the bracket to line up, and in bold where it thinks a terminal reads it).
_PYINFRA_LINE = re.compile(r"^\[(\S+?)\] +(.*)$", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def pyinfra_inventory(fleet: Fleet) -> Path:
    """pyinfra's inventory (a Python file) for this fleet: the same key, user and known_hosts as the others,
    unknown host keys refused, no agent, no ssh_config."""
    inventory = fleet.workdir / "pyinfra_inventory.py"
    data = {
        "ssh_user": fleet.user,
        "ssh_key": str(fleet.key),
        "ssh_known_hosts_file": str(fleet.known_hosts),
        "ssh_strict_host_key_checking": "yes",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
    }
    hosts = [(h.name, {**data, "ssh_hostname": h.address, "ssh_port": h.port}) for h in fleet.hosts]
    inventory.write_text(f"hosts = {hosts!r}\n")
    return inventory


def pyinfra_results(output: str) -> dict[str, str]:
    """Per host: the last JSON-looking line it printed (pyinfra also prints its own progress lines)."""
    results: dict[str, str] = {}
    for match in _PYINFRA_LINE.finditer(_ANSI.sub("", output)):
        if match.group(2).startswith("{"):
            results[match.group(1)] = match.group(2)
    return results


@dataclass(frozen=True)
class PyinfraExec:
    """The nearest peer in Python (also on Paramiko): `pyinfra INVENTORY exec -y -- <agent command>`, with
    as many hosts at once as the tool's forks (64)."""

    name: str = "pyinfra"
    at_once: int | None = None

    def spawns(self, fleet: Fleet) -> list[Spawn]:
        inventory = pyinfra_inventory(fleet)
        argv = (fleet.pyinfra, str(inventory), "exec", "-y", "--parallel", str(ANSIBLE_FORKS), "--")
        env = {"PYINFRA_PROGRESS": "off", "NO_COLOR": "1"}
        return [Spawn((*argv, fleet.agent_command), env=env, netns=fleet.flat)]

    def problem(self, fleet: Fleet, usage: Usage) -> str | None:
        finished = usage.processes[0]
        replies = pyinfra_results(finished.stderr + finished.stdout)
        trouble = _per_host_replies(fleet, replies, "pyinfra", finished.returncode)
        if trouble and finished.returncode != 0:
            return f"{trouble}: {_last_line(finished.stderr or finished.stdout)}"
        return trouble


@dataclass(frozen=True)
class Tool:
    """`mgpu-provision <verb> --json` on the whole fleet; `expect_exit` is the converged fleet's exit code.
    With `tree`, from the head's namespace through the gateways: `--topology` and the gateways' ssh_config
    (ClusterShell's tree, `--via clush` in `extra`)."""

    verb: str
    expect_exit: int = 0
    extra: tuple[str, ...] = ()
    at_once: int | None = None
    label: str | None = None  # the contender's name where it is not the verb's
    tree: bool = False

    @property
    def name(self) -> str:
        return self.label or self.verb

    def spawns(self, fleet: Fleet) -> list[Spawn]:
        argv = (
            fleet.mgpu_provision,
            self.verb,
            str(fleet.rig),
            "--json",
            "--known-hosts",
            str(fleet.known_hosts),
            *self.extra,
        )
        if not self.tree:
            return [Spawn(argv, netns=fleet.flat)]
        if fleet.topology is None or fleet.gateways_ssh_config is None:
            raise ValueError(f"{self.name} needs the fleet's topology and the gateways' ssh_config")
        tree = ("--topology", str(fleet.topology), "--ssh-config", str(fleet.gateways_ssh_config))
        # ClusterShell's gateway logs to /tmp/<gateway>.gw.log unless told otherwise, and the bench's gateways
        # share this machine's /tmp: their logs go to the size's own folder instead.
        env = {
            "CLUSTERSHELL_GW_PYTHON_EXECUTABLE": fleet.gateway_python,
            "CLUSTERSHELL_GW_LOG_DIR": str(fleet.workdir),
        }
        return [Spawn((*argv, *tree), env=env, netns=fleet.head)]

    def problem(self, fleet: Fleet, usage: Usage) -> str | None:
        finished = usage.processes[0]
        if finished.returncode != self.expect_exit:
            return (
                f"mgpu-provision {self.verb} exited {finished.returncode}, expected {self.expect_exit}: "
                + _last_line(finished.stderr or finished.stdout)
            )
        try:
            json.loads(finished.stdout)
        except ValueError:
            return f"mgpu-provision {self.verb} --json printed no JSON: {finished.stdout[-200:]!r}"
        return None


# Past 64 hosts, 2 cores doing every key exchange at once are slower than 64 at a time (plan's default forks):
# the floor is then the faster of the two.
FLOOR_FORKS = 64

CONTENDERS: dict[str, Contender] = {
    "ssh": PlainSsh(),
    f"ssh-{FLOOR_FORKS}": PlainSsh(f"ssh-{FLOOR_FORKS}", at_once=FLOOR_FORKS),
    "facts": Tool("facts"),
    "plan": Tool("plan"),
    # On a converged fleet apply reads each host's facts, finds nothing to do and contacts no host again:
    # its floor is the same as plan's.
    "apply": Tool("apply", extra=("--yes",)),
    "ansible": AnsibleAdHoc("ansible", "shell"),
    "ansible-raw": AnsibleAdHoc("ansible-raw", "raw"),
    # plan through ClusterShell's flat fan-out over OpenSSH (issue 41): the same plan, no Paramiko.
    "clush": Tool("plan", extra=("--via", "clush"), label="clush"),
    # The same plan through ClusterShell's tree: from a head that reaches the racks only through 2 gateways.
    "clush-tree": Tool("plan", extra=("--via", "clush"), label="clush-tree", tree=True),
    "fabric": PlainFabric(),
    "pyinfra": PyinfraExec(),
}


# The smoke phase's pair, on a fleet converged for smoke (real torch): its floor and the tool.
SMOKE_FLOOR = PlainSsh("smoke-floor", TWO_PYTHON_STARTS)
SMOKE = Tool("smoke")


def select(names: Sequence[str]) -> list[Contender]:
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        raise ValueError(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(CONTENDERS)}")
    return [CONTENDERS[n] for n in names]
