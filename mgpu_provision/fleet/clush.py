"""`--via clush`: the batch seam on ClusterShell, the HPC fan-out library, running the agent over OpenSSH.

Paramiko's key exchange is the floor of any Python SSH client (~11 ms of CPU a host, all in one GIL-bound
process); ClusterShell instead starts one OpenSSH client per host and only reads their pipes. Hosts whose
request is byte-identical (the same command and the same stdin: facts and plan of one rig type, usually the
whole fleet) share one ClusterShell worker. Each host keeps its own reply, exit code, timeout and error
(pool.py makes them a `HostOutcome`), as the Fabric path gives them: exit 255 (OpenSSH's own failure) is
`unreachable` with ssh's last words, exit 97 (the agent is missing: docs/ARCHITECTURE.md, "The agent
protocol") uploads the agent on the command's stdin into the folder the reply names, then runs the request
again on those hosts.

OpenSSH reads a generated ssh_config naming each host's address, port, user, key and jump host; the run's
known_hosts file is used as is. The key exchange offered first is curve25519-sha256: OpenSSH 9.x prefers
sntrup761x25519 (post-quantum), which costs ~150 ms of client CPU a connection here against ~15 ms.

Tree mode (`--topology FILE`, ClusterShell's topology.conf): the head reaches the nodes through gateways,
each running ClusterShell's gateway on `python3` (ClusterShell's CLUSTERSHELL_GW_PYTHON_EXECUTABLE names
another interpreter), with one fix (`_GATEWAY`: each worker's input to that worker), over one OpenSSH
connection from its parent; the gateways start the nodes' OpenSSH clients. Every hop reads the same
ssh_config and known_hosts, so both go, by level, to the same place under each gateway's home
(`~/.cache/mgpu-provision/clush/<hash>/`, which ClusterShell expands on each side), copied only where the
head has no record of that copy (`_GatewayFiles`: a gateway that lost it says so, gets it again and its
hosts run once more). A gateway that cannot start or dies makes the hosts behind it `unreachable` with its
own words while the others go on; a run is bounded on the head too (a gateway that stops answering is not
waited for past the hosts' command limit and the connect timeouts).

ClusterShell is an optional extra, imported only here and only under `--via clush`.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import hashlib
import io
import json
import os
import shlex
import tarfile
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from ..errors import AgentError, ProvisionError
from ..typing_lite import NamedTuple
from . import options as fleet_options
from .clush_tree import Topology, read_topology
from .options import AgentPayload, FleetOptions, Timeouts
from .session import AGENT_MISSING, agent_command, cache_folder, parse_response, partial_name, upload_command
from .targets import HostTarget, describe

SSH_FAILED = 255  # OpenSSH's exit status when it could not connect, log in or keep the connection
KEX = "curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,diffie-hellman-group14-sha256"
UPLOAD_TIMEOUT_S = 120.0
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
GATEWAY_LOST = os.EX_PROTOCOL  # ClusterShell's exit code for a host whose gateway went away (Worker/Tree.py)
TREE_FOLDER = "~/.cache/mgpu-provision/clush"  # the run's ssh_config and known_hosts, on every hop
GATEWAY_PYTHON = "python3"  # ClusterShell's default is the head's interpreter name (a venv's `python`)
# What a gateway says, before it starts ClusterShell's gateway, when the run's files are not in its folder.
TREE_FILES_MISSING = "mgpu-provision: this gateway has no copy of the run's ssh_config and known_hosts"
TREE_RECORD = "gateways.json"  # in the head's own copy of a run's folder: the gateways that hold it
# A run's folder that no run has used for this long is removed, on the head and on each gateway, by the next
# tree run there: every change of the hosts or of known_hosts (accept-new adds to it) makes a new folder.
STALE_AFTER_S = 14 * 24 * 3600

# Run where a tree run starts, on the head and on each gateway (in `_GATEWAY`): this run's folder is marked
# as used now, then the folders beside it that no run used for `stale_after` seconds go, with any upload an
# interrupted run left in them. Best effort: a folder that cannot be removed now is tried again next run.
_PRUNE = """\
import os, shutil, time
def prune(held, stale_after):
    try:
        os.utime(held)
        limit = time.time() - stale_after
        with os.scandir(os.path.dirname(held)) as entries:
            for entry in entries:
                if entry.path != held and entry.is_dir(follow_symlinks=False):
                    if entry.stat(follow_symlinks=False).st_mtime < limit:
                        shutil.rmtree(entry.path, ignore_errors=True)
    except OSError:
        pass
"""


# Run before ClusterShell starts any client, on the head and on each gateway (in `_GATEWAY`). ClusterShell
# starts every OpenSSH client with a Python-level fork (1.10.1, Worker/fastsubprocess.py
# `Popen._execute_child`, Python 2.6's subprocess): the interpreter's pages are copied on write and the child
# runs Python code (closes, dup2s, execvp's walk of PATH) before its exec. Measured from a 48 MB head: 0.7 ms
# of CPU in the parent and 1.7 ms in the child a client, against 0.13 and ~0 with posix_spawn (glibc's
# clone(CLONE_VM|CLONE_VFORK)). This does the same dup2s with posix_spawnp; the pipes' other ends are
# close-on-exec already (Python 3's os.pipe). Anything else, a preexec_fn, a cwd, or a spawn that fails (a
# missing ssh), takes ClusterShell's own path, so a failed exec still ends as its child's exit 255. Another
# ClusterShell whose method does not take these arguments is left as it is.
_SPAWN = """\
import os
from ClusterShell.Worker import fastsubprocess
def use_posix_spawn():
    forked = fastsubprocess.Popen._execute_child
    expected = ("self", "args", "executable", "preexec_fn", "cwd", "env", "universal_newlines", "shell",
                "p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite")
    code = getattr(forked, "__code__", None)
    if code is None or code.co_varnames[:len(expected)] != expected or not hasattr(os, "posix_spawnp"):
        return
    def spawned(self, args, executable, preexec_fn, cwd, env, universal_newlines, shell,
                p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite):
        words = [args] if isinstance(args, str) else list(args)
        if shell:
            words = ["/bin/sh", "-c"] + words
        ends = ((p2cread, 0, p2cwrite), (c2pwrite, 1, c2pread), (errwrite, 2, errread))
        actions = [(os.POSIX_SPAWN_DUP2, fd, to) for fd, to, _ in ends if fd is not None]
        try:
            if preexec_fn is not None or cwd is not None:
                raise OSError("not for posix_spawn")
            self.pid = os.posix_spawnp(executable or words[0], words, os.environ if env is None else env,
                                       file_actions=actions)
        except OSError:
            return forked(self, args, executable, preexec_fn, cwd, env, universal_newlines, shell,
                          p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._child_created = True
        for fd, _, other in ends:
            if fd is not None and other is not None:
                os.close(fd)
    spawned.mgpu_spawn = True
    fastsubprocess.Popen._execute_child = spawned
if not getattr(fastsubprocess.Popen._execute_child, "mgpu_spawn", False):
    use_posix_spawn()
"""


@functools.cache
def spawn_clients() -> None:
    """ClusterShell's clients started with posix_spawn from now on in this process (`_SPAWN`): once per
    process, not once per round (apply's lockstep runs several)."""
    exec(_SPAWN, {})


def ssh_config(targets: list[HostTarget], user_config: Path | None) -> str:
    """One `Host` block per target (its rig name is the alias ClusterShell connects to), then the user's
    own config for anything the rig does not say."""
    blocks = []
    for t in targets:
        lines = [f"Host {t.name}", f"  HostName {t.address}", f"  Port {t.port or 22}"]
        lines += [f"  User {t.user}"] if t.user else []
        lines += [f"  IdentityFile {t.identity_file}", "  IdentitiesOnly yes"] if t.identity_file else []
        lines += [f"  ProxyJump {t.jump}"] if t.jump else []
        blocks.append("\n".join(lines))
    if user_config is not None:
        blocks.append(f"Match all\n  Include {user_config.resolve()}")
    return "\n\n".join(blocks) + "\n"


def ssh_options(config: Path | str, options: FleetOptions, also_known: str | None = None) -> str:
    """OpenSSH's options for every connection of the run; `also_known` is a second known_hosts file (tree
    mode: the run's copy on each gateway, where the head's own path need not exist)."""
    known = str((options.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser())
    policy = "accept-new" if options.accept_new_host_keys else "yes"
    files = f"{known} {also_known}" if also_known else known
    return " ".join(
        shlex.quote(word)
        for word in (
            "-F", str(config), f"-oKexAlgorithms={KEX}", f"-oUserKnownHostsFile={files}",
            f"-oStrictHostKeyChecking={policy}", "-oServerAliveInterval=15",
        )
    )  # fmt: skip


class Outcome(NamedTuple):
    """One host's fate, the fields of pool.HostOutcome (which imports this module, not the other way)."""

    status: Literal["ok", "failed", "unreachable"]
    value: dict[str, Any] | None
    error: str | None
    elapsed_s: float


class _Replies:
    """What each host's ssh printed and how it ended, collected by ClusterShell's event handler."""

    def __init__(self, on_done: Callable[[str], None] | None) -> None:
        self.out: dict[str, list[bytes]] = defaultdict(list)
        self.err: dict[str, list[bytes]] = defaultdict(list)
        self.code: dict[str, int] = {}
        self.ended: dict[str, float] = {}
        self.stalled: dict[str, tuple[str, float]] = {}  # host → the gateway it waited on, for how long
        self.on_done = on_done

    def forget(self, name: str) -> None:
        """A host's earlier step (its 97, its upload) is over: its next worker's output starts afresh."""
        for collected in (self.out, self.err, self.code, self.ended, self.stalled):
            collected.pop(name, None)

    def handler(self) -> Any:
        from ClusterShell.Event import EventHandler

        replies = self

        class Collect(EventHandler):  # type: ignore[misc]  # ClusterShell has no type hints
            def ev_read(self, worker: Any, node: str, sname: str, msg: bytes) -> None:
                (replies.out if sname == worker.SNAME_STDOUT else replies.err)[node].append(msg)

            def ev_hup(self, worker: Any, node: str, rc: int) -> None:
                replies.code[node] = rc
                replies.ended[node] = time.monotonic()

        return Collect()

    def text(self, node: str, stream: Mapping[str, list[bytes]]) -> str:
        # ClusterShell hands output over line by line, without the newlines.
        return b"\n".join(stream.get(node, [])).decode(errors="replace")


Groups = Mapping[tuple[str, bytes, float], list[str]]  # (command, stdin, timeout) → the hosts sending it


# ClusterShell's TreeWorker as the head and every gateway run it, with two changes. The hosts of a gateway
# that failed before it was set up, with no other gateway to take them, end with LOST (GATEWAY_LOST):
# ClusterShell reroutes them and, finding no route, raises out of the whole run (Worker/Tree.py
# `_relaunch`, Propagation.py `next_hop`) — on a gateway, that ended the gateway and every host behind it.
# And its gateways run INVOKE (`invoke_gateway`), set as it is made: a running task starts a worker as it
# is scheduled (Engine.add), so on a gateway its channels to the next level open inside `recv_ctl`.
_TREE_WORKER = """\
from ClusterShell.NodeSet import NodeSet
from ClusterShell.Propagation import RouteResolvingError
from ClusterShell.Worker.Tree import TreeWorker as _TreeWorker
from ClusterShell.Worker.Worker import DistantWorker
class TreeWorker(_TreeWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.invoke_gateway = INVOKE
    def _relaunch(self, previous_gateway):
        targets = NodeSet.fromlist(self.gwtargets[previous_gateway])
        try:
            super()._relaunch(previous_gateway)
        except RouteResolvingError:
            self._target_count += len(targets)
            for node in targets:
                DistantWorker._on_node_close(self, node, LOST)
                self._close_count += 1
            self._check_fini()
"""

# What every gateway runs instead of ClusterShell's own entry point. First, a gateway without the run's
# ssh_config and known_hosts (its cache wiped since the head recorded the copy) ends with
# TREE_FILES_MISSING rather than start ssh clients that cannot read their config: the head copies them
# there and runs that gateway's hosts again (`_GatewayFiles`). ClusterShell's GatewayChannel keeps one
# `propagation`, the worker it started last, and hands it every worker's stdin writes and end of input
# (1.10.1, Gateway.py `GatewayChannel.recv_ctl`): a second worker through a gateway got the first one's
# input (seen in the tree e2e: gpu-004 was sent gpu-003's apply request, and gpu-003 waited for its own
# until the command limit). Here each write goes to the worker its message comes from (`srcid`), and the
# workers are _TREE_WORKER's, whose gateways run this same code: `C` is this text, the command
# `python3 -c "C=…;exec(C)"`.
_GATEWAY = """\
import os, shlex, sys
held = os.path.expanduser(FOLDER)
if not all(os.path.isfile(os.path.join(held, name)) for name in ("ssh_config", "known_hosts")):
    sys.exit("%s (%s)" % (MISSING, FOLDER))
exec(PRUNE)
prune(held, STALE_AFTER)
exec(SPAWN)
import ClusterShell.Gateway as g
from ClusterShell.Communication import ControlMessage
INVOKE = PREFIX + " -c " + shlex.quote("C=%r;exec(C)" % C)
exec(TREE_WORKER)
recv_ctl, g.TreeWorker = g.GatewayChannel.recv_ctl, TreeWorker
def routed(self, msg):
    workers = self.__dict__.setdefault("mgpu_workers", {})
    ctl = msg.type == ControlMessage.ident
    if ctl and msg.action in ("write", "eof"):
        self.propagation = workers.get(msg.srcid, self.propagation)
    recv_ctl(self, msg)
    if ctl and msg.action == "shell" and self.propagation is not None:
        workers[msg.srcid] = self.propagation
g.GatewayChannel.recv_ctl = routed
g.gateway_main()
"""


def invoke_gateway(folder: str) -> str:
    """The command the head (and each gateway) runs on a gateway: ClusterShell's gateway with its stdin
    writes routed per worker (`_GATEWAY`), once the run's files are in `folder` there, on `python3` unless
    CLUSTERSHELL_GW_PYTHON_EXECUTABLE names another interpreter (ClusterShell would take the head's own
    interpreter's name, a virtualenv's `python` that a gateway may not have)."""
    passed = ("PYTHONPATH", *(f"CLUSTERSHELL_GW_{n}" for n in ("LOG_DIR", "LOG_LEVEL", "B64_LINE_LENGTH")))
    words = [f"{name}={shlex.quote(value)}" for name in passed if (value := os.environ.get(name))]
    python = os.environ.get("CLUSTERSHELL_GW_PYTHON_EXECUTABLE", GATEWAY_PYTHON)
    prefix = " ".join([*words, shlex.quote(python)])
    names = {
        "PREFIX": prefix, "FOLDER": folder, "MISSING": TREE_FILES_MISSING, "LOST": GATEWAY_LOST,
        "PRUNE": _PRUNE, "STALE_AFTER": STALE_AFTER_S, "SPAWN": _SPAWN,
    }  # fmt: skip
    code = "".join(f"{name} = {value!r}\n" for name, value in names.items())
    code += f"TREE_WORKER = {_TREE_WORKER!r}\n{_GATEWAY}"
    return f"{prefix} -c {shlex.quote(f'C={code!r};exec(C)')}"


def _tree_worker(invoke: str) -> Any:
    """The head's TreeWorker (_TREE_WORKER), its gateways running `invoke`."""
    names: dict[str, Any] = {"INVOKE": invoke, "LOST": GATEWAY_LOST}
    exec(_TREE_WORKER, names)
    return names["TreeWorker"]


def _run(
    groups: Groups, options: FleetOptions, ssh: str, connect_timeout: float, replies: _Replies,
    tree: _GatewayFiles | None = None,
) -> None:  # fmt: skip
    """Run every group in one ClusterShell task, one worker per group: flat, or through the tree's
    gateways. A tree run ends by `connect_timeout` per level past its longest command limit at the latest:
    the hosts still waiting on a gateway then are noted in `replies.stalled`."""
    from ClusterShell.Event import EventHandler
    from ClusterShell.NodeSet import NodeSet
    from ClusterShell.Task import task_self

    spawn_clients()
    task = task_self()
    task.set_info("ssh_options", ssh)
    task.set_info("connect_timeout", max(1, round(connect_timeout)))
    task.set_info("fanout", options.forks or 512)
    # The handler keeps each host's output; ClusterShell's own per-line trees would hold it a second time.
    task.set_default("stdout_msgtree", False)
    task.set_default("stderr_msgtree", False)
    workers = []
    if tree is not None:
        task.topology, task.router = tree.topology.tree, None  # one router: a gateway marked lost stays lost
        tree_worker = _tree_worker(tree.invoke)
    for (command, stdin, timeout), names in groups.items():
        for name in names:
            replies.forget(name)
        if tree is None:
            # tree=False: a site's /etc/clustershell/topology.conf must not make a flat run a tree one.
            worker = task.shell(
                command, nodes=NodeSet.fromlist(names), handler=replies.handler(), timeout=timeout,
                stdin=True, stderr=True, tree=False,
            )  # fmt: skip
        else:
            nodes = NodeSet.fromlist(names)
            handler = replies.handler()
            worker = tree_worker(nodes, handler=handler, timeout=timeout, command=command, stderr=True)
            task.schedule(worker)
        worker.write(stdin)
        worker.set_write_eof()
        workers.append(worker)
    if tree is None:
        task.resume()
        return
    levels = max(1, len(tree.topology.gateway_levels([n for names in groups.values() for n in names])))
    deadline = max(timeout for _, _, timeout in groups) + connect_timeout * (levels + 1) + 5

    class Deadline(EventHandler):  # type: ignore[misc]  # ClusterShell has no type hints
        """Notes who still waits on which gateway, then ends the run: read here, inside the run, because
        ending it hands those hosts to ClusterShell's gateway-lost path and forgets their gateways."""

        def ev_timer(self, timer: Any) -> None:
            for worker in workers:
                for gateway, targets in worker.gwtargets.items():
                    replies.stalled.update(dict.fromkeys(targets, (gateway, deadline)))
            task.abort()

    task.timer(deadline, handler=Deadline(), autoclose=True)
    try:
        task.resume()
    finally:
        task.abort(kill=True)  # the next run gets a task of its own: no router, topology or channel left


def _write_atomic(path: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, prefix=f".{path.name}.") as part:
        part.write(data)
    try:
        os.replace(part.name, path)
    except OSError:
        os.unlink(part.name)
        raise


def prune_beside(folder: Path, stale_after: float = STALE_AFTER_S) -> None:
    """`folder` marked as used now; the run folders beside it unused for `stale_after` seconds removed
    (`_PRUNE`, the code each gateway runs too)."""
    names: dict[str, Any] = {}
    exec(_PRUNE, names)
    names["prune"](str(folder), stale_after)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""  # accept-new's first run: the run's own file comes later


class _GatewayFiles:
    """The ssh_config and known_hosts every hop of a tree run reads, in a folder named by their hash under
    each gateway's home (TREE_FOLDER, as under the head's). Beside its own copy the head records which
    gateways it copied that folder to (TREE_RECORD; missing or unreadable: none), and copies, level by
    level, only to the others. A gateway that lost its copy since says so as it starts (`_GATEWAY`):
    `lacking` names the hosts lost that way and forgets those gateways, so `copy` sends them the files again:
    a stale record costs one more round, never a host."""

    def __init__(
        self, topology: Topology, options: FleetOptions, config: str, connect: float, replies: _Replies
    ) -> None:
        known = (options.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
        contents = {"ssh_config": config.encode(), "known_hosts": _read(known)}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for name, data in contents.items():
                entry = tarfile.TarInfo(name)
                entry.size, entry.mode = len(data), 0o600
                archive.addfile(entry, io.BytesIO(data))
        self.tar = buffer.getvalue()
        self.folder = f"{TREE_FOLDER}/{hashlib.sha256(self.tar).hexdigest()[:16]}"
        local = Path(self.folder).expanduser()
        local.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, data in contents.items():
            _write_atomic(local / name, data)
        prune_beside(local)
        self.record = local / TREE_RECORD
        self.held = self._recorded()
        self.saved = set(self.held)
        self.topology, self.options, self.connect, self.replies = topology, options, connect, replies
        self.ssh = ssh_options(f"{self.folder}/ssh_config", options, f"{self.folder}/known_hosts")
        self.invoke = invoke_gateway(self.folder)
        remote = shlex.quote(self.folder.replace("~/", "", 1))
        self.upload = (
            f"umask 077 && cd && mkdir -p {remote} && t=$(mktemp -d {remote}/.up.XXXXXX) && "
            f'tar -xf - -C "$t" && mv -f "$t/ssh_config" "$t/known_hosts" {remote}/ && rmdir "$t"'
        )

    def _recorded(self) -> set[str]:
        try:
            names = json.loads(self.record.read_bytes())
        except (OSError, ValueError):
            return set()
        return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()

    def _save(self) -> None:
        if self.held != self.saved:
            with contextlib.suppress(OSError):  # unsaved, the next run copies once more
                _write_atomic(self.record, json.dumps(sorted(self.held)).encode())
            self.saved = set(self.held)

    def copy(self, hosts: list[str]) -> dict[str, str]:
        """The files onto every gateway on the way to `hosts` that has no record, nearest the head first;
        the gateways that could not get them, with their words. A copy refused on the way by a gateway
        that lost its own makes that one copied again, once."""
        levels = self.topology.gateway_levels(hosts)
        for _ in range(2):
            lost: dict[str, str] = {}
            for level in levels:
                todo = [g for g in level if g not in self.held and not _behind_lost(self.topology, g, lost)]
                if todo:
                    copies = {(self.upload, self.tar, UPLOAD_TIMEOUT_S): todo}
                    _run(copies, self.options, self.ssh, self.connect, self.replies, self)
                for gateway in todo:
                    if self.replies.code.get(gateway) == 0:
                        self.held.add(gateway)
                    else:
                        lost[gateway] = _gateway_words(self.replies, gateway)
            if not (lost and self._forget_lacking(levels)):
                break
        self._save()
        for gateway in (g for level in levels for g in level):
            self.replies.forget(gateway)  # what the copy printed is not what the gateway says in the run
        return lost

    def lacking(self, names: list[str]) -> list[str]:
        """Of `names`, those lost on their way at a gateway that had not the run's files."""
        stale = self._forget_lacking(self.topology.gateway_levels(names))
        gone = [n for n in names if self.replies.code.get(n) == GATEWAY_LOST and not self.replies.out.get(n)]
        return [n for n in gone if any(g in stale for level in _ways(self.topology, n) for g in level)]

    def _forget_lacking(self, levels: list[list[str]]) -> set[str]:
        """The gateways that said they lack the files (TREE_FILES_MISSING), now off the record."""
        stale = {
            gateway
            for level in levels
            for gateway in level
            if any(
                line.strip().startswith(TREE_FILES_MISSING)
                for line in self.replies.text(gateway, self.replies.err).splitlines()
            )
        }
        self.held -= stale
        self._save()
        return stale


def _gateway_words(replies: _Replies, gateways: str) -> str:
    """Why a gateway failed, in its own words (ClusterShell reports a gateway's stderr under its name)."""
    from ClusterShell.NodeSet import NodeSet

    for gateway in NodeSet(gateways):
        lines = [line for line in replies.text(gateway, replies.err).splitlines() if line.strip()]
        if lines:
            last = lines[-1].strip()
            if "No module named" in last and "ClusterShell" in last:
                python = os.environ.get("CLUSTERSHELL_GW_PYTHON_EXECUTABLE", GATEWAY_PYTHON)
                return (
                    f"gateway {gateway} has no ClusterShell for {python}: install ClusterShell >= 1.9.3 "
                    "there, or name its interpreter in CLUSTERSHELL_GW_PYTHON_EXECUTABLE"
                )
            return f"gateway {gateway}: {last}"
    return f"the connection to gateway {gateways} ended"


def call_many_clush(
    targets: list[HostTarget],
    verb: str,
    requests: Mapping[str, dict[str, Any]],
    options: FleetOptions,
    agent: AgentPayload,
    timeout: Timeouts = None,
) -> dict[str, Outcome]:
    """Each target's `verb` result (or its error) through ClusterShell; outcomes in target order."""
    started = time.monotonic()
    by_name = {t.name: t for t in targets}
    connect = max(t.connect_timeout_s for t in targets)
    topology = read_topology(options.topology, list(by_name)) if options.topology is not None else None
    replies = _Replies(options.on_host_done)
    outcomes: dict[str, Outcome] = {}

    def limit_of(t: HostTarget) -> float:
        limit = fleet_options.limit_of(timeout, t.name)
        return limit if limit is not None else t.command_timeout_s

    def command_of(t: HostTarget) -> str:
        sudo = t.become and (t.user or getpass.getuser()) != "root"
        return agent_command(agent.name, t.python, verb, sudo)

    def request_groups(names: list[str]) -> dict[tuple[str, bytes, float], list[str]]:
        groups: dict[tuple[str, bytes, float], list[str]] = defaultdict(list)
        for name in names:
            t = by_name[name]
            stdin = json.dumps({"args": requests[name], "simulate": t.simulate}).encode()
            groups[(command_of(t), stdin, limit_of(t))].append(name)
        return groups

    def finish(
        name: str,
        status: Literal["ok", "failed", "unreachable"],
        value: dict[str, Any] | None,
        error: str | None,
    ) -> None:
        outcomes[name] = Outcome(status, value, error, replies.ended.get(name, time.monotonic()) - started)
        if options.on_host_done is not None:
            options.on_host_done(name)

    config_text = ssh_config(targets, options.ssh_config)
    tree = None if topology is None else _GatewayFiles(topology, options, config_text, connect, replies)

    def run(groups: Groups, ssh: str) -> None:
        if groups:
            _run(groups, options, ssh, connect, replies, tree)

    def reach(tree: _GatewayFiles, names: list[str]) -> list[str]:
        """The run's files onto the gateways on the way to `names`; those behind one that could not get
        them end here, unreachable; the others."""
        lost = tree.copy(names)
        for name in names:
            blocked = _behind_lost(tree.topology, name, lost)
            if blocked:
                finish(name, "unreachable", None, f"cannot reach {describe(by_name[name])} through {blocked}")
        return [n for n in names if n not in outcomes]

    def attempt(names: list[str], ssh: str) -> None:
        """The request on `names`; where a reply says the agent is missing, its upload, the request again."""
        run(request_groups(names), ssh)
        missing = [n for n in names if replies.code.get(n) == AGENT_MISSING]
        if not missing:
            return
        uploads: dict[tuple[str, bytes, float], list[str]] = defaultdict(list)
        partials: dict[str, str] = {}  # one partial name per cache folder: one worker per folder
        for name in missing:
            cache = cache_folder(replies.text(name, replies.out))
            partial = partials.setdefault(cache, partial_name(cache, agent.name))
            command = upload_command(cache, partial, f"{cache}/{agent.name}")
            uploads[(command, agent.data, UPLOAD_TIMEOUT_S)].append(name)
        run(uploads, ssh)
        for name in missing:
            if replies.code.get(name) not in (0, None):
                last = (replies.text(name, replies.err).strip().splitlines() or ["no error output"])[-1]
                finish(name, "failed", None, f"cannot send the agent to {describe(by_name[name])}: {last}")
        run(request_groups([n for n in missing if replies.code.get(n) == 0]), ssh)

    if tree is None:
        with tempfile.TemporaryDirectory(prefix="mgpu-clush-") as scratch:
            config = Path(scratch) / "ssh_config"
            config.write_text(config_text)
            attempt(list(by_name), ssh_options(config, options))
    else:
        names = reach(tree, list(by_name))
        attempt(names, tree.ssh)
        again = tree.lacking(names)  # a gateway had lost its copy: once more, now that it has one
        if again:
            attempt(reach(tree, again), tree.ssh)
    for name, target in by_name.items():
        if name in outcomes:
            continue
        code = replies.code.get(name)
        err = replies.text(name, replies.err)
        where = describe(target)
        route = topology.route(name) if topology is not None else None
        if name in replies.stalled:
            gateway, waited = replies.stalled[name]
            why = f"gateway {gateway} did not answer within {waited:g}s for {where}"
            finish(name, "unreachable", None, why)
        elif code is None:
            why = f"agent {verb} did not finish within {limit_of(target):g}s on {where}"
            finish(name, "failed", None, why)
        elif code == SSH_FAILED:
            last = (err.strip().splitlines() or ["ssh exited 255 without a word"])[-1]
            via = f" (through gateway {route})" if route else ""
            finish(name, "unreachable", None, f"cannot reach {where}{via}: {last}")
        elif route and code == GATEWAY_LOST and not replies.out.get(name):
            why = f"cannot reach {where} through {_gateway_words(replies, route)}"
            finish(name, "unreachable", None, why)
        else:
            try:
                finish(
                    name, "ok", parse_response(where, verb, code, replies.text(name, replies.out), err), None
                )
            except (AgentError, ProvisionError) as exc:
                finish(name, "failed", None, str(exc))
    return {t.name: outcomes[t.name] for t in targets}


def _ways(topology: Topology, name: str) -> Iterator[list[str]]:
    """The gateways of each level on `name`'s way from the head, nearest `name` first."""
    from ClusterShell.NodeSet import NodeSet

    route = topology.route(name)
    while route is not None:
        gateways = list(NodeSet(route))
        yield gateways
        route = topology.route(gateways[0])


def _behind_lost(topology: Topology, name: str, lost: Mapping[str, str]) -> str | None:
    """Why `name` cannot be reached (every gateway of some level on its way is lost), or None."""
    for gateways in _ways(topology, name):
        if all(g in lost for g in gateways):
            return lost[gateways[0]]
    return None
