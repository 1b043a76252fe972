"""Control side of reclaim: agent arguments, the answer's contract, verification by facts, verdict, output."""

from __future__ import annotations

import io
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mgpu_provision.cli import main
from mgpu_provision.commands import reclaim as view
from mgpu_provision.errors import AgentError, ConnectionFailed
from mgpu_provision.facts import Facts
from mgpu_provision.fleet.options import FleetOptions, Timeouts
from mgpu_provision.fleet.pool import HostOutcome, call_many
from mgpu_provision.fleet.targets import HostTarget
from mgpu_provision.jobs import reclaim, steps
from mgpu_provision.jobs.reclaim import HostReclaim, ReclaimedProcess
from mgpu_provision.protocol import facts_request
from mgpu_provision.rig import nodesets
from mgpu_provision.rig.models import Reclaim
from tests.support import factories


def row(pid: int, action: str, used_mib: int | None = 1000, gpu: int = 0, **kw: Any) -> dict[str, Any]:
    return {
        "pid": pid,
        "gpu": gpu,
        "used_mib": used_mib,
        "command": f"python train.py --rank {pid}",
        "ppid": 1,
        "owner": "alice",
        "start_time": 1764400000.0 + pid,
        "state": "S",
        "orphaned": action != "keep",
        "torchrun_job": False,
        "alive": action != "ended",
        "classification": "orphaned" if action != "keep" else "attached",
        "action": action,
        "reason": kw.pop("reason", f"reason {pid}"),
        **kw,
    }


def procs(*rows: dict[str, Any]) -> list[ReclaimedProcess]:
    return [ReclaimedProcess.model_validate(r) for r in rows]


def facts_with(*processes: dict[str, Any]) -> Facts:
    return factories.facts(processes=list(processes))


# ------------------------------------------------------------------------------------------- arguments


def test_agent_args_carry_the_policy() -> None:
    policy = Reclaim(policy="orphans+patterns", patterns=["leak\\.py"], grace_s=3)
    assert reclaim.agent_args(policy, dry_run=False) == {
        "policy": "orphans+patterns",
        "patterns": ["leak\\.py"],
        "grace_s": 3.0,
        "dry_run": False,
        "user": None,
        "pids": [],
    }
    assert reclaim.agent_args(policy, dry_run=True, user="alice")["user"] == "alice"
    assert reclaim.agent_args(policy, dry_run=True, pids=[4242])["pids"] == [4242]


def test_y_is_short_for_yes() -> None:
    from mgpu_provision.cli import build_parser

    args = build_parser().parse_args(["reclaim", "rig.yaml", "-y", "--pid", "7", "--pid", "9"])
    assert args.yes is True and args.pid == [7, 9]


@pytest.mark.parametrize(
    ("option", "value", "what"),
    [
        *(("--user", name, "a user name") for name in ["", "al ice", "alice:x", "../root"]),
        *(("--pid", pid, "a process id") for pid in ["0", "-3", "12x", ""]),
    ],
)
def test_user_and_pid_are_checked(
    option: str, value: str, what: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit):
        main(["reclaim", str(tmp_path / "rig.yaml"), option, value])
    assert f"argument {option}: {value!r} is not {what}" in capsys.readouterr().err


def test_an_answer_outside_the_contract_is_an_agent_error() -> None:
    with pytest.raises(AgentError, match="agent reclaim on gpu-a answered outside the contract"):
        reclaim.parse_result("gpu-a", {"processes": [{"pid": 1}], "freed_mib": 0})
    with pytest.raises(AgentError, match="outside the contract"):
        reclaim.parse_result("gpu-a", {"processes": [row(5, "exploded")], "freed_mib": 0})


# ------------------------------------------------------------------------------------------- verify


def test_verify_keeps_ended_processes_that_facts_no_longer_show() -> None:
    result = reclaim.HostResult(processes=procs(row(10, "ended"), row(11, "keep")), freed_mib=1000)
    facts = facts_with({"pid": 11, "gpu": 0, "used_mib": 1000, "start_time": 1764400011.0})
    assert reclaim.verify(result, facts) == result


def test_verify_fails_an_ended_process_that_still_holds_memory() -> None:
    result = reclaim.HostResult(processes=procs(row(10, "ended"), row(12, "ended", 500)), freed_mib=1500)
    facts = facts_with({"pid": 10, "gpu": 0, "used_mib": 1000, "start_time": 1764400010.2})
    verified = reclaim.verify(result, facts)
    assert [(p.pid, p.action) for p in verified.processes] == [(10, "failed"), (12, "ended")]
    assert verified.processes[0].reason == "reason 10; facts still show it holding GPU memory"
    assert verified.freed_mib == 500


def test_a_reused_pid_or_a_dead_entry_in_facts_is_not_the_ended_process() -> None:
    ended = procs(row(10, "ended"))[0]
    assert not reclaim.still_held(ended, facts_with({"pid": 10, "gpu": 0, "start_time": 1764409999.0}))
    assert not reclaim.still_held(ended, facts_with({"pid": 10, "gpu": 0, "alive": False}))
    assert not reclaim.still_held(ended, facts_with({"pid": 10, "gpu": 0, "state": "Z"}))
    assert reclaim.still_held(ended, facts_with({"pid": 10, "gpu": 0}))


def fake_session(answers: dict[str, dict[str, Any]]) -> factories.FakeSession:
    return factories.FakeSession(factories.ssh_target(), lambda verb, args, timeout: answers[verb])


def test_facts_are_asked_again_only_when_something_was_ended() -> None:
    dry = fake_session({"reclaim": {"processes": [row(10, "would-end")], "freed_mib": 0}})
    assert reclaim.reclaim_on(dry, {"dry_run": True}).processes[0].action == "would-end"
    assert [verb for verb, _ in dry.calls] == ["reclaim"]

    done = fake_session(
        {"reclaim": {"processes": [row(10, "ended")], "freed_mib": 1000}, "facts": facts_with().model_dump()}
    )
    assert reclaim.reclaim_on(done, {"dry_run": False}).freed_mib == 1000
    assert done.calls == [("reclaim", {"dry_run": False}), ("facts", facts_request())]


# ------------------------------------------------------------------------------------------- --via clush

# Each host's node: its reclaim answer, its facts answer after the kill (None: never asked).
NODES: dict[str, tuple[Any, Any]] = {
    "dry": ({"processes": [row(10, "would-end")], "freed_mib": 0}, None),
    "freed": ({"processes": [row(10, "ended")], "freed_mib": 1000}, facts_with().model_dump()),
    "stuck": (
        {"processes": [row(10, "ended"), row(12, "ended", 500)], "freed_mib": 1500},
        facts_with({"pid": 10, "gpu": 0, "start_time": 1764400010.2}).model_dump(),
    ),
    "drifted": ({"processes": [{"pid": 1}], "freed_mib": 0}, None),
    "bad-facts": ({"processes": [row(10, "ended")], "freed_mib": 1000}, {"gpus": "many"}),
    "lost-facts": ({"processes": [row(10, "ended")], "freed_mib": 1000}, AgentError("agent facts crashed")),
    "down": (None, None),
}


def node(target: HostTarget) -> factories.Answer:
    answers = dict(zip(("reclaim", "facts"), NODES[target.name], strict=True))
    if answers["reclaim"] is None:
        raise ConnectionFailed(f"cannot reach {target.name}: Connection refused")

    def answer(verb: str, args: dict[str, Any], timeout: float) -> Any:
        got = answers[verb]
        if isinstance(got, Exception):
            raise got
        assert got is not None, f"{target.name} was asked {verb}"
        return got

    return answer


def test_reclaim_via_clush_batches_its_phases_and_gives_the_fabric_outcomes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two phases through the batch seam (an injected session keeps call_many on the pool, so both
    engines meet the same fake nodes): one `reclaim` request for all, `facts` only where something was
    ended; every host's status, result and error as the Fabric path's one session a host gives them."""
    targets = [factories.ssh_target(name=name) for name in NODES]
    request = {"dry_run": False, "policy": "orphans"}
    fabric = reclaim.reclaim_fleet(targets, request, factories.fake_fleet(node))
    seen: list[tuple[str, list[str], list[Any]]] = []

    def spy(
        chosen: list[HostTarget],
        verb: str,
        requests: dict[str, Any],
        options: FleetOptions,
        timeout: Timeouts = None,
    ) -> dict[str, HostOutcome[dict[str, Any]]]:
        seen.append((verb, [t.name for t in chosen], list(requests.values())))
        return call_many(chosen, verb, requests, options, timeout)

    monkeypatch.setattr(steps, "call_many", spy)  # the batch driver reclaim runs on (jobs/steps.py)
    clush = reclaim.reclaim_fleet(targets, request, factories.fake_fleet(node, via="clush"))
    assert [(verb, names) for verb, names, _ in seen] == [
        ("reclaim", list(NODES)),
        ("facts", ["freed", "stuck", "bad-facts", "lost-facts"]),
    ]
    assert seen[0][2] == [request] * len(NODES) and seen[1][2] == [facts_request()] * 4  # one worker each

    def fates(outcomes: dict[str, HostOutcome[reclaim.HostResult]]) -> dict[str, Any]:
        return {n: (o.status, o.value, o.error) for n, o in outcomes.items()}

    assert fates(clush) == fates(fabric)
    assert {n: o.status for n, o in clush.items()} == {
        "dry": "ok", "freed": "ok", "stuck": "ok", "drifted": "failed", "bad-facts": "failed",
        "lost-facts": "failed", "down": "unreachable",
    }  # fmt: skip
    stuck = clush["stuck"].value
    assert stuck is not None and [p.action for p in stuck.processes] == ["failed", "ended"]
    assert clush["down"].error == "cannot reach down: Connection refused"
    assert "agent facts on bad-facts (10.0.0.1:2222) answered facts this version" in str(
        clush["bad-facts"].error
    )
    assert list(clush) == list(NODES)


def test_reclaim_takes_via_clush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodesets, "clustershell", lambda: True)
    monkeypatch.setattr(nodesets, "too_old", lambda: None)
    taken: list[FleetOptions] = []

    def fleet(targets: list[HostTarget], args: dict[str, Any], options: FleetOptions) -> dict[str, Any]:
        taken.append(options)
        return {}

    monkeypatch.setattr(view, "reclaim_fleet", fleet)
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "hosts:\n  - {name: gpu-001, address: 10.0.0.1, rig: pair}\n"
        "rigs:\n  pair: {gpus: {model: NVIDIA GeForce RTX 3090, count: 2}}\n"
    )
    assert main(["reclaim", str(rig), "--via", "clush", "--json"]) == 0
    assert [o.via for o in taken] == ["clush"]


# ------------------------------------------------------------------------------------------- judging


def host(name: str, *rows: dict[str, Any], freed: int = 0) -> HostReclaim:
    return HostReclaim(name, "ok", None, procs(*rows), freed)


@pytest.mark.parametrize(
    ("hosts", "code"),
    [
        ([host("a"), host("b", row(1, "keep"))], 0),
        ([host("a", row(1, "ended"), row(2, "keep"), freed=1000)], 0),
        ([host("a", row(1, "would-end"))], 2),
        ([host("a", row(1, "ended")), host("b", row(2, "failed"))], 2),
        ([host("a", row(1, "refused"))], 2),
        ([host("a"), HostReclaim("b", "unreachable", "connection refused")], 2),
        ([HostReclaim("a", "ok", None, procs(row(1, "keep")), 0, [4242])], 2),  # --pid named a non-holder
    ],
)
def test_exit_code(hosts: list[HostReclaim], code: int) -> None:
    assert reclaim.exit_code(hosts) == code


def test_collect_keeps_failed_and_unreachable_hosts() -> None:
    ok = reclaim.HostResult(processes=procs(row(1, "ended")), freed_mib=1000)
    hosts = reclaim.collect(
        {
            "a": HostOutcome("ok", ok, None, 0.1),
            "b": HostOutcome("unreachable", None, "gpu-b: connection refused", 3.0),
        }
    )
    assert hosts == [
        HostReclaim("a", "ok", None, ok.processes, 1000),
        HostReclaim("b", "unreachable", "gpu-b: connection refused"),
    ]


def test_summary_dry_run_counts_processes_once_across_gpus() -> None:
    hosts = [host("a", row(1, "would-end", 1000, gpu=0), row(1, "would-end", 500, gpu=1), row(2, "keep"))]
    assert view.summary(hosts, dry_run=True) == (
        "Would end 1 process holding 1500 MiB (dry run: --yes ends them) on 1 of 1 hosts"
    )


def test_summary_after_ending_names_what_is_left() -> None:
    hosts = [
        host("a", row(1, "ended"), row(2, "ended"), freed=2000),
        host("b", row(3, "failed"), row(4, "refused")),
        HostReclaim("c", "unreachable", "timed out"),
    ]
    assert view.summary(hosts, dry_run=False) == (
        "Ended 2 processes, freed 2000 MiB on 2 of 3 hosts; 1 refused, 1 failed, 1 host failed or unreachable"
    )
    assert view.summary([host("a")], dry_run=True) == "Would end 0 processes holding 0 MiB on 1 of 1 hosts"


def test_json_has_stable_keys() -> None:
    hosts = [host("a", row(1, "ended"), freed=1000), HostReclaim("b", "failed", "agent reclaim failed")]
    out = view.as_json(hosts, dry_run=False, user="alice")
    assert out["freed_mib"] == 1000 and out["exit_code"] == 2 and out["dry_run"] is False
    assert out["user"] == "alice"
    assert out["hosts"]["b"] == {
        "status": "failed",
        "error": "agent reclaim failed",
        "freed_mib": 0,
        "processes": [],
        "not_holders": [],
    }
    assert out["hosts"]["a"]["processes"][0]["action"] == "ended"
    assert set(out["hosts"]["a"]["processes"][0]) >= {"pid", "gpu", "used_mib", "owner", "command", "reason"}


def render(hosts: list[HostReclaim], width: int, terminal: bool, dry_run: bool = False) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=terminal)
    view.render_human(hosts, dry_run=dry_run, console=console)
    return buffer.getvalue()


@pytest.mark.parametrize("terminal", [True, False])
def test_human_output_has_a_table_per_node_and_the_total(terminal: bool) -> None:
    hosts = [
        host(
            "gpu-a",
            row(4242, "ended", reason="orphaned: its parent pid 77 is gone; ended by SIGTERM"),
            freed=1000,
        ),
        host("gpu-b"),
        HostReclaim("gpu-c", "unreachable", "gpu-c: connection refused"),
        HostReclaim("gpu-d", "ok", None, [], 0, [31337]),
    ]
    text = render(hosts, 200, terminal)
    assert "gpu-a" in text and "4242" in text and "ended by SIGTERM" in text and "alice" in text
    started = datetime.fromtimestamp(1764400000.0 + 4242).strftime("%m-%d %H:%M:%S")
    assert started in text
    assert "gpu-b: no process holds GPU memory" in text
    assert "gpu-c: unreachable: gpu-c: connection refused" in text
    assert "gpu-d: pid 31337 holds no GPU memory: nothing to end" in text
    assert text.rstrip().endswith(
        "Ended 1 process, freed 1000 MiB on 3 of 4 hosts; 1 host failed or unreachable"
    )


def test_every_value_stands_under_its_own_heading() -> None:
    hosts = [host("gpu-a", row(4242, "ended", used_mib=1200, gpu=3, reason="orphaned"), freed=1200)]
    lines = render(hosts, 250, terminal=True).splitlines()
    header = next(line for line in lines if "ppid" in line)
    values = next(line for line in lines if "4242" in line)
    cells = dict(
        zip([c.strip() for c in header.split("┃")], [c.strip() for c in values.split("│")], strict=True)
    )
    assert cells["pid"] == "4242" and cells["ppid"] == "1" and cells["gpu"] == "3" and cells["MiB"] == "1200"
    assert cells["owner"] == "alice" and cells["action"] == "ended" and cells["why"] == "orphaned"
    assert cells["command"] == "python train.py --rank 4242"


LONG_WHY = (
    "its process group leader pid 400 is gone and nothing marks it as that job's worker (a backgrounded "
    "job? a fork-mode child?); `reclaim --pid 401` ends exactly it"
)


def test_piped_output_has_one_line_per_process_and_wraps_nothing() -> None:
    hosts = [
        host("gpu-a", row(401, "keep", reason=LONG_WHY), row(40123, "would-end", gpu=1, reason="orphaned"))
    ]
    lines = render(hosts, 80, terminal=False, dry_run=True).splitlines()
    assert lines[0].split() == ["host", *view.COLUMNS]
    assert len(lines) == 4  # the header, a line per process, the summary
    assert lines[1].startswith("gpu-a    401  ") and lines[1].endswith(LONG_WHY)
    assert " would-end " in lines[2] and lines[2].endswith("orphaned")
    # Columns line up: each row's action starts where the header's does.
    assert lines[1].index("keep") == lines[2].index("would-end") == lines[0].index("action")


def test_a_narrow_terminal_keeps_every_short_cell_whole() -> None:
    hosts = [host("gpu-a", row(4242, "would-end", reason=LONG_WHY))]
    text = render(hosts, 80, terminal=True, dry_run=True)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any("would-end" in line and "4242" in line for line in lines)
    assert "started" not in text and "ppid" not in text  # dropped to make room for command and why
    assert "python train.py…" in text  # the command is cut, the reason wrapped at spaces
    why = " ".join(line.rpartition("│")[2].strip() for line in lines if "│" in line)
    assert why == LONG_WHY
    wide = render(hosts, 130, terminal=True, dry_run=True)
    assert "started" in wide and "ppid" in wide and "python train.py --rank 4242" in wide


def test_mps_clients_show_their_server() -> None:
    hosts = [host("gpu-a", row(5001, "keep", mps_server=4990))]
    assert "python train.py --rank 5001 (MPS client of pid 4990)" in render(hosts, 200, terminal=False)
