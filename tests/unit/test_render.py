"""The plan as people and programs read it: symbols, diffs, unreachable hosts, the totals line, JSON keys."""

from __future__ import annotations

import io
import json

import pytest

from mgpu_provision.commands.output import host_table, make_console
from mgpu_provision.commands.plan_view import plan_json, render_plan, summary_line, totals_line
from mgpu_provision.jobs.plan import FleetPlan, HostPlan
from mgpu_provision.plan.change import Change
from mgpu_provision.rig.nodesets import fold

DRIVER = Change(
    "driver",
    "update",
    "driver 535.161.08 → 550.54.15",
    "535.161.08",
    "550.54.15",
    reboot=True,
    agent_step={"kind": "driver"},
    phase="driver",
)
FILE = Change(
    "file:/etc/profile.d/mgpu-provision.sh",
    "create",
    "new file, 2 lines, mode 0644",
    None,
    "mode 0644",
    diff="--- /dev/null\n+++ /etc/profile.d/mgpu-provision.sh\n@@ -0,0 +1,2 @@\n+export A=1\n+export B=2\n",
    agent_step={"kind": "file"},
    phase="env",
)
LOOSE = Change("topology", "verify-failed", "GPU 1 link 2 is inactive: a loose bridge?", "NV3", "NV4")
REBOOT = Change(
    "reboot", "manual", "reboot required to load driver 550.54.15 (policy: never)", None, None, reboot=True
)


def fleet(*hosts: HostPlan) -> FleetPlan:
    return FleetPlan(hosts)


def drifted() -> FleetPlan:
    return fleet(
        HostPlan("gpu-a", "ok", (DRIVER, FILE, REBOOT)),
        HostPlan("gpu-b", "ok", (LOOSE,)),
        HostPlan("gpu-c", "unreachable", error="connection refused"),
        *(HostPlan(f"gpu-{n}", "ok") for n in "defgh"),
    )


def rendered(plan: FleetPlan) -> str:
    out = io.StringIO()
    render_plan(plan, make_console(file=out, width=60))
    return out.getvalue()


def test_totals_line_counts_changes_checks_manual_and_hosts() -> None:
    assert totals_line(drifted().totals) == (
        "Plan: 2 to change, 1 check failed, 1 manual, on 2 of 8 hosts (1 unreachable)"
    )


def test_totals_line_plurals_and_failed_hosts() -> None:
    plan = fleet(
        HostPlan("a", "ok", (LOOSE, LOOSE)),
        HostPlan("b", "failed", error="agent crashed"),
        HostPlan("c", "unreachable", error="timeout"),
    )
    assert totals_line(plan.totals) == (
        "Plan: 0 to change, 2 checks failed, on 1 of 3 hosts (1 unreachable, 1 failed)"
    )


def test_converged_fleet_says_no_changes_and_exits_0() -> None:
    plan = fleet(HostPlan("a", "ok"), HostPlan("b", "ok"))
    assert plan.converged and plan.exit_code == 0
    assert summary_line(plan) == "No changes. 2 hosts match the rig file."
    assert summary_line(fleet(HostPlan("a", "ok"))) == "No changes. 1 host matches the rig file."


def test_drift_failed_checks_and_unreachable_hosts_exit_2() -> None:
    assert drifted().exit_code == 2
    assert fleet(HostPlan("a", "ok", (LOOSE,))).exit_code == 2
    assert fleet(HostPlan("a", "unreachable", error="timeout")).exit_code == 2


def test_human_output_has_symbols_diffs_and_unreachable_hosts() -> None:
    text = rendered(drifted())
    lines = text.splitlines()
    assert "  ~ driver: driver 535.161.08 → 550.54.15 (reboot)" in lines
    path = "/etc/profile.d/mgpu-provision.sh"
    assert f"  + file:{path}: new file, 2 lines, mode 0644" in lines
    assert "      +export A=1" not in lines  # a new file's content only with --diff
    assert "  ! topology: GPU 1 link 2 is inactive: a loose bridge?" in lines
    assert "  ? reboot: reboot required to load driver 550.54.15 (policy: never)" in lines
    assert "gpu-c: unreachable: connection refused" in lines
    assert "no changes on 5 hosts: gpu-d, gpu-e, gpu-f, gpu-g, gpu-h" in lines
    assert lines[-1] == "Plan: 2 to change, 1 check failed, 1 manual, on 2 of 8 hosts (1 unreachable)"


@pytest.mark.parametrize(
    ("names", "shown"),
    [
        ([f"gpu-{n:03d}" for n in range(1, 63)], "gpu-[001-062]"),
        (["gpu-001", "gpu-002", "gpu-004", "login", "gpu-005"], "gpu-[001-002,004-005], login"),
        (["a1", "a10", "a2"], "a[1-2,10]"),  # ClusterShell: unpadded numbers run on across widths
        (["hgx-7"], "hgx-7"),
    ],
)
def test_host_names_fold_into_ranges(names: list[str], shown: str) -> None:
    assert fold(names) == shown


def test_a_fleet_with_the_same_drift_reads_in_a_screenful_and_the_odd_host_stands_out() -> None:
    files = [
        Change(f"file:/etc/{n}", "update", "content differs", "x", "y", diff="-a\n+b\n", phase="env")
        for n in ("profile.d/mgpu-provision.sh", "mgpu-provision/environment")
    ]
    hosts = [HostPlan(f"gpu-{n:03d}", "ok", (*files, DRIVER)) for n in range(1, 65)]
    hosts[16] = HostPlan("gpu-017", "ok", (*files, DRIVER, LOOSE))
    text = rendered(fleet(*hosts))
    lines = text.splitlines()
    assert len(lines) <= 10, text
    assert "  ~ file:/etc/mgpu-provision/environment: content differs  on 64 hosts: gpu-[001-064]" in lines
    assert lines[lines.index("gpu-017") + 1] == "  ! topology: GPU 1 link 2 is inactive: a loose bridge?"
    assert "-a" not in text  # diffs on a fleet only with --diff
    out = io.StringIO()
    render_plan(fleet(*hosts), make_console(file=out, width=60), new_content=True)
    assert out.getvalue().count("      -a") == 2  # each distinct diff once, not once per host


def test_the_first_plan_of_a_new_fleet_groups_files_whose_header_names_the_host() -> None:
    path = "/etc/mgpu-provision/environment"

    def new_env(host: str) -> Change:
        diff = f"--- /dev/null\n+++ {path}\n+# managed by mgpu-provision for {host}\n+A=1\n"
        summary = "new file, 2 lines, mode 0644"
        return Change(f"file:{path}", "create", summary, None, None, diff=diff, phase="env")

    hosts = [HostPlan(f"gpu-{n:02d}", "ok", (new_env(f"gpu-{n:02d}"),)) for n in range(1, 19)]
    lines = rendered(fleet(*hosts)).splitlines()
    assert lines[0] == f"  + file:{path}: new file, 2 lines, mode 0644  on 18 hosts: gpu-[01-18]"
    assert len(lines) == 2, lines  # the change and the totals, not a line per host
    out = io.StringIO()
    render_plan(fleet(*hosts), make_console(file=out), new_content=True)
    diffs = out.getvalue().splitlines()  # with --diff: the content once, its host line naming no one host
    assert diffs.count("      +A=1") == 1, diffs
    assert "      +# managed by mgpu-provision for <host>" in diffs and "gpu-07" not in "".join(diffs[1:])


def test_a_new_file_with_another_content_on_some_hosts_shows_each_content_once_under_its_hosts() -> None:
    path = "/etc/mgpu-provision/environment"

    def new_env(host: str, value: str) -> Change:
        diff = f"--- /dev/null\n+++ {path}\n+# Rig r, host {host}.\n+A={value}\n"
        return Change(f"file:{path}", "create", "new file, 2 lines", None, None, diff=diff, phase="env")

    names = [f"gpu-{n:02d}" for n in range(1, 9)]
    hosts = [HostPlan(name, "ok", (new_env(name, "2" if name > "gpu-06" else "1"),)) for name in names]
    out = io.StringIO()
    render_plan(fleet(*hosts), make_console(file=out), new_content=True)
    lines = out.getvalue().splitlines()
    assert lines.count("    on gpu-[01-06]:") == 1 and lines.count("    on gpu-[07-08]:") == 1, lines
    assert lines.count("      +A=1") == 1 and lines.count("      +A=2") == 1
    assert lines.count("      +# Rig r, host <host>.") == 2


def test_long_lines_are_not_wrapped_when_piped() -> None:
    long = Change("file:/x", "update", "update /x (content)", None, None, diff="+" + "y" * 200 + "\n")
    text = rendered(fleet(HostPlan("a", "ok", (long,))))
    assert "      +" + "y" * 200 in text.splitlines()


def test_json_schema_keys_are_stable() -> None:
    doc = json.loads(json.dumps(plan_json(drifted())))
    assert doc["format_version"] == 1
    assert doc["exit_code"] == 2 and doc["converged"] is False
    assert doc["totals"] == {
        "to_change": 2,
        "checks_failed": 1,
        "warnings": 0,
        "manual": 1,
        "hosts_with_changes": 2,
        "hosts": 8,
        "unreachable": 1,
        "failed": 0,
    }
    assert list(doc["hosts"]) == ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e", "gpu-f", "gpu-g", "gpu-h"]
    assert doc["hosts"]["gpu-c"] == {
        "status": "unreachable",
        "error": "connection refused",
        "simulated": None,  # never read
        "control_machine": None,
        "changes": [],
    }
    driver = doc["hosts"]["gpu-a"]["changes"][0]
    assert driver == {
        "resource": "driver",
        "action": "update",
        "summary": "driver 535.161.08 → 550.54.15",
        "current": "535.161.08",
        "desired": "550.54.15",
        "reboot": True,
        "diff": None,
        "severity": "drift",
        "tags": ["driver"],
        "phase": "driver",
        "applies": True,
    }
    assert doc["hosts"]["gpu-a"]["changes"][2]["applies"] is False


def test_host_table_colours_status_and_fills_missing_cells() -> None:
    rows = {"gpu-a": {"status": "ok", "changed": 2}, "gpu-b": {"status": "failed"}}
    table = host_table(rows, ["status", "changed"])
    out = io.StringIO()
    make_console(file=out, width=60).print(table)
    lines = [[cell for cell in line.split() if cell != "│"] for line in out.getvalue().splitlines()]
    assert ["gpu-a", "ok", "2"] in lines
    assert ["gpu-b", "failed"] in lines
    status_cells = table.columns[1]._cells
    assert [c.style for c in status_cells] == ["green", "red"]


def test_diff_shows_the_content_of_new_files() -> None:
    out = io.StringIO()
    render_plan(drifted(), make_console(file=out, width=60), new_content=True)
    assert "      +export A=1" in out.getvalue().splitlines()


def test_control_characters_in_a_diff_are_shown_never_sent_to_the_terminal() -> None:
    diff = '--- /etc/x\n+++ /etc/x\n@@ -1 +1 @@\n-A=1\n+A="\x1b]0;owned\x07\x1b[31mred\rback\x85"\n'
    change = Change("file:/etc/x", "update", "content differs", None, None, diff=diff, phase="env")
    out = rendered(fleet(HostPlan("gpu-a", "ok", (change,))))
    assert not set(out) & {"\x1b", "\x07", "\r", "\x85"}
    assert '      +A="\\x1b]0;owned\\x07\\x1b[31mred\\x0dback\\x85"' in out.splitlines()


def test_a_delete_is_shown_with_minus_and_counted_as_a_change() -> None:
    path = "/etc/X11/xorg.conf.d/20-mgpu-provision.conf"
    delete = Change(
        f"file:{path}",
        "delete",
        f"remove {path} (SLI Off is the driver default)",
        "mode 0644, sha256 0123456789ab",
        None,
        agent_step={"kind": "remove", "path": path},
        phase="sli",
    )
    plan = fleet(HostPlan("gpu-a", "ok", (delete,)))
    assert f"  - file:{path}: remove {path} (SLI Off is the driver default)" in rendered(plan).splitlines()
    assert plan.totals.to_change == 1 and plan.exit_code == 2
