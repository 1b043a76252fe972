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

ClusterShell is an optional extra, imported only here and only under `--via clush`.
"""

from __future__ import annotations

import getpass
import json
import shlex
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from ..errors import AgentError, ProvisionError
from .options import AgentPayload, FleetOptions
from .session import AGENT_MISSING, agent_command, cache_folder, parse_response, partial_name, upload_command
from .targets import HostTarget, describe

SSH_FAILED = 255  # OpenSSH's exit status when it could not connect, log in or keep the connection
KEX = "curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,diffie-hellman-group14-sha256"
UPLOAD_TIMEOUT_S = 120.0
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


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


def ssh_options(config: Path, options: FleetOptions) -> str:
    known = (options.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
    policy = "accept-new" if options.accept_new_host_keys else "yes"
    return " ".join(
        shlex.quote(word)
        for word in (
            "-F", str(config), f"-oKexAlgorithms={KEX}", f"-oUserKnownHostsFile={known}",
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
        self.on_done = on_done

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


def _run(
    groups: Mapping[tuple[str, bytes], list[str]], timeout: float, options: FleetOptions, config: Path,
    connect_timeout: float, replies: _Replies,
) -> None:  # fmt: skip
    """Run every group (command, stdin) → hosts in one ClusterShell task; one worker per group."""
    from ClusterShell.NodeSet import NodeSet
    from ClusterShell.Task import task_self

    task = task_self()
    task.set_info("ssh_options", ssh_options(config, options))
    task.set_info("connect_timeout", max(1, round(connect_timeout)))
    task.set_info("fanout", options.forks or 512)
    # The handler keeps each host's output; ClusterShell's own per-line trees would hold it a second time.
    task.set_default("stdout_msgtree", False)
    task.set_default("stderr_msgtree", False)
    for (command, stdin), names in groups.items():
        for name in names:
            replies.out.pop(name, None)
            replies.err.pop(name, None)
            replies.code.pop(name, None)
        worker = task.shell(
            command,
            nodes=NodeSet.fromlist(names),
            handler=replies.handler(),
            timeout=timeout,
            stdin=True,
            stderr=True,
        )
        worker.write(stdin)
        worker.set_write_eof()
    task.resume()


def call_many_clush(
    targets: list[HostTarget],
    verb: str,
    requests: Mapping[str, dict[str, Any]],
    options: FleetOptions,
    agent: AgentPayload,
    timeout: float | None = None,
) -> dict[str, Outcome]:
    """Each target's `verb` result (or its error) through ClusterShell; outcomes in target order."""
    started = time.monotonic()
    by_name = {t.name: t for t in targets}
    limit = timeout if timeout is not None else max(t.command_timeout_s for t in targets)
    connect = max(t.connect_timeout_s for t in targets)
    replies = _Replies(options.on_host_done)
    outcomes: dict[str, Outcome] = {}

    def command_of(t: HostTarget) -> str:
        sudo = t.become and (t.user or getpass.getuser()) != "root"
        return agent_command(agent.name, t.python, verb, sudo)

    def request_groups(names: list[str]) -> dict[tuple[str, bytes], list[str]]:
        groups: dict[tuple[str, bytes], list[str]] = defaultdict(list)
        for name in names:
            t = by_name[name]
            stdin = json.dumps({"args": requests[name], "simulate": t.simulate}).encode()
            groups[(command_of(t), stdin)].append(name)
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

    with tempfile.TemporaryDirectory(prefix="mgpu-clush-") as folder:
        config = Path(folder) / "ssh_config"
        config.write_text(ssh_config(targets, options.ssh_config))
        _run(request_groups(list(by_name)), limit, options, config, connect, replies)
        missing = [n for n in by_name if replies.code.get(n) == AGENT_MISSING]
        if missing:
            uploads: dict[tuple[str, bytes], list[str]] = defaultdict(list)
            partials: dict[str, str] = {}  # one partial name per cache folder: one worker per folder
            for name in missing:
                cache = cache_folder(replies.text(name, replies.out))
                partial = partials.setdefault(cache, partial_name(cache, agent.name))
                uploads[(upload_command(cache, partial, f"{cache}/{agent.name}"), agent.data)].append(name)
            _run(uploads, UPLOAD_TIMEOUT_S, options, config, connect, replies)
            for name in missing:
                if replies.code.get(name) not in (0, None):
                    last = (replies.text(name, replies.err).strip().splitlines() or ["no error output"])[-1]
                    finish(
                        name, "failed", None, f"cannot send the agent to {describe(by_name[name])}: {last}"
                    )
            again = [n for n in missing if replies.code.get(n) == 0]
            _run(request_groups(again), limit, options, config, connect, replies)
    for name, target in by_name.items():
        if name in outcomes:
            continue
        code = replies.code.get(name)
        err = replies.text(name, replies.err)
        where = describe(target)
        if code is None:
            finish(name, "failed", None, f"agent {verb} did not finish within {limit:g}s on {where}")
        elif code == SSH_FAILED:
            last = (err.strip().splitlines() or ["ssh exited 255 without a word"])[-1]
            finish(name, "unreachable", None, f"cannot reach {where}: {last}")
        else:
            try:
                finish(
                    name, "ok", parse_response(where, verb, code, replies.text(name, replies.out), err), None
                )
            except (AgentError, ProvisionError) as exc:
                finish(name, "failed", None, str(exc))
    return {t.name: outcomes[t.name] for t in targets}
