"""`--via clush --topology`: ClusterShell's tree, head → 2 gateways → nodes, on real sshd hosts in network
namespaces where the head has no route to any node (tests/support/netns.py).

The head must make only the gateways' connections, for plan, facts, reclaim and apply (each node's sshd
log names its gateway's address and nothing else), the agent must reach the nodes through the gateways on
first contact (exit 97), and a gateway that fails — no ClusterShell for its Python, killed mid-run,
frozen — makes only its own hosts `unreachable` with the reason, within a bounded time, while the other
rack answers.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.hosts import HostFactory, load_twin
from tests.support.netns import TreeLab

pytest.importorskip("ClusterShell", reason="the clush extra is not installed")
pytestmark = pytest.mark.e2e

# Each hop's connect timeout: 3 s once gave a whole rack up at first contact at load 22 on 2 cores.
CONNECT_S = 5

RIG = {"pair": {"gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2}, "driver": {"version": "550.54.15"}}}
SLOW_LOGIN = 'ForceCommand sleep 4; exec sh -c "$SSH_ORIGINAL_COMMAND"\n'


def twin(driver: str | None = None) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(load_twin("rtx3090-nvlink"))
    if driver:
        loaded["driver"] = {"version": driver, "loaded": driver, "cuda": "12.2"}
    return loaded


@pytest.fixture
def lab(test_hosts: HostFactory) -> Iterator[TreeLab]:
    lab = TreeLab(test_hosts, racks=2)
    try:
        yield lab
    finally:
        lab.close()


def setup(lab: TreeLab, tmp_path: Path, slow_rack: int | None = None) -> list[str]:
    """Two nodes per rack (gpu-003 on an older driver); the rig, topology and gateways' ssh_config; the
    arguments every run shares."""
    for number, (rack, driver) in enumerate([(1, None), (1, None), (2, "535.161.08"), (2, None)], start=1):
        slow = SLOW_LOGIN if rack == slow_rack else ""
        lab.start_node(f"gpu-{number:03d}", rack, twin(driver), rig="pair", extra_sshd_config=slow)
    nodes = [host for _, host in lab.nodes.values()]
    defaults = {"connect_timeout_s": CONNECT_S}
    rig = lab.factory.write_rig(tmp_path / "rig.yaml", nodes, rigs=RIG, defaults=defaults)
    topology = lab.write_topology(tmp_path / "topology.conf")
    config = lab.write_ssh_config(tmp_path / "gateways.ssh_config")
    return [
        str(rig), "--known-hosts", str(lab.factory.known_hosts), "--json", "--via", "clush",
        "--topology", str(topology), "--ssh-config", str(config),
    ]  # fmt: skip


def run(lab: TreeLab, tmp_path: Path, verb: str, argv: list[str], **env: str) -> tuple[int, dict[str, Any]]:
    done = lab.run_head([verb, *argv], tmp_path / "head-home", env=env)
    assert done.stdout.strip(), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def logins_from(host_log: str) -> list[str]:
    return re.findall(r"Accepted publickey for \S+ from (\S+)", host_log)


def facts_with_one_login_a_node(lab: TreeLab, tmp_path: Path, argv: list[str]) -> None:
    """A facts run once every node has the agent: all answer (gpu-003 on its older driver), each node
    logged in to once."""
    before = {name: len(logins_from(node.log())) for name, (_, node) in lab.nodes.items()}
    code, facts = run(lab, tmp_path, "facts", argv)
    assert code == 0, facts
    assert facts["hosts"]["gpu-003"]["facts"]["driver"]["version"] == "535.161.08"
    assert {n: len(logins_from(h.log())) - before[n] for n, (_, h) in lab.nodes.items()} == dict.fromkeys(
        before, 1
    )


def test_plan_through_two_gateways_the_head_only_reaches_them(lab: TreeLab, tmp_path: Path) -> None:
    argv = setup(lab, tmp_path)
    head_cannot = lab.run_head(["facts", *argv[:-4]], tmp_path / "head-home")  # flat: no route to a node
    assert head_cannot.returncode == 2
    flat = json.loads(head_cannot.stdout)["hosts"]
    assert all("Network is unreachable" in entry["error"] for entry in flat.values()), flat

    # First contact through the tree: no agent anywhere yet, each node answers 97 and gets it.
    code, plan = run(lab, tmp_path, "plan", argv)
    assert code == 2, plan
    assert {n: e["status"] for n, e in plan["hosts"].items()} == dict.fromkeys(
        ["gpu-001", "gpu-002", "gpu-003", "gpu-004"], "ok"
    ), plan
    assert ("driver", "update") in [(c["resource"], c["action"]) for c in plan["hosts"]["gpu-003"]["changes"]]
    for name, (rack, node) in lab.nodes.items():
        assert node.run_in_ns("ls ~/.cache/mgpu-provision").stdout.strip(), name
        # Every login a node saw came from its own gateway; none from the head.
        assert set(logins_from(node.log())) == {lab.gateway_address(rack)}, (name, node.log()[-800:])
    for g, gateway in enumerate(lab.gateways, start=1):
        assert set(logins_from(gateway.log())) == {f"10.41.{g}.1"}, gateway.log()[-800:]
        # The run's ssh_config and known_hosts came to the gateway's own (private) home first.
        assert "Host gpu-001" in gateway.run_in_ns("cat ~/.cache/mgpu-provision/clush/*/ssh_config").stdout

    # The agent is cached now: one login per node for the whole facts run (one worker per gateway).
    facts_with_one_login_a_node(lab, tmp_path, argv)

    # reclaim through the tree too: its `reclaim` round, one login per node, each from its own gateway
    # (nothing ended here, so no `facts` round: the flat e2e, test_clush_reclaim_e2e.py, ends processes).
    before = {name: logins_from(node.log()) for name, (_, node) in lab.nodes.items()}
    code, reclaimed = run(lab, tmp_path, "reclaim", argv)
    assert code == 0, reclaimed
    assert {n: (e["status"], e["processes"]) for n, e in reclaimed["hosts"].items()} == dict.fromkeys(
        before, ("ok", [])
    )
    for name, (rack, node) in lab.nodes.items():
        assert logins_from(node.log())[len(before[name]) :] == [lab.gateway_address(rack)], name

    # apply through the tree: every node converged over its own gateway, three logins each (the plan's
    # facts, then facts and `apply` in lockstep, whose reply holds the facts read after its steps);
    # gpu-003's driver installed, its reboot left to the person (the rig's `reboot: never`).
    before = {name: logins_from(node.log()) for name, (_, node) in lab.nodes.items()}
    code, applied = run(lab, tmp_path, "apply", [*argv, "--yes"])
    assert code == 2, applied
    assert {n: (e["status"], e["reboot_required"]) for n, e in applied["hosts"].items()} == {
        "gpu-001": ("changed", False), "gpu-002": ("changed", False), "gpu-003": ("changed", True),
        "gpu-004": ("changed", False),
    }, applied  # fmt: skip
    done = applied["hosts"]["gpu-003"]["done"]
    assert any(line.startswith("driver: installed driver 550.54.15") for line in done), done
    for name, (rack, node) in lab.nodes.items():
        assert logins_from(node.log())[len(before[name]) :] == [lab.gateway_address(rack)] * 3, name

    # A gateway whose Python has no ClusterShell: one plain line per host, naming the gateway.
    code, facts = run(lab, tmp_path, "facts", argv, CLUSTERSHELL_GW_PYTHON_EXECUTABLE="/usr/bin/python3")
    assert code == 2
    for name, entry in facts["hosts"].items():
        assert entry["status"] == "unreachable", (name, entry)
        assert "has no ClusterShell for /usr/bin/python3" in entry["error"], entry
        assert re.search(r"gateway gw[12] ", entry["error"]) and "\n" not in entry["error"], entry


def test_a_gateway_gets_the_runs_files_once_and_again_after_losing_them(lab: TreeLab, tmp_path: Path) -> None:
    """The head copies the run's ssh_config and known_hosts to a gateway only where it has no record of
    that copy: a second plan logs in at each gateway once (the run itself), not twice (the copy, then the
    run). A gateway whose copy went since refuses the run; the head copies to it and runs its rack again."""
    argv = setup(lab, tmp_path)
    code, plan = run(lab, tmp_path, "plan", argv)  # first contact: copy, plan, agent upload, plan again
    assert code == 2 and {e["status"] for e in plan["hosts"].values()} == {"ok"}, plan

    def gateway_logins() -> list[int]:
        return [len(logins_from(gateway.log())) for gateway in lab.gateways]

    # A folder of another run that none used for a month goes as this run passes the gateway.
    stale = "~/.cache/mgpu-provision/clush/0ld0ld0ld0ld0ld0"
    lab.gateways[1].run_in_ns(f"mkdir -p {stale} && touch -d '30 days ago' {stale}")
    before = gateway_logins()
    code, plan = run(lab, tmp_path, "plan", argv)
    assert code == 2 and {e["status"] for e in plan["hosts"].values()} == {"ok"}, plan
    assert [now - then for now, then in zip(gateway_logins(), before, strict=True)] == [1, 1]
    assert lab.gateways[1].run_in_ns(f"ls -d {stale} 2>/dev/null || echo gone").stdout.strip() == "gone"

    gw1 = lab.gateways[0]
    gw1.run_in_ns("rm -rf ~/.cache/mgpu-provision/clush")  # gw1's cache wiped; the head's record names it
    before = gateway_logins()
    nodes_before = {name: len(logins_from(node.log())) for name, (_, node) in lab.nodes.items()}
    code, plan = run(lab, tmp_path, "plan", argv)
    assert code == 2, plan
    assert {n: e["status"] for n, e in plan["hosts"].items()} == dict.fromkeys(nodes_before, "ok"), plan
    # gw1: the refused run, the copy, the run again; gw2: the run. Each node is asked once.
    assert [now - then for now, then in zip(gateway_logins(), before, strict=True)] == [3, 1]
    assert {
        n: len(logins_from(h.log())) - nodes_before[n] for n, (_, h) in lab.nodes.items()
    } == dict.fromkeys(nodes_before, 1)
    assert "Host gpu-001" in gw1.run_in_ns("cat ~/.cache/mgpu-provision/clush/*/ssh_config").stdout


def rack1_lost_mid_run(
    lab: TreeLab, tmp_path: Path, sig: signal.Signals, command_timeout_s: float = 300
) -> tuple[dict[str, Any], float]:
    """A facts run during which gateway 1's whole machine gets `sig` once both its nodes are inside their
    slow login (the run's command has reached them through it); the hosts' outcomes and the run's wall.
    Rack 2 must answer whatever happens to gateway 1."""
    argv = setup(lab, tmp_path, slow_rack=1)
    run(lab, tmp_path, "facts", argv)  # first contact: agents uploaded everywhere
    rig = Path(argv[0])
    document = yaml.safe_load(rig.read_text())
    document["defaults"]["command_timeout_s"] = command_timeout_s
    rig.write_text(yaml.safe_dump(document, sort_keys=False))
    rack1 = [node for rack, node in lab.nodes.values() if rack == 1]
    counts = [len(logins_from(n.log())) for n in rack1]

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(len(logins_from(n.log())) > c for n, c in zip(rack1, counts, strict=True)):
                time.sleep(0.5)  # inside their 4 s login
                lab.gateway_ns[0].signal_all(sig)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    code, facts = run(lab, tmp_path, "facts", argv)
    elapsed = time.monotonic() - started
    watcher.join()
    assert code == 2
    hosts: dict[str, Any] = facts["hosts"]
    assert hosts["gpu-003"]["status"] == hosts["gpu-004"]["status"] == "ok", hosts
    for name in ("gpu-001", "gpu-002"):
        assert hosts[name]["status"] == "unreachable", hosts[name]
    return hosts, elapsed


def test_a_gateway_killed_mid_run_loses_only_its_rack(lab: TreeLab, tmp_path: Path) -> None:
    hosts, elapsed = rack1_lost_mid_run(lab, tmp_path, signal.SIGKILL)
    for name in ("gpu-001", "gpu-002"):
        assert "through gateway gw1" in hosts[name]["error"], hosts[name]
    assert elapsed < 30, elapsed  # not ssh's keep-alive (45 s), not the command limit (300 s)


def test_a_gateway_frozen_mid_run_is_given_up_within_the_bound(lab: TreeLab, tmp_path: Path) -> None:
    """gw1 stops mid-run (SIGSTOP: no FIN, no RST, nothing): its hosts are given up once the command limit
    and a connect timeout per level have passed, not at ssh's keep-alive or never."""
    hosts, elapsed = rack1_lost_mid_run(lab, tmp_path, signal.SIGSTOP, command_timeout_s=6)
    bound = 6 + CONNECT_S * 2 + 5  # clush._run: the longest limit, a connect timeout per level and the head's
    for name in ("gpu-001", "gpu-002"):
        assert hosts[name]["error"].startswith(f"gateway gw1 did not answer within {bound}s for {name}"), name
    assert bound < elapsed < bound + 15, elapsed


def test_a_gateway_frozen_before_the_run_and_a_slow_node_end_in_bounds(lab: TreeLab, tmp_path: Path) -> None:
    argv = setup(lab, tmp_path)
    run(lab, tmp_path, "facts", argv)  # agents in place
    rig = Path(argv[0])
    document = yaml.safe_load(rig.read_text())
    document["defaults"]["command_timeout_s"] = 5
    rig.write_text(yaml.safe_dump(document, sort_keys=False))
    # gpu-004 answers only after the limit: its sshd sleeps 8 s before every command.
    slow = lab.nodes["gpu-004"][1]
    config = (slow.dir / "sshd_config").read_text() + SLOW_LOGIN.replace("sleep 4", "sleep 8")
    (slow.dir / "sshd_config").write_text(config)
    listening = f"Server listening on {slow.address}"
    restarts = slow.log().count(listening)
    slow.run_in_ns(f"kill -HUP $(cat {slow.dir / 'sshd.pid'})")  # sshd reads its config again
    deadline = time.monotonic() + 15
    while slow.log().count(listening) == restarts:
        assert time.monotonic() < deadline, slow.log()[-800:]
        time.sleep(0.05)
    lab.gateway_ns[0].signal_all(signal.SIGSTOP)  # gw1 stops answering: no FIN, no RST, nothing

    started = time.monotonic()
    code, facts = run(lab, tmp_path, "facts", argv)
    elapsed = time.monotonic() - started
    assert code == 2, facts
    hosts = facts["hosts"]
    assert hosts["gpu-003"]["status"] == "ok", hosts["gpu-003"]
    assert hosts["gpu-004"]["status"] == "failed", hosts["gpu-004"]
    assert "did not finish within 5s" in hosts["gpu-004"]["error"], hosts["gpu-004"]
    for name in ("gpu-001", "gpu-002"):
        assert hosts[name]["status"] == "unreachable", hosts[name]
        assert "gw1" in hosts[name]["error"], hosts[name]
    # The bound: the longest command limit (5 s) and the connect timeout per level, then 5 s.
    assert elapsed < 5 + CONNECT_S * 2 + 5 + 8, elapsed


def test_plan_through_a_gateway_behind_a_gateway_on_real_sshds(lab: TreeLab, tmp_path: Path) -> None:
    """Two levels: rack 2's nodes sit behind sub2, a gateway in their own rack that only gw2 reaches from
    above. sub2 gets the run's files from gw2's level and runs ClusterShell's gateway started by gw2's;
    its nodes see logins only from inside their rack (where only sub2 runs clients), never from gw2; the
    head still logs in only at gw1 and gw2."""
    argv = setup(lab, tmp_path)
    sub = lab.factory.start("sub2", netns=lab.rack_ns[1].prefix, address=lab.node_address(2, 7))
    lab.write_ssh_config(Path(argv[argv.index("--ssh-config") + 1]), also=[sub])
    topology = Path(argv[argv.index("--topology") + 1])
    topology.write_text("[routes]\nhead: gw[1-2]\ngw1: gpu-[001-002]\ngw2: sub2\nsub2: gpu-[003-004]\n")

    code, plan = run(lab, tmp_path, "plan", argv)  # first contact: the copies, then the agent uploads
    assert code == 2, plan
    assert {n: e["status"] for n, e in plan["hosts"].items()} == dict.fromkeys(
        ["gpu-001", "gpu-002", "gpu-003", "gpu-004"], "ok"
    ), plan
    assert ("driver", "update") in [(c["resource"], c["action"]) for c in plan["hosts"]["gpu-003"]["changes"]]
    rack2 = {lab.node_address(2, i) for i in range(lab.nodes_per_rack)}
    for name, (rack, node) in lab.nodes.items():
        seen = set(logins_from(node.log()))
        if rack == 1:
            assert seen == {lab.gateway_address(1)}, (name, node.log()[-800:])
        else:  # from inside rack 2, where only sub2 runs clients (its source: the rack's first address)
            assert seen and seen <= rack2, (name, node.log()[-800:])
    assert set(logins_from(sub.log())) == {lab.gateway_address(2)}, sub.log()[-800:]
    for g, gateway in enumerate(lab.gateways, start=1):
        assert set(logins_from(gateway.log())) == {f"10.41.{g}.1"}, gateway.log()[-800:]
    assert "Host gpu-003" in sub.run_in_ns("cat ~/.cache/mgpu-provision/clush/*/ssh_config").stdout

    # Recorded on the head: the second run goes straight through both levels, one login a node.
    facts_with_one_login_a_node(lab, tmp_path, argv)
