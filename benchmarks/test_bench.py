"""Tests of the benchmark's own logic: statistics, ratios, targets, output parsing, command building.

Not in the default test run (testpaths is tests/); run with `.venv/bin/pytest benchmarks`. The last test runs
the whole benchmark on two hosts (root, sshd and unshare needed, like tests/e2e; it skips elsewhere).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from contenders import (
    AnsibleAdHoc,
    BenchHost,
    Fleet,
    PlainSsh,
    Tool,
    agent_command,
    ansible_files,
    ansible_results,
    select,
)
from fleet import DEFAULT_ANSIBLE, BenchmarkError, parse_sizes, rotated
from hotspots import collapse, import_bill, summary
from measure import Finished, Spawn, Usage, parse_time_report, run_together
from report import Row, Sample, markdown, peer_over, summarize, verdicts, vs_floor

from tests import hosts as harness  # importable: testbed (via fleet) put the repository on sys.path


def sample(contender: str, hosts: int, wall: float, rss_mib: float = 50, cpu: float = 1.0) -> Sample:
    return Sample(contender, hosts, wall, cpu, int(rss_mib * 1024), 1.0, 1.0)


def test_summarize_takes_median_min_max_and_per_host_cpu() -> None:
    rows = summarize([sample("plan", 8, w, cpu=c) for w, c in ((3.0, 0.8), (1.0, 0.4), (2.0, 1.6))])
    assert rows == [Row("plan", 8, 3, 2.0, 1.0, 3.0, 0.1, 50.0, 1.0, 1.0)]


def test_rows_come_in_fleet_size_order() -> None:
    rows = summarize([sample("ssh", 64, 1.0), sample("ssh", 8, 0.5), sample("plan", 8, 0.6)])
    assert [(r.hosts, r.contender) for r in rows] == [(8, "ssh"), (8, "plan"), (64, "ssh")]


def test_ratios_compare_within_the_same_fleet_size() -> None:
    rows = summarize(
        [sample("ssh", 8, 0.5), sample("plan", 8, 0.6), sample("ansible", 8, 6.0), sample("ssh", 64, 2.0)]
    )
    plan = next(r for r in rows if r.contender == "plan")
    assert vs_floor(rows, plan) == pytest.approx(1.2)
    assert peer_over(rows, plan) == pytest.approx(10.0)
    lone = next(r for r in rows if r.hosts == 64)
    assert peer_over(rows, lone) is None


def test_targets_are_judged_and_a_miss_is_shown() -> None:
    samples = [
        sample("ssh", 32, 1.0),
        sample("plan", 32, 1.2, rss_mib=60),
        sample("ansible", 32, 6.0),
        sample("ssh", 64, 1.0),
        sample("plan", 64, 1.6, rss_mib=160),
        sample("ansible", 64, 16.0),
    ]
    found = {v.target: (v.measured, v.met) for v in verdicts(summarize(samples))}
    assert found["plan on 64 hosts <= 1.5x the plain-SSH floor"] == ("1.60x", False)
    assert found["plan >= 6x faster than ansible at 32 hosts"] == ("5.0x", False)
    assert found["plan >= 6x faster than ansible at 64 hosts"] == ("10.0x", True)
    assert found["plan peak memory < 150 MiB at 64 hosts"] == ("160 MiB", False)
    growth = found["plan peak memory grows less than linearly with the fleet"]
    assert growth == ("60 -> 160 MiB (2.67x) for 2x hosts", False)
    page = markdown(summarize(samples), ["# title"])
    assert "| plan on 64 hosts <= 1.5x the plain-SSH floor | 1.60x | **no** |" in page
    assert "| 64 | plan | 1.60 | 1.60–1.60 | 1.60x | 10.00x |" in page


def test_targets_not_measured_say_so() -> None:
    found = verdicts(summarize([sample("ssh", 8, 0.5)]))
    assert all(v.met is None for v in found)
    assert {v.measured for v in found} == {"not measured", "needs two fleet sizes"}


def test_ansible_raw_mode_is_judged_too() -> None:
    rows = summarize([sample("plan", 32, 1.0), sample("ansible-raw", 32, 3.0)])
    found = {v.target: v.met for v in verdicts(rows)}
    assert found["plan >= 6x faster than ansible-raw at 32 hosts"] is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,x", "--hosts wants comma-separated host counts, e.g. 1,8,32,64; got '1,x'"),
        ("0,8", "--hosts: each count must be between 1 and 254; got '0,8'"),
        ("300", "--hosts: each count must be between 1 and 254; got '300'"),
        ("", "--hosts: each count must be between 1 and 254; got ''"),
    ],
)
def test_bad_fleet_sizes_are_refused(text: str, message: str) -> None:
    with pytest.raises(BenchmarkError) as caught:
        parse_sizes(text)
    assert str(caught.value) == message


def test_fleet_sizes_are_sorted_and_unique() -> None:
    assert parse_sizes("64, 8,1,8") == [1, 8, 64]


def test_rounds_rotate_the_order() -> None:
    items = select(["ssh", "plan", "ansible"])
    assert [c.name for c in rotated(items, 0)] == ["ssh", "plan", "ansible"]
    assert [c.name for c in rotated(items, 1)] == ["plan", "ansible", "ssh"]
    assert [c.name for c in rotated(items, 5)] == ["ansible", "ssh", "plan"]


def test_unknown_contender_is_named() -> None:
    with pytest.raises(ValueError, match="unknown contender"):
        select(["ssh", "pyinfra"])


def test_agent_command_is_one_shell_line_that_pipes_the_request() -> None:
    command = agent_command("/usr/bin/python3", "agent-abc.pyz", {"args": {"files": ["/etc/it's"]}})
    words = shlex.split(command)
    assert words[0] == "echo"
    assert json.loads(words[1]) == {"args": {"files": ["/etc/it's"]}}
    assert words[2:] == ["|", "/usr/bin/python3", "~/.cache/mgpu-provision/agent-abc", "facts"]


RAW_OUTPUT = """\
h002 | CHANGED | rc=0 >>
{"ok": true}
Connection to 127.0.0.2 closed.

h001 | FAILED | rc=1 >>
Traceback: boom
h003 | UNREACHABLE! => {
    "msg": "Failed to connect"
}
"""


def test_ansible_output_is_split_per_host() -> None:
    assert ansible_results(RAW_OUTPUT) == {
        "h002": ("CHANGED rc=0", '{"ok": true}'),
        "h001": ("FAILED rc=1", "Traceback: boom"),
        "h003": ("UNREACHABLE!", '=> {\n    "msg": "Failed to connect"\n}'),
    }


def fleet_of(tmp_path: Path, names: list[str]) -> Fleet:
    return Fleet(
        hosts=tuple(BenchHost(n, f"127.0.0.{i + 1}", 2222) for i, n in enumerate(names)),
        user="root",
        python="/usr/bin/python3",
        key=tmp_path / "id",
        known_hosts=tmp_path / "known_hosts",
        rig=tmp_path / "rig.yaml",
        agent_command="echo {} | python3 agent facts",
        workdir=tmp_path,
        mgpu_provision="mgpu-provision",
        ansible="ansible",
    )


def one_process(stdout: str, returncode: int = 0, stderr: str = "") -> Usage:
    return Usage(1.0, (Finished(returncode, stdout, stderr, 0.1, 1000),))


def test_ansible_run_counts_only_when_every_host_answered(tmp_path: Path) -> None:
    fleet = fleet_of(tmp_path, ["h001", "h002", "h003"])
    ansible = AnsibleAdHoc("ansible-raw", "raw")
    assert ansible.problem(fleet, one_process(RAW_OUTPUT)) == "ansible: h001 FAILED rc=1: Traceback: boom"
    fleet = fleet_of(tmp_path, ["h002", "h004"])
    assert ansible.problem(fleet, one_process(RAW_OUTPUT, 4, "ERROR! boom")) == (
        "ansible printed nothing for h004 (exit 4): ERROR! boom"
    )
    good = 'h002 | CHANGED | rc=0 >>\n{"ok": false, "error": {}}\n'
    assert ansible.problem(fleet_of(tmp_path, ["h002"]), one_process(good)) == (
        'ansible: h002: agent failed: \'{"ok": false, "error": {}}\''
    )


def test_ansible_files_check_host_keys_and_stay_cold(tmp_path: Path) -> None:
    config, inventory = ansible_files(fleet_of(tmp_path, ["h001"]))
    text = config.read_text()
    assert "host_key_checking = True" in text
    assert "ControlMaster=no" in text and "StrictHostKeyChecking=yes" in text
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in text
    assert "h001 ansible_host=127.0.0.1 ansible_port=2222" in inventory.read_text()


def test_ssh_run_names_the_host_that_failed(tmp_path: Path) -> None:
    fleet = fleet_of(tmp_path, ["h001", "h002"])
    usage = Usage(
        1.0,
        (
            Finished(0, '{"ok": true}', "", 0.1, 1),
            Finished(255, "", "banner\nHost key verification failed.\n", 0.1, 1),
        ),
    )
    assert PlainSsh().problem(fleet, usage) == "ssh to h002 exited 255: Host key verification failed."
    argv = PlainSsh().spawns(fleet)[0].argv
    assert argv[-3:] == ("root", "127.0.0.1", fleet.agent_command)
    assert "KexAlgorithms=curve25519-sha256" in argv


def test_tool_run_must_exit_as_converged_and_print_json(tmp_path: Path) -> None:
    fleet = fleet_of(tmp_path, ["h001"])
    plan = Tool("plan")
    assert plan.problem(fleet, one_process("{}", 2, "drift")) == (
        "mgpu-provision plan exited 2, expected 0: drift"
    )
    assert plan.problem(fleet, one_process("Plan: nothing")) == (
        "mgpu-provision plan --json printed no JSON: 'Plan: nothing'"
    )
    assert plan.problem(fleet, one_process('{"hosts": {}}')) is None


def test_run_together_reports_output_exit_cpu_and_memory() -> None:
    code = "import sys; data = sys.stdin.read(); b = bytearray(40 << 20); print(data.upper()); sys.exit(3)"
    usage = run_together([Spawn((sys.executable, "-c", code), b"hi"), Spawn(("true",))])
    first, second = usage.processes
    assert (first.returncode, first.stdout, second.returncode) == (3, "HI\n", 0)
    assert first.peak_rss_kib > 40 << 10  # the 40 MiB buffer shows in the peak
    assert usage.peak_rss_kib == first.peak_rss_kib
    assert usage.cpu_s > 0


def test_peak_memory_is_the_clients_own_not_inherited_from_the_benchmark() -> None:
    ballast = bytearray(200 << 20)  # this process is now well over 200 MiB
    usage = run_together([Spawn(("true",))])
    assert usage.peak_rss_kib < 50 << 10
    del ballast


def test_time_report_parsing() -> None:
    assert parse_time_report("Command exited with non-zero status 3\n0.50 1.25 0.25 2048\n") == (1.5, 2048)
    with pytest.raises(ValueError, match="GNU time wrote no report"):
        parse_time_report("")


def test_run_together_starts_processes_at_once() -> None:
    sleeper = Spawn(("sleep", "0.5"))
    usage = run_together([sleeper] * 4)
    assert usage.wall_s < 1.5


def test_script_refuses_bad_arguments_with_a_message() -> None:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("fleet.py")), "--hosts", "1", "--contenders", "x"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: unknown contender(s) x; choose from ssh, facts, plan, ansible, ansible-raw"
    )


def test_profile_is_summed_per_function_not_per_line() -> None:
    raw = (
        "main (cli.py:10);build_plan (plan.py:5);render (envfiles.py:80) 3\n"
        "main (cli.py:10);build_plan (plan.py:7) 2\n"
        "Thread._bootstrap (threading.py:1002);read_all (packet.py:322) 5\n"
        "garbage line\n"
    )
    profile = collapse(raw)
    assert profile.samples == 10
    assert profile.inclusive["build_plan (plan.py)"] == 5
    assert profile.own["build_plan (plan.py)"] == 2
    assert profile.own["read_all (packet.py)"] == 5
    page = summary(profile, [("mgpu_provision.fleet.session", 196_000)], 64)
    assert " 50.0%  build_plan (plan.py)" in page
    assert "- mgpu_provision.fleet.session: 196 ms" in page


def test_import_bill_keeps_only_the_programs_own_imports() -> None:
    stderr = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       502 |      27235 |     invoke.context\n"
        "import time:      1104 |     139818 |   fabric.connection\n"
        "import time:     25435 |     195705 | mgpu_provision.fleet.session\n"
        "import time:        12 |         40 | json\n"
        "error: something else on stderr\n"
    )
    assert import_bill(stderr) == [("mgpu_provision.fleet.session", 195705), ("json", 40)]


def test_benchmark_end_to_end_on_two_hosts(tmp_path: Path) -> None:
    """The whole run on a tiny fleet: hosts, converge, every contender, results written."""
    reason = harness.harness_unavailable()
    if reason:
        pytest.skip(reason)
    contenders = "ssh,facts,plan" + (",ansible,ansible-raw" if DEFAULT_ANSIBLE.exists() else "")
    script = str(Path(__file__).with_name("fleet.py"))
    done = subprocess.run(
        [
            sys.executable,
            script,
            "--hosts",
            "1,2",
            "--repeat",
            "1",
            "--contenders",
            contenders,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "fleet.json").read_text())
    rows = {(r["hosts"], r["contender"]): r for r in results["rows"]}
    assert len(rows) == 2 * len(contenders.split(","))
    assert rows[(2, "ssh")]["vs_floor"] == 1.0
    # Converged and cached: exactly one login and one SSH command per host, for the floor and the tool.
    for name in ("ssh", "plan"):
        assert (rows[(2, name)]["logins_per_host"], rows[(2, name)]["commands_per_host"]) == (1.0, 1.0)
    assert "| 2 | plan |" in (tmp_path / "fleet.md").read_text()
