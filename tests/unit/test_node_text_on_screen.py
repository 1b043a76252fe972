"""Text from outside (a node's answer, a file, an error quoting it) on a person's screen: shown, not obeyed.

Any user of a GPU node can name a process with ESC sequences or rich markup; a node's files, GPU names and
error output may hold anything. Each view must print such text literally (control characters as `\\xNN`,
brackets as brackets), without a traceback; `--json` keeps the exact data.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from mgpu_provision.cli import main
from mgpu_provision.commands import facts as facts_view
from mgpu_provision.commands import reclaim as reclaim_view
from mgpu_provision.commands import validate as validate_command
from mgpu_provision.commands.apply import show_recap
from mgpu_provision.commands.output import host_table, make_console
from mgpu_provision.commands.plan_view import render_plan
from mgpu_provision.commands.smoke import render_human as render_smoke
from mgpu_provision.errors import ProvisionError
from mgpu_provision.facts import Facts
from mgpu_provision.fleet.pool import HostOutcome
from mgpu_provision.jobs.apply import ApplyResult, HostRecap
from mgpu_provision.jobs.plan import FleetPlan, HostPlan
from mgpu_provision.jobs.reclaim import HostReclaim, ReclaimedProcess
from mgpu_provision.jobs.smoke import GroupReport, NodeReport, SmokeReport
from mgpu_provision.plan.change import Change
from tests.support import factories

# A title change, a bell, a colour and a screen clear: what a terminal would obey if sent raw.
ESC_TEXT = "\x1b]0;owned\x07\x1b[31mred\x1b[2J"
SHOWN = "\\x1b]0;owned\\x07\\x1b[31mred\\x1b[2J"
RAW = {"\x1b", "\x07", "\r", "\x9b"}


def screen(draw: Callable[[Console], object]) -> str:
    """What a view wrote to a plain 250-column console (no colour codes of its own)."""
    out = io.StringIO()
    console = make_console(file=out, width=250)
    console.no_color = True
    draw(console)
    return out.getvalue()


def test_reclaim_command_lines_and_reasons_are_printed_literally() -> None:
    process = ReclaimedProcess.model_validate(
        {
            "pid": 4242,
            "gpu": 0,
            "used_mib": 1000,
            "command": f"{ESC_TEXT} [red]x[/]",
            "ppid": 1,
            "owner": "mallory",
            "start_time": 1764400000.0,
            "state": "S",
            "orphaned": True,
            "torchrun_job": False,
            "alive": True,
            "classification": "orphaned",
            "action": "would-end",
            "reason": "matches [bold]pattern[/bold] \x1b[5m",
        }
    )
    hosts = [HostReclaim("gpu-a", "ok", None, [process], 0)]
    text = screen(lambda console: reclaim_view.render_human(hosts, dry_run=True, console=console))
    assert not set(text) & RAW
    assert f"{SHOWN} [red]x[/]" in text
    assert "matches [bold]pattern[/bold] \\x1b[5m" in text
    # --json keeps the exact command line (json.dumps escapes it itself).
    document = json.loads(json.dumps(reclaim_view.as_json(hosts, dry_run=True)))
    assert document["hosts"]["gpu-a"]["processes"][0]["command"] == f"{ESC_TEXT} [red]x[/]"


def test_a_host_error_with_markup_is_printed_without_a_traceback() -> None:
    hosts = [HostReclaim("gpu-c", "failed", "agent said: [/x] and [bold]loud\x1b[1m")]
    text = screen(lambda console: reclaim_view.render_human(hosts, dry_run=True, console=console))
    assert "gpu-c: failed: agent said: [/x] and [bold]loud\\x1b[1m" in text


def test_smoke_diagnoses_details_notices_and_gpu_names_are_printed_literally() -> None:
    node = NodeReport(
        host="gpu-a",
        node_rank=0,
        ok=False,
        kind="rank-failed",
        diagnosis=f"rank 1: RuntimeError: {ESC_TEXT} [/]",
        ranks=[],
        elapsed_s=1.0,
        data_parallel={"ok": False, "detail": f"cuda:1 said {ESC_TEXT}"},
    )
    group = GroupReport(
        master="gpu-a",
        endpoint="10.0.0.11:29555",
        nnodes=1,
        nproc_per_node=2,
        expected_world_size=2,
        world_size=None,
        backend=None,
        requested_backend="nccl",
        ranks_joined=0,
        bandwidth=[],
        busbw_floor_gbps=None,
        problems=[f"gpu-a: rank 1: RuntimeError: {ESC_TEXT} [/]"],
        nodes=[node],
        devices=[
            {"rank": 0, "host": "gpu-a", "backend": "nccl", "device": "cuda:0", "gpu": {"name": ESC_TEXT}}
        ],
    )
    notice = f"gpu-a: /etc/mgpu-provision/environment line 3 is stale: A={ESC_TEXT} [/yellow]"
    report = SmokeReport("run-1", [group], [notice])
    text = screen(lambda console: render_smoke(report, console))
    assert not set(text) & RAW
    assert f"RuntimeError: {SHOWN} [/]" in text  # the why column and the problem line
    assert f"cuda:1 said {SHOWN}" in text
    assert f"cuda:0: {SHOWN}" in text
    assert f"note: gpu-a: /etc/mgpu-provision/environment line 3 is stale: A={SHOWN} [/yellow]" in text


def test_facts_gpu_names_and_node_strings_are_printed_literally() -> None:
    box = factories.facts(
        gpus=[factories.gpu(0, name=f"NVIDIA {ESC_TEXT} [/]")],
        host={"kernel": "6.8\x1b[2J"},
        driver={"message": "NVML said [bold]no\x1b[0m", "nvml": "error"},
    )
    outcomes = {
        "gpu-a": HostOutcome[Facts]("ok", box, None, 1.0),
        "gpu-b": HostOutcome[Facts]("failed", None, "agent: \x1b[31m[/x]", 1.0),
    }
    text = screen(lambda console: facts_view.render(outcomes, console))
    assert not set(text) & RAW
    assert f"NVIDIA {SHOWN} [/]" in text
    assert "kernel 6.8\\x1b[2J" in text
    assert "NVML said [bold]no\\x1b[0m" in text
    assert "gpu-b  failed: agent: \\x1b[31m[/x]" in text


def test_plan_summaries_and_host_errors_quoting_a_node_are_printed_literally() -> None:
    change = Change(
        "persistence", "update", f"persistence mode of GPU 0 ({ESC_TEXT} [/]) is off", "off", "on", phase="x"
    )
    plan = FleetPlan(
        (HostPlan("gpu-a", "ok", (change,)), HostPlan("gpu-b", "failed", error=f"agent said {ESC_TEXT}"))
    )
    text = screen(lambda console: render_plan(plan, console))
    assert not set(text) & RAW
    assert f"  ~ persistence: persistence mode of GPU 0 ({SHOWN} [/]) is off" in text
    assert f"gpu-b: failed: agent said {SHOWN}" in text


def test_a_recap_error_cell_is_printed_literally() -> None:
    table = host_table(
        {"gpu-a": {"status": "failed", "error": f"agent said {ESC_TEXT} [/x]"}}, ["status", "error"]
    )
    text = screen(lambda console: console.print(table))
    assert not set(text) & RAW
    assert f"agent said {SHOWN} [/x]" in text


def test_apply_recap_lines_and_errors_quoting_a_node_are_printed_literally() -> None:
    recap = HostRecap(
        "gpu-a",
        "failed",
        done=[f"file: wrote /etc/x ({ESC_TEXT})"],
        error=f"apt said {ESC_TEXT} [/x]",
        notes=[f"the agent said {ESC_TEXT} [bold]"],
    )
    plan = FleetPlan((HostPlan("gpu-a", "ok", simulated=True),))
    text = screen(lambda console: show_recap(console, ApplyResult((recap,)), plan))
    assert not set(text) & RAW
    assert f"  done: file: wrote /etc/x ({SHOWN})" in text
    assert f"  the agent said {SHOWN} [bold]" in text
    assert f"apt said {SHOWN} [/x]" in text


def test_an_error_quoting_a_node_is_printed_literally_by_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(_args: object) -> int:
        raise ProvisionError(f"gpu-a: the agent wrote {ESC_TEXT}\r\x9b2J")

    monkeypatch.setattr(validate_command, "run", fails)
    assert main(["validate", "rig.yaml"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: gpu-a: the agent wrote {SHOWN}\\x0d\\x9b2J\n"


def test_validate_shows_a_key_holding_control_characters_literally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = tmp_path / "rig.yaml"
    rig.write_text('version: 1\n"bo\\e[2Jgus": 1\n', encoding="utf-8")  # YAML's \e is ESC
    assert main(["validate", str(rig)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "unknown key 'bo\\x1b[2Jgus'" in out
