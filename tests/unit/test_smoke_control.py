"""control.py and `mgpu-provision smoke`: who runs what, the fleet verdict, cleanup, and a real local run.

The real run uses `connection: local` hosts, so the agent zipapp, the `smoke` verb, torchrun and the command's
output are all real, without SSH (the SSH path is tests/e2e/test_smoke_e2e.py).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision import cli
from mgpu_provision.commands.output import make_console
from mgpu_provision.commands.smoke import nodes_table, render_human
from mgpu_provision.errors import ConnectionFailed, ProvisionError
from mgpu_provision.fleet.pool import HostOutcome
from mgpu_provision.fleet.session import AgentSession
from mgpu_provision.fleet.targets import HostTarget
from mgpu_provision.jobs import smoke as control
from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.resources.envfiles import desired
from mgpu_provision.rig import load_rig
from tests.support import factories
from tests.support.hosts import desired_files_on
from tests.support.smoke_control import HOSTS, ok_outcome, plan, ranks_of, rig_file
from tests.support.smoke_helpers import PASS_TIMEOUT_S, free_port, processes_of_run


def test_plan_puts_the_master_first_and_passes_the_rig_settings(tmp_path: Path) -> None:
    parts = plan(tmp_path, HOSTS)
    assert [(p.host, p.node_rank) for p in parts] == [("gpu-a", 0), ("gpu-b", 1), ("gpu-c", 2)]
    args = parts[1].args
    assert args["nnodes"] == 3 and args["nproc_per_node"] == 2 and args["node_rank"] == 1
    assert (args["master_addr"], args["master_port"], args["backend"]) == ("10.0.0.11", 29555, "gloo")
    assert args["rdzv_backend"] == "static" and args["rdzv_id"] == "mgpu-gpu-a" and args["run_id"] == "run-1"
    assert (args["python"], args["timeout_s"], args["batch_size"]) == ("/opt/venv/bin/python", 60, 4)
    assert args["sizes_mib"] == [1.0, 4.0] and args["node"] == "gpu-b"
    loaded = load_rig(tmp_path / "rig.yaml")
    args = control.for_this_node(loaded, loaded.host("gpu-b"), parts[1], factories.facts())
    assert args["env"]["NCCL_DEBUG"] == "WARN"
    assert args["env"]["NCCL_SOCKET_IFNAME"] == "lo" and args["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert args["path_prepend"] == {"PATH": ["/usr/local/cuda/bin"]}


def test_smoke_runs_the_rendezvous_the_launchers_were_written_with(tmp_path: Path) -> None:
    loaded = load_rig(rig_file(tmp_path, HOSTS, files={"profile_d": None}))
    for part in control.plan_smoke(loaded, list(loaded.spec.hosts), "run-1"):
        files = {f.path: f for f in desired(HostContext(loaded, loaded.host(part.host), factories.facts()))}
        launcher = files["/usr/local/bin/mgpu-torchrun"]
        args = part.args
        for line in (
            f"master_addr={args['master_addr']}",
            f"master_port={args['master_port']}",
            f"nnodes={args['nnodes']}",
            f"node_rank={args['node_rank']}",
            f"nproc_per_node={args['nproc_per_node']}",
            f"rdzv_backend={args['rdzv_backend']}",
            f"rdzv_id={args['rdzv_id']}",
            f"export MGPU_DDP_BACKEND={args['backend']}",
        ):
            assert f"\n{line}\n" in launcher.content, (part.host, line)


def test_nodes_check_the_files_apply_installed_and_run_the_launcher(tmp_path: Path) -> None:
    parts = plan(tmp_path, HOSTS)
    loaded = load_rig(tmp_path / "rig.yaml")
    gpu_b = loaded.host("gpu-b")
    args = control.for_this_node(loaded, gpu_b, parts[1], factories.facts())
    assert args["launcher"] == "/usr/local/bin/mgpu-torchrun"
    assert [(f["role"], f["path"], f["mode"]) for f in args["files"]] == [
        ("env file", "/etc/profile.d/mgpu-provision.sh", "0644"),
        ("env file", "/etc/mgpu-provision/environment", "0644"),
        ("launcher", "/usr/local/bin/mgpu-torchrun", "0755"),
    ]
    want = {f.path: f.content for f in desired(HostContext(loaded, gpu_b, factories.facts()))}
    assert all(f["content"] == want[f["path"]] for f in args["files"])


def test_without_a_launcher_smoke_checks_the_rig_file_only_and_says_so(tmp_path: Path) -> None:
    loaded = load_rig(rig_file(tmp_path, HOSTS, files={"launcher": None}))
    parts = control.plan_smoke(loaded, list(loaded.spec.hosts), "run-1")
    facts = factories.facts()
    assert all(p.args["launcher"] is None for p in parts)
    assert all(control.for_this_node(loaded, loaded.host(p.host), p, facts)["files"] == [] for p in parts)
    report = control.build_report("run-1", parts, {p.host: ok_outcome(p.node_rank) for p in parts}, None)
    assert report.as_dict()["notices"] == [control.NO_LAUNCHER]
    assert "files.launcher is null: smoke started torchrun itself" in control.NO_LAUNCHER


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["gpu-c", "gpu-a"], "but gpu-b is not selected; add it to --limit"),
        (["gpu-b"], "but gpu-a, gpu-c are not selected; add them to --limit"),
    ],
)
def test_limit_to_part_of_a_ddp_group_is_refused(tmp_path: Path, names: list[str], message: str) -> None:
    with pytest.raises(ProvisionError) as info:
        plan(tmp_path, HOSTS, names)
    written = "smoke runs whole DDP groups: the launchers of gpu-a, gpu-b, gpu-c were written for 3 nodes, "
    assert str(info.value) == written + message


def test_groups_with_different_masters_run_side_by_side(tmp_path: Path) -> None:
    parts = plan(tmp_path, [*HOSTS[:2], {"name": "hgx", "address": "10.0.1.1", "rig": "solo"}])
    assert [(p.host, p.group, p.node_rank, p.args["nnodes"]) for p in parts] == [
        ("gpu-a", "gpu-a", 0, 2),
        ("gpu-b", "gpu-a", 1, 2),
        ("hgx", "hgx", 0, 1),
    ]


def test_hosts_whose_rig_has_no_ddp_are_left_out_with_a_notice(tmp_path: Path) -> None:
    loaded = load_rig(rig_file(tmp_path, [*HOSTS, {"name": "box", "rig": "bare"}]))
    chosen, notices = control.with_ddp(loaded, list(loaded.spec.hosts))
    assert [h.name for h in chosen] == [h["name"] for h in HOSTS]
    assert notices == ["skipped box: no `ddp` section in their rig (smoke runs DDP groups only)"]
    alone = [h for h in loaded.spec.hosts if h.name == "box"]
    assert control.with_ddp(loaded, alone) == (alone, [])  # none has one: plan_smoke refuses, as below


def test_rig_without_ddp_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError) as info:
        plan(tmp_path, [*HOSTS, {"name": "box", "rig": "bare"}])
    assert str(info.value) == "smoke needs a `ddp` section in the rig of box (master, port, backend)"


# ---- the verdict -------------------------------------------------------------------------------------


def judge(
    tmp_path: Path, outcomes: dict[str, HostOutcome[dict[str, Any]]], floor: float | None = None
) -> Any:
    parts = plan(tmp_path, HOSTS[:2])
    return control.build_report("run-1", parts, outcomes, floor).groups[0]


def test_group_passes_when_every_rank_joined(tmp_path: Path) -> None:
    group = judge(tmp_path, {"gpu-a": ok_outcome(0), "gpu-b": ok_outcome(1)}, floor=1.0)
    assert group.ok and group.problems == []
    assert (group.world_size, group.expected_world_size, group.ranks_joined) == (4, 4, 4)
    assert group.endpoint == "10.0.0.11:29555" and [n.host for n in group.nodes] == ["gpu-a", "gpu-b"]


def test_the_floor_is_not_judged_on_simulated_nodes_and_the_report_says_so(tmp_path: Path) -> None:
    """Issue 40 item 3: README's rig (busbw_floor_gbps: 20) on CPU twins failed "0.35 GB/s is below the
    floor of 20": Gloo on a simulated node's CPU says nothing of its NVLink."""
    twins = {name: ok_outcome(n, ranks=[dict(r, simulated=True) for r in ranks_of(n)]) for n, name in
             enumerate(("gpu-a", "gpu-b"))}  # fmt: skip
    group = judge(tmp_path, twins, floor=10.0)
    assert group.ok and group.problems == [] and group.floor_judged is False
    assert judge(tmp_path, {"gpu-a": ok_outcome(0), "gpu-b": ok_outcome(1)}, floor=10.0).floor_judged


def test_busbw_of_the_largest_sizes_below_the_floor_fails(tmp_path: Path) -> None:
    assert judge(tmp_path, {"gpu-a": ok_outcome(0), "gpu-b": ok_outcome(1)}, floor=5.0).ok  # 9 GB/s at 1 MiB
    group = judge(tmp_path, {"gpu-a": ok_outcome(0), "gpu-b": ok_outcome(1)}, floor=10.0)
    assert group.problems == [
        "all_reduce busbw 9 GB/s (the best at 1 and 4 MiB) is below the floor of 10 GB/s"
    ]


def test_without_sizes_in_the_rig_file_the_nodes_choose_them(tmp_path: Path) -> None:
    loaded = load_rig(rig_file(tmp_path, HOSTS, smoke={"python": "/opt/venv/bin/python"}))
    assert all("sizes_mib" not in p.args for p in control.plan_smoke(loaded, list(loaded.spec.hosts), "r"))


def test_failed_and_unreachable_nodes_are_named_with_their_reason(tmp_path: Path) -> None:
    failed = ok_outcome(1, ok=False, kind="torch-missing", diagnosis="torch is not installed in x on gpu-b")
    group = judge(tmp_path, {"gpu-a": ok_outcome(0), "gpu-b": failed})
    assert group.problems == ["gpu-b: torch is not installed in x on gpu-b"]
    gone = HostOutcome[dict[str, Any]]("unreachable", None, "gpu-b: connection refused", 1.0)
    group = judge(tmp_path, {"gpu-a": ok_outcome(0, ranks=ranks_of(0)[:1]), "gpu-b": gone})
    assert group.problems == ["gpu-b: gpu-b: connection refused"]


def test_missing_ranks_and_wrong_world_sizes_fail_even_when_nodes_say_ok(tmp_path: Path) -> None:
    group = judge(tmp_path, {"gpu-a": ok_outcome(0), "gpu-b": ok_outcome(1, ranks=ranks_of(1, world=3)[:1])})
    assert group.problems == ["ranks [3] of 4 never reported", "ranks [2] saw a world size other than 4"]


# ---- the shell: all at once, cleanup of hosts whose call failed --------------------------------------


def test_run_smoke_starts_all_hosts_at_once_and_cleans_up_failed_ones(tmp_path: Path) -> None:
    loaded = load_rig(rig_file(tmp_path, HOSTS))
    hosts = list(loaded.spec.hosts)
    targets = [HostTarget(h.name, "x", None, None, None, None, False, "p", "ssh", None, 1, 1) for h in hosts]
    requests: list[tuple[str, str, dict[str, Any]]] = []
    # Every host at once despite --forks 1: the three smoke calls meet here, or time out one by one.
    together = threading.Barrier(3, timeout=10)

    def node(target: HostTarget) -> factories.Answer:
        def answer(verb: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
            if verb == "facts":  # what apply would render depends on the node: smoke reads its facts first
                return factories.facts().model_dump(mode="json")
            requests.append((verb, target.name, args))
            if verb == "smoke-cleanup":
                assert timeout == control.CLEANUP_TIMEOUT_S
                return {"marker": f"{args['run_id']}/{args['node_rank']}", "leftover_pids": []}
            together.wait()
            if target.name == "gpu-c":
                raise ProvisionError("agent smoke did not finish")
            return {"ok": True, "ranks": ranks_of(args["node_rank"], world=6)}

        return answer

    done: list[tuple[str, bool]] = []
    options = factories.fake_fleet(node, forks=1)
    report = control.run_smoke(loaded, hosts, targets, options, lambda h, ok: done.append((h, ok)))
    # A cleanup call for the one whose call failed, after the others.
    assert sorted(name for verb, name, _ in requests if verb == "smoke") == ["gpu-a", "gpu-b", "gpu-c"]
    assert requests[-1] == ("smoke-cleanup", "gpu-c", {"run_id": report.run_id, "node_rank": 2})
    assert sorted(done) == [("gpu-a", True), ("gpu-b", True), ("gpu-c", False)]
    assert not report.ok and report.groups[0].problems[0] == "gpu-c: agent smoke did not finish"


@pytest.mark.parametrize("unreachable", [False, True], ids=["its-ranks-died", "unreachable"])
def test_a_node_that_fails_ends_its_groups_run_at_once_and_its_peers_are_not_blamed(
    tmp_path: Path, unreachable: bool
) -> None:
    """Before, a node whose ranks died before the process group formed (or that could not be reached) left
    its peers waiting until their rendezvous or process-group timeout in every run it was part of: here
    they would wait the whole 10 s. Now its failure ends their run (smoke-cleanup), and they are reported
    as stopped by it."""
    loaded = load_rig(rig_file(tmp_path, HOSTS))
    hosts = list(loaded.spec.hosts)
    targets = [HostTarget(h.name, "x", None, None, None, None, False, "p", "ssh", None, 1, 1) for h in hosts]
    parts = {p.host: p for p in control.plan_smoke(loaded, hosts, "run-1")}
    ended = {name: threading.Event() for name in parts}
    cleaned: list[str] = []

    def node(target: HostTarget) -> factories.Answer:
        if unreachable and target.name == "gpu-b":
            raise ConnectionFailed("connection refused by gpu-b")

        def answer(verb: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
            if verb == "smoke-cleanup":
                cleaned.append(target.name)
                ended[target.name].set()
                return {"marker": f"{args['run_id']}/{args['node_rank']}", "leftover_pids": []}
            if target.name == "gpu-b":
                return {"ok": False, "kind": "crash", "diagnosis": "rank 0 died before the process group"}
            if not ended[target.name].wait(10):
                return {"ok": False, "kind": "rendezvous-timeout", "diagnosis": "timed out waiting for peers"}
            return {"ok": False, "kind": "crash", "diagnosis": "torchrun ended by SIGTERM"}

        return answer

    run = control.SmokeRun(loaded, list(parts.values()), targets, factories.fake_fleet(node), None)
    started = time.monotonic()
    outcomes = run.run(parts, control.prepared(parts))
    assert time.monotonic() - started < 5
    reports = {name: control.node_report(parts[name], outcomes[name]) for name in parts}
    assert {name: (r.kind, r.diagnosis) for name, r in reports.items() if name != "gpu-b"} == {
        "gpu-a": ("stopped", "stopped after gpu-b failed"),
        "gpu-c": ("stopped", "stopped after gpu-b failed"),
    }
    group = control.judge_group(list(parts.values()), list(reports.values()))
    why = "connection refused by gpu-b" if unreachable else "rank 0 died before the process group"
    assert group.problems[0] == f"gpu-b: {why}"  # the search's evidence
    assert sorted(cleaned) == ["gpu-a", "gpu-c"]  # the failed node's own run had ended already
    table = piped(lambda console: console.print(nodes_table(group)))
    results = [line.split(" │ ")[2].strip() for line in table if line.startswith("gpu-")]
    assert results == ["stopped", "FAIL", "stopped"], table


def test_a_peer_still_reading_its_facts_when_a_node_fails_reports_its_own_failure(tmp_path: Path) -> None:
    """Seen in CI: two nodes without torch, and the second was still reading its facts when the first
    failed. It never made its smoke call and was reported "stopped after gpu-0 failed": the run named one
    bad node of two. A peer stopped before its call now still makes it; its own pre-run failure is kept,
    and a run it starts is ended like any peer's (`end`, every `every_s`)."""
    loaded = load_rig(rig_file(tmp_path, HOSTS))
    hosts = list(loaded.spec.hosts)
    targets = [HostTarget(h.name, "x", None, None, None, None, False, "p", "ssh", None, 1, 1) for h in hosts]
    parts = {p.host: p for p in control.plan_smoke(loaded, hosts, "run-1")}
    ended = {name: threading.Event() for name in parts}

    def node(target: HostTarget) -> factories.Answer:
        def answer(verb: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
            if verb == "smoke-cleanup":
                ended[target.name].set()
                return {"marker": f"{args['run_id']}/{args['node_rank']}", "leftover_pids": []}
            if target.name == "gpu-b":
                return {"ok": False, "kind": "crash", "diagnosis": "rank 0 died before the process group"}
            if target.name == "gpu-a":
                return {"ok": False, "kind": "torch-missing", "diagnosis": "torch is not installed in p"}
            ended[target.name].wait(10)
            return {"ok": False, "kind": "crash", "diagnosis": "torchrun ended by SIGTERM"}

        return answer

    prepared = control.prepared(parts)

    def args_of(session: AgentSession) -> dict[str, Any]:
        if session.target.name == "gpu-a":  # its facts come back only after gpu-b failed and was seen to
            assert ended["gpu-a"].wait(10)
        return prepared(session)

    run = control.SmokeRun(loaded, list(parts.values()), targets, factories.fake_fleet(node), None)
    outcomes = run.run(parts, args_of)
    reports = {name: control.node_report(parts[name], outcomes[name]) for name in parts}
    assert {name: (r.kind, r.diagnosis) for name, r in reports.items()} == {
        "gpu-a": ("torch-missing", "torch is not installed in p"),
        "gpu-b": ("crash", "rank 0 died before the process group"),
        "gpu-c": ("stopped", "stopped after gpu-b failed"),
    }


def test_only_the_failed_nodes_own_group_is_stopped_and_only_once(tmp_path: Path) -> None:
    (first, *_) = plan(tmp_path, HOSTS)

    def rendezvous(master: str) -> Any:
        return first.rendezvous._replace(master=master)

    masters = {"a1": "a1", "a2": "a1", "a3": "a1", "c1": "c1", "c2": "c1"}
    parts = {
        name: dataclasses.replace(first, host=name, rendezvous=rendezvous(m))
        for name, m in masters.items()
    }
    ends: list[list[str]] = []
    peers = control.PeerStop(parts, ends.append, for_s=0, every_s=0)
    peers.done("a3", True)  # finished before the failure: nothing to stop
    peers.done("a1", False)
    peers.done("a2", False)  # stopped by a1: its own failure stops no one else
    peers.done("c1", True)
    assert ends == [["a2"]] and peers.stopped == {"a2": "a1"}
    def failed(kind: str) -> HostOutcome[dict[str, Any]]:
        return HostOutcome("ok", {"ok": False, "kind": kind, "diagnosis": f"its own {kind}"}, None, 1.0)

    peers.stopped["c2"] = "c1"  # as if c1 had failed while c2 was still checking its torch
    outcomes = {"a2": failed("crash"), "c1": failed("crash"), "c2": failed("torch-missing")}
    relabeled = peers.relabel(outcomes)
    assert relabeled["a2"].value == {"ok": False, "kind": "stopped", "diagnosis": "stopped after a1 failed"}
    assert relabeled["c1"] == outcomes["c1"]  # not stopped: its own failure
    assert relabeled["c2"] == outcomes["c2"]  # failed before its ranks ran: by itself, whatever stopped it


def test_a_malformed_smoke_reply_fails_that_node_with_a_plain_error(tmp_path: Path) -> None:
    """Checked on arrival like facts (fleet/replies.py): before, `ok: "yes"` counted as a pass and a rank
    list that is not one was a traceback from the judgement."""
    loaded = load_rig(rig_file(tmp_path, HOSTS))
    hosts = list(loaded.spec.hosts)
    targets = [HostTarget(h.name, "x", None, None, None, None, False, "p", "ssh", None, 1, 1) for h in hosts]

    def node(target: HostTarget) -> factories.Answer:
        def answer(verb: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
            if verb == "facts":
                return factories.facts().model_dump(mode="json")
            if verb == "smoke" and target.name == "gpu-b":
                return {"ok": "yes", "ranks": "all of them"}
            return {"ok": True, "ranks": ranks_of(args.get("node_rank", 0), world=6)}

        return answer

    report = control.run_smoke(loaded, hosts, targets, factories.fake_fleet(node))
    assert not report.ok
    assert report.groups[0].problems[0] == (
        "gpu-b: agent smoke on gpu-b (x:22) answered a reply this version cannot read: ok: Input should be "
        "a valid boolean; ranks: Input should be a valid list"
    )


# ---- real: two local hosts through the agent zipapp and the command line ----------------------------


def local_rig(tmp_path: Path, python: str, port: int, names: tuple[str, ...] = ("gpu-a", "gpu-b")) -> Path:
    """Local hosts on this machine. They share one file system, so only a single host can have its own
    launcher; with more, smoke runs torchrun itself (`files.launcher: null`)."""
    hosts = [{"name": name, "address": "127.0.0.1", "rig": "pair", "connection": "local"} for name in names]
    path = rig_file(tmp_path, hosts)
    document = yaml.safe_load(path.read_text())
    document["rigs"]["pair"]["ddp"]["port"] = port
    document["smoke"] = {
        "python": python,
        "timeout_s": PASS_TIMEOUT_S,
        "batch_size": 4,
        "sizes_mib": [0.0625, 0.25],
    }
    document["env"] = {"OMP_NUM_THREADS": "1"}
    own = {"profile_d": "node/profile.sh", "environment_file": "node/env", "launcher": "node/mgpu-torchrun"}
    # The state folder beside the rig file: smoke records each box's baseline there, never on this machine.
    document["files"] = {**(own if len(names) == 1 else {"launcher": None}), "state_dir": "node/state"}
    path.write_text(yaml.safe_dump(document))
    return path


def install(rig: Path) -> dict[str, Path]:
    """Write what apply would write on the (single, local) host of `rig`."""
    written = {}
    for file in desired_files_on(rig, rig.parent / "known_hosts")["gpu-a"]:
        path = Path(file.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(file.content)
        path.chmod(int(file.mode, 8))
        written[path.name] = path
    return written


@pytest.mark.torch
def test_smoke_command_passes_on_two_local_hosts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code = cli.main(["smoke", str(local_rig(tmp_path, sys.executable, port)), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    group = out["groups"][0]
    assert out["ok"] is True and group["ok"] is True
    assert (group["world_size"], group["ranks_joined"], group["nnodes"]) == (4, 4, 2)
    assert group["backend"] == "gloo"  # the rig asks for gloo; NCCL would need CUDA
    assert [n["host"] for n in group["nodes"]] == ["gpu-a", "gpu-b"]
    assert [r["rank"] for r in group["nodes"][1]["ranks"]] == [2, 3]
    assert [b["size_mib"] for b in group["bandwidth"]] == [0.0625, 0.25]
    assert out["notices"] == [control.NO_LAUNCHER]
    assert processes_of_run(out["run_id"]) == []


@pytest.mark.torch
def test_smoke_runs_the_installed_launcher_and_refuses_a_stale_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = local_rig(tmp_path, sys.executable, free_port(), ("gpu-a",))
    written = install(rig)
    code = cli.main(["smoke", str(rig), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    node = out["groups"][0]["nodes"][0]
    assert out["notices"] == [] and node["launcher"] == str(written["mgpu-torchrun"])
    assert [r["rank"] for r in node["ranks"]] == [0, 1] and processes_of_run(out["run_id"]) == []

    launcher = written["mgpu-torchrun"]
    launcher.write_text(launcher.read_text().replace("nproc_per_node=2", "nproc_per_node=1"))
    code = cli.main(["smoke", str(rig), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2
    node = out["groups"][0]["nodes"][0]
    assert (node["kind"], node["diagnosis"]) == (
        "not-applied",
        f"launcher {launcher} is stale: run apply (line 11 is `nproc_per_node=1`, the rig file renders "
        "`nproc_per_node=2`)",
    )


@pytest.mark.torch
def test_smoke_command_fails_with_exit_2_naming_node_and_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["smoke", str(local_rig(tmp_path, "/usr/bin/python3", free_port()))])
    out = capsys.readouterr().out
    assert code == 2
    assert "FAIL" in out and "torch is not installed in /usr/bin/python3 on gpu-a" in " ".join(out.split())


def test_smoke_command_reports_rig_errors_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = local_rig(tmp_path, sys.executable, free_port())
    assert cli.main(["smoke", str(path), "--limit", "gpu-b"]) == 1
    assert "smoke runs whole DDP groups" in capsys.readouterr().err


def test_human_output_shows_nodes_bandwidth_and_verdict(tmp_path: Path) -> None:
    from rich.console import Console

    from mgpu_provision.commands.smoke import render_human

    band = [{"size_mib": 4.0, "time_us": 1234.5, "algbw_gbps": 2.0, "busbw_gbps": 3.0}]
    gpu = {"index": 1, "name": "NVIDIA GeForce RTX 3090", "uuid": "5c3e-aa"}
    ranks = [
        {**r, "backend": "gloo", "bandwidth": band, "device": "cpu", "simulated": True} for r in ranks_of(0)
    ]
    ranks[1].update(backend="nccl", device="cuda:1", gpu=gpu, simulated=False)
    outcomes = {"gpu-a": ok_outcome(0, ranks=ranks), "gpu-b": ok_outcome(1)}
    report = control.build_report("run-1", plan(tmp_path, HOSTS[:2]), outcomes, 5.0)
    console = Console(record=True, width=150)
    render_human(report, console)
    text = console.export_text()
    assert "DDP group of gpu-a (rendezvous 10.0.0.11:29555)" in text
    assert "gpu-b │ 1    │ pass" in text
    assert "       4 │    1234 │      2.000 │      3.000" in text
    assert "0    │ gpu-a │ gloo    │ cpu (simulated node)" in text
    assert "1    │ gpu-a │ nccl    │ cuda:1: NVIDIA GeForce RTX 3090, 5c3e-aa" in text
    assert "Smoke FAIL: world size 4 of 4 (2 nodes x 2 processes), 4 ranks reported, backend gloo" in text
    assert "! all_reduce busbw 3 GB/s (the best at 4 MiB) is below the floor of 5 GB/s" in text


def test_each_node_s_data_parallel_row_reaches_the_report_and_the_table(tmp_path: Path) -> None:
    from rich.console import Console

    from mgpu_provision.commands.smoke import render_human

    row = {"name": "data_parallel", "ok": True, "detail": "batch 8 over 2 GPUs, output on cuda:1",
           "device_ids": [0, 1], "output_device": 1, "batch": 8}  # fmt: skip
    failed = {"name": "data_parallel", "ok": False, "detail": "cuda:1 (H200) refused a CUDA context: x"}
    outcomes = {
        "gpu-a": ok_outcome(0, data_parallel=row, ranks=[{**r, "bandwidth": []} for r in ranks_of(0)]),
        "gpu-b": ok_outcome(
            1, ok=False, kind="check-failed", diagnosis="data_parallel: x", data_parallel=failed
        ),
    }
    report = control.build_report("run-1", plan(tmp_path, HOSTS[:2]), outcomes, None)
    assert [n.data_parallel for n in report.groups[0].nodes] == [row, failed]
    assert report.as_dict()["groups"][0]["nodes"][0]["data_parallel"]["device_ids"] == [0, 1]
    console = Console(record=True, width=150)
    render_human(report, console)
    text = console.export_text()
    assert "DataParallel (one process per node, after its ranks)" in text
    assert "gpu-a │ pass   │ batch 8 over 2 GPUs, output on cuda:1" in text
    assert "gpu-b │ FAIL   │ cuda:1 (H200) refused a CUDA context: x" in text


def test_via_srun_on_a_rig_without_slurm_is_a_plain_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["smoke", str(rig_file(tmp_path, HOSTS)), "--via", "srun"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "smoke --via srun needs a `slurm` section in the rig of gpu-b, gpu-a, gpu-c" in err, err
    assert "Traceback" not in err


def test_the_text_view_of_an_srun_smoke_names_the_job_and_its_nodes(tmp_path: Path) -> None:
    parts = plan(tmp_path, HOSTS[:2])
    ranks = {p.host: [dict(r, bandwidth=[]) for r in ranks_of(p.node_rank)] for p in parts}
    nodes = [control.node_report(p, ok_outcome(p.node_rank, ranks=ranks[p.host])) for p in parts]
    group = control.judge_group(parts, nodes)
    srun = {"job_id": "17", "nodes": ["gpu-a", "gpu-b"], "exit_code": 0, "elapsed_s": 4.2}
    report = control.SmokeReport("run", [dataclasses.replace(group, srun=srun)])
    out = io.StringIO()
    render_human(report, make_console(out))
    assert "srun job 17 on gpu-a,gpu-b: exit code 0 after 4.2 s" in out.getvalue(), out.getvalue()
    assert report.as_dict()["groups"][0]["srun"] == srun


def piped(render: Any) -> list[str]:
    """What `render(console)` writes through a real pipe, as `smoke … | tee log` would read it."""
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w", encoding="utf-8") as out:
        render(make_console(out))
    with os.fdopen(read_end, encoding="utf-8") as result:
        return result.read().splitlines()


def test_off_a_terminal_smoke_s_titles_and_tables_are_neither_wrapped_nor_padded(tmp_path: Path) -> None:
    why = "data_parallel: " + "cuda:1 refused a CUDA context " * 8  # wider than 80 columns
    row = {"name": "data_parallel", "ok": True, "detail": "ok"}  # a table narrower than its title
    outcomes = {
        "gpu-a": ok_outcome(0, data_parallel=row, ranks=[{**r, "bandwidth": []} for r in ranks_of(0)]),
        "gpu-b": ok_outcome(1, ok=False, kind="check-failed", diagnosis=why.strip()),
    }
    report = control.build_report("run-1", plan(tmp_path, HOSTS[:2]), outcomes, None)
    lines = piped(lambda console: render_human(report, console))
    assert [line for line in lines if line != line.rstrip()] == [], lines
    assert "DataParallel (one process per node, after its ranks)" in lines, lines
    assert any(line.endswith(why.strip()) and line.startswith("gpu-b") for line in lines), lines
