"""`--via clush` on the control side: the extra missing is one line saying what to install; the ssh_config
and options ClusterShell's OpenSSH runs with (aliases, key exchange, host-key policy)."""

from __future__ import annotations

import shlex
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.cli import main
from mgpu_provision.fleet import clush
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.targets import HostTarget
from mgpu_provision.rig import nodesets
from tests.support.fake_ssh import write_fake_ssh
from tests.support.hosts import fake_agent

RIG = """\
hosts:
  - {name: gpu-001, address: 10.0.0.1, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
"""


def test_via_clush_without_the_extra_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(nodesets, "clustershell", lambda: False)
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG)
    assert main(["plan", str(rig), "--via", "clush"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--via clush needs ClusterShell" in err and "pip install 'mgpu-provision[clush]'" in err


@pytest.mark.skipif(not nodesets.clustershell(), reason="the clush extra is not installed")
def test_via_clush_with_debians_clustershell_says_it_is_too_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ClusterShell

    monkeypatch.setattr(ClusterShell, "__version__", "1.9.1")  # Debian 12's python3-clustershell
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG)
    assert main(["facts", str(rig), "--via", "clush"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "ClusterShell 1.9.1 is too old for --via clush (it needs 1.9.3 or later): "
        "pip install 'mgpu-provision[clush]' (ClusterShell >= 1.9.3)"
    ), err
    assert len(err.splitlines()) == 1


def test_a_node_set_that_does_not_parse_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG)
    assert main(["facts", str(rig), "--limit", "gpu-[001-", "--json"]) == 1
    captured = capsys.readouterr()
    assert "--limit: 'gpu-[001-'" in captured.err + captured.out
    assert "Traceback" not in captured.err


def target(name: str, **fields: object) -> HostTarget:
    base: dict[str, object] = {
        "name": name, "address": "127.0.0.9", "port": 2222, "user": "root", "identity_file": "/k/id",
        "jump": None, "become": False, "python": "python3", "connection": "ssh", "simulate": None,
        "connect_timeout_s": 5.0, "command_timeout_s": 60.0,
    }  # fmt: skip
    base.update(fields)
    return HostTarget(**base)  # type: ignore[arg-type]


def test_ssh_config_aliases_each_rig_name() -> None:
    text = clush.ssh_config(
        [target("gpu-001"), target("gpu-002", port=None, user=None, jump="bastion")], None
    )
    assert text.split("\n\n")[0] == (
        "Host gpu-001\n  HostName 127.0.0.9\n  Port 2222\n  User root\n  IdentityFile /k/id\n"
        "  IdentitiesOnly yes"
    )
    assert "Host gpu-002\n  HostName 127.0.0.9\n  Port 22\n  IdentityFile /k/id" in text
    assert "  ProxyJump bastion" in text


def test_openssh_options_prefer_curve25519_and_keep_known_hosts_strict(tmp_path: Path) -> None:
    options = clush.ssh_options(tmp_path / "cfg", FleetOptions(known_hosts=tmp_path / "kh"))
    assert "-oKexAlgorithms=curve25519-sha256," in options
    assert f"-oUserKnownHostsFile={tmp_path / 'kh'}" in options
    assert "-oStrictHostKeyChecking=yes" in options
    relaxed = clush.ssh_options(tmp_path / "cfg", FleetOptions(accept_new_host_keys=True))
    assert "-oStrictHostKeyChecking=accept-new" in relaxed


@pytest.fixture
def fake_ssh(tmp_path: Path) -> Iterator[Path]:
    """ClusterShell's ssh replaced by a script that runs the command here, each host in a HOME of its own
    (the real sshd case is tests/e2e/test_clush_e2e.py); the log has one line per ssh started."""
    from ClusterShell.Task import task_self

    log = tmp_path / "ssh.log"
    script = write_fake_ssh(tmp_path / "ssh", log, tmp_path / "homes")
    task_self().set_info("ssh_path", str(script))
    yield log
    task_self().set_info("ssh_path", None)


needs_library = pytest.mark.skipif(not nodesets.clustershell(), reason="the clush extra is not installed")


@needs_library
def test_outcomes_per_host_upload_once_unreachable_and_timeout(fake_ssh: Path) -> None:
    agent = fake_agent()
    hosts = [target(name, python=sys.executable) for name in ("gpu-001", "gpu-002", "dead")]
    requests = {t.name: {"n": 1} for t in hosts}
    first = clush.call_many_clush(hosts, "facts", requests, FleetOptions(), agent)
    assert [o.status for o in first.values()] == ["ok", "ok", "unreachable"]
    assert first["gpu-001"].value is not None and first["gpu-001"].value["args"] == {"n": 1}
    assert (
        first["dead"].error
        == "cannot reach dead (127.0.0.9:2222): ssh: connect to host 127.0.0.9 port 22: Connection refused"
    )
    # gpu-001: the agent command (97), its upload, the command again; dead: the one try.
    started = [line.split()[0] for line in fake_ssh.read_text().splitlines()]
    assert sorted(started) == ["dead", "gpu-001", "gpu-001", "gpu-001", "gpu-002", "gpu-002", "gpu-002"]
    assert all("-oKexAlgorithms=curve25519-sha256," in line for line in fake_ssh.read_text().splitlines())

    fake_ssh.write_text("")
    # 2 s: on a loaded machine a fake ssh may not have started within a shorter limit (seen at 0.5 s).
    again = clush.call_many_clush(
        hosts[:2], "sleep", {t.name: {"seconds": 30} for t in hosts[:2]}, FleetOptions(), agent, timeout=2
    )
    assert [o.status for o in again.values()] == ["failed", "failed"]
    assert again["gpu-001"].error == "agent sleep did not finish within 2s on gpu-001 (127.0.0.9:2222)"
    assert len(fake_ssh.read_text().splitlines()) == 2  # cached now: one ssh each, no upload


@needs_library
def test_a_sites_topology_conf_never_turns_a_flat_run_into_a_tree_one(
    fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ClusterShell goes through gateways on its own wherever /etc/clustershell/topology.conf exists (its
    `tree=None`, "auto"); a flat `--via clush` run must still reach each host itself."""
    from ClusterShell.Task import Task

    site = tmp_path / "topology.conf"
    site.write_text("[routes]\nadmin: gwx\ngwx: gpu-[001-002]\n")
    monkeypatch.setattr(Task, "TOPOLOGY_CONFIGS", [str(site)])
    monkeypatch.setattr("ClusterShell.Task._getshorthostname", lambda: "admin")
    hosts = [target(name, python=sys.executable) for name in ("gpu-001", "gpu-002")]
    requests: dict[str, dict[str, object]] = {t.name: {} for t in hosts}
    outcomes = clush.call_many_clush(hosts, "facts", requests, FleetOptions(), fake_agent())
    assert [o.status for o in outcomes.values()] == ["ok", "ok"], outcomes
    assert "gwx" not in fake_ssh.read_text()


@needs_library
def test_each_host_keeps_its_own_command_limit(fake_ssh: Path) -> None:
    """Hosts of one request with different limits go in one worker per limit (ClusterShell's timeout is a
    worker's): the short one fails at its own limit, the long one is not cut short by it."""
    agent = fake_agent()
    hosts = [
        target("gpu-001", python=sys.executable, command_timeout_s=0.5),
        target("gpu-002", python=sys.executable, command_timeout_s=10.0),
    ]
    clush.call_many_clush(hosts, "facts", {t.name: {} for t in hosts}, FleetOptions(), agent)  # uploads
    requests = {t.name: {"seconds": 1.5} for t in hosts}
    outcomes = clush.call_many_clush(hosts, "sleep", requests, FleetOptions(), agent)
    assert outcomes["gpu-001"].status == "failed", outcomes
    assert outcomes["gpu-001"].error == "agent sleep did not finish within 0.5s on gpu-001 (127.0.0.9:2222)"
    assert outcomes["gpu-002"].status == "ok", outcomes


def test_each_gateway_routes_a_workers_input_to_that_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ClusterShell's gateway hands every stdin write to the worker it started last (1.10.1, Gateway.py
    `GatewayChannel.recv_ctl`: one `propagation`): through one gateway, gpu-004 was sent gpu-003's apply
    request and gpu-003 waited for its own. The gateway command routes each write by its message's
    `srcid`, and hands the gateways it starts the same command — as the worker is made: a running task
    starts a worker as it is scheduled, inside `recv_ctl`, its channels to the next level opened with the
    command it has then (1.10.1, Engine.add; set after `recv_ctl`, a second level of gateways ran
    ClusterShell's own). Run here against a stand-in of the channel, as ClusterShell's own drives it."""

    class Worker:  # ClusterShell's TreeWorker, as far as the gateway uses it
        def __init__(self) -> None:
            self.input: list[str] = []
            self.invoke_gateway = "python3 -m ClusterShell.Gateway -Bu"

        def start(self) -> None:
            self.launched_with = self.invoke_gateway  # the next level's channels open now

        def write(self, buf: str) -> None:
            self.input.append(buf)

        def set_write_eof(self) -> None:
            self.input.append("EOF")

    class Channel:  # ClusterShell's GatewayChannel, as far as recv_ctl goes
        def __init__(self) -> None:
            self.propagation: Worker | None = None
            self.started: list[Worker] = []

        def recv_ctl(self, msg: Any) -> None:
            if msg.action == "shell":
                self.propagation = gateway.TreeWorker()  # the module's name, looked up as Gateway.py does
                self.propagation.start()  # task.schedule in a running task
                self.started.append(self.propagation)
            elif msg.action == "write":
                assert self.propagation is not None
                self.propagation.write(msg.buf)
            else:
                assert self.propagation is not None
                self.propagation.set_write_eof()

    # ClusterShell's modules as far as the gateway code uses them; its main does nothing (`int`): the
    # channel is driven below.
    stubs = {
        "ClusterShell": {},
        "ClusterShell.Gateway": {"GatewayChannel": Channel, "TreeWorker": Worker, "gateway_main": int},
        "ClusterShell.Communication": {"ControlMessage": types.SimpleNamespace(ident="CTL")},
        "ClusterShell.NodeSet": {"NodeSet": list},
        "ClusterShell.Propagation": {"RouteResolvingError": RuntimeError},
        "ClusterShell.Worker": {},
        "ClusterShell.Worker.Tree": {"TreeWorker": Worker},
        "ClusterShell.Worker.Worker": {"DistantWorker": object},
    }
    for name, names in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(names)
        monkeypatch.setitem(sys.modules, name, module)
    gateway = sys.modules["ClusterShell.Gateway"]
    monkeypatch.setenv("CLUSTERSHELL_GW_PYTHON_EXECUTABLE", "/opt/py/bin/python3")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ssh_config").write_text("")
    (tmp_path / "run" / "known_hosts").write_text("")
    command = clush.invoke_gateway("~/run")  # the gateway starts only where the run's files are
    words = shlex.split(command)
    assert words[:2] == ["/opt/py/bin/python3", "-c"]
    exec(words[2], {})  # what the gateway's python runs: the channel patched, then the gateway's main

    def msg(action: str, srcid: int, buf: str = "") -> Any:
        return types.SimpleNamespace(type="CTL", action=action, srcid=srcid, buf=buf)

    channel = Channel()
    sent = [("shell", 3, ""), ("shell", 4, ""), ("write", 3, "gpu-003's request"), ("eof", 3, ""),
            ("write", 4, "gpu-004's request"), ("eof", 4, "")]  # fmt: skip
    for action, srcid, buf in sent:
        channel.recv_ctl(msg(action, srcid, buf))
    first, second = channel.started
    assert first.input == ["gpu-003's request", "EOF"] and second.input == ["gpu-004's request", "EOF"]
    assert first.launched_with == second.launched_with == command  # the next level runs the same fix
