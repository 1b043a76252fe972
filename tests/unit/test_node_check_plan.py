"""What plan and apply do about the node check (plan/resources/node_check.py): install it where the rig
asks, the expectations being plan's own, restart a running timer whose units change, remove it all where
the rig stops asking; and the rig's rules on the `node_check:` section."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.errors import ProvisionError
from mgpu_provision.facts import Facts
from mgpu_provision.judge.records import expectation_from_json
from mgpu_provision.plan.host import expectation_of, facts_request, host_context, plan_host
from mgpu_provision.plan.resources import node_check
from mgpu_provision.rig import LoadedRig, load_rig
from tests.support.factories import facts
from tests.support.hosts import skip_or_fail

RIG = """\
version: 1
hosts:
  - {name: gpu-a, address: 10.0.0.11, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
"""
CHECK = "node_check: {interval: 5min, deadline_s: 40, textfile_dir: /var/lib/prometheus/node-exporter}\n"
AGENT, EXPECTATIONS = "/usr/local/lib/mgpu-provision/agent.pyz", "/etc/mgpu-provision/expectation.json"
COMMAND = "/usr/local/bin/mgpu-provision-check"
SERVICE, TIMER = (
    "/etc/systemd/system/mgpu-provision-check.service",
    "/etc/systemd/system/mgpu-provision-check.timer",
)
DIGEST = "ab" * 32


def load(tmp_path: Path, text: str) -> LoadedRig:
    (tmp_path / "rig.yaml").write_text(text)
    return load_rig(tmp_path / "rig.yaml")


def box(files: dict[str, str] | None = None, timer: dict[str, Any] | None = None, **more: Any) -> Facts:
    described = [
        {
            "path": p,
            "exists": True,
            "sha256": hashlib.sha256(c.encode()).hexdigest(),
            "mode": "0755" if p == COMMAND else "0644",
            "content": c,
        }
        for p, c in (files or {}).items()
    ]
    units = {"mgpu-provision-check.timer": timer} if timer is not None else {}
    return facts(agent_digest=DIGEST, files=described, units=units, **more)


def check_changes(loaded: LoadedRig, have: Facts) -> list[tuple[str, str, str | None]]:
    return [
        (c.resource, c.action, c.agent_step and c.agent_step["kind"])
        for c in plan_host(loaded, loaded.host("gpu-a"), have)
        if "mgpu-provision-check" in c.resource or c.resource in (f"file:{AGENT}", f"file:{EXPECTATIONS}")
    ]


def test_a_rig_that_asks_installs_the_agent_expectations_command_and_an_enabled_timer(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG + CHECK)
    have = box(timer={"service": "inactive", "enabled": False})
    assert check_changes(loaded, have) == [
        (f"file:{AGENT}", "create", "agent"),
        (f"file:{EXPECTATIONS}", "create", "file"),
        (f"file:{COMMAND}", "create", "file"),
        (f"file:{SERVICE}", "create", "file"),
        (f"file:{TIMER}", "create", "file"),
        ("service:mgpu-provision-check.timer", "update", "service"),
    ]
    host = loaded.host("gpu-a")
    steps = {c.resource: c.agent_step for c in plan_host(loaded, host, have) if c.agent_step}
    assert steps[f"file:{AGENT}"] == {"kind": "agent", "path": AGENT, "sha256": DIGEST}
    # The expectations are plan's own for this host, as the judge reads them back on the node.
    written = json.loads(steps[f"file:{EXPECTATIONS}"]["content"])  # type: ignore[index]
    assert expectation_from_json(written) == expectation_of(loaded, host, have)
    command = steps[f"file:{COMMAND}"]
    assert command is not None and command["mode"] == "0755"
    assert (
        command["content"]
        .splitlines()[-1]
        .endswith(
            f"{AGENT} --expectations {EXPECTATIONS} --deadline 40 --lock /var/lib/mgpu-provision/check.lock "
            '--textfile-dir /var/lib/prometheus/node-exporter "$@"'
        )
    )
    timer = steps[f"file:{TIMER}"]["content"]  # type: ignore[index]
    assert "OnUnitActiveSec=5min\n" in timer and "OnActiveSec=60s\n" in timer
    assert "mgpu-provision-check.timer" in facts_request(loaded, host)["units"]


def test_an_installed_check_plans_nothing_and_a_changed_timer_restarts(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG + CHECK)
    host = loaded.host("gpu-a")
    first = box(timer={"service": "inactive", "enabled": False})
    wanted = {
        c.agent_step["path"]: c.agent_step["content"]
        for c in plan_host(loaded, host, first)
        if c.agent_step and c.agent_step["kind"] == "file" and "mgpu-provision" in c.agent_step["path"]
    }
    installed = box(dict(wanted), timer={"service": "active", "enabled": True})
    installed.files.append(
        installed.files[0].model_copy(update={"path": AGENT, "sha256": DIGEST, "content": None})
    )
    assert check_changes(loaded, installed) == []
    faster = load(tmp_path, RIG + CHECK.replace("5min", "30s"))
    assert check_changes(faster, installed) == [
        (f"file:{TIMER}", "update", "file"),
        ("service:mgpu-provision-check.timer", "update", "service"),  # stopped, on the old unit
        ("service:mgpu-provision-check.timer", "update", "service"),  # started on the new one
    ]
    restart = [c.agent_step for c in plan_host(faster, host, installed) if c.resource.startswith("service:")]
    assert [(s["enable"], s["start"]) for s in restart if s] == [(False, False), (True, True)]


def test_a_rig_that_stops_asking_disables_the_timer_then_removes_every_file(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG)
    left = box({p: "x\n" for p in (AGENT, EXPECTATIONS, COMMAND, SERVICE, TIMER)})
    assert check_changes(loaded, left) == [
        ("service:mgpu-provision-check.timer", "update", "service"),
        *[(f"file:{p}", "delete", "remove") for p in (AGENT, EXPECTATIONS, COMMAND, SERVICE, TIMER)],
    ]
    assert check_changes(loaded, box()) == []
    # No systemctl call for a check the rig does not ask for: its timer's file says whether one is left.
    assert "mgpu-provision-check.timer" not in facts_request(loaded, loaded.host("gpu-a"))["units"]


def test_no_timer_without_an_interval_and_none_on_a_box_without_systemd(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG + CHECK.replace("5min", "null"))
    planned = check_changes(loaded, box({SERVICE: "x\n"}, timer={"service": "inactive", "enabled": False}))
    assert [r for r, _, _ in planned] == [
        f"file:{AGENT}",
        f"file:{EXPECTATIONS}",
        f"file:{COMMAND}",
        f"file:{SERVICE}",
    ]
    assert planned[-1][1] == "delete"
    no_systemd = check_changes(
        load(tmp_path, RIG + CHECK), box(timer={"service": "unknown", "enabled": None})
    )
    assert [r for r, _, _ in no_systemd] == [f"file:{AGENT}", f"file:{EXPECTATIONS}", f"file:{COMMAND}"]


def test_an_agent_run_from_a_source_tree_is_a_manual_step(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG + CHECK)
    have = box(timer={"service": "inactive", "enabled": False}).model_copy(update={"agent_digest": None})
    assert check_changes(loaded, have)[0] == (f"file:{AGENT}", "manual", None)


@pytest.mark.parametrize(
    ("section", "words"),
    [
        (
            "{interval: 5min}\nfiles: {systemd_dir: null}",
            "node_check.interval: a timer needs files.systemd_dir",
        ),
        ("{textfile_dir: var/prom}", "node_check.textfile_dir: 'var/prom' must be an absolute path"),
        ("{command: /usr/local/../bin/x}", "node_check.command: '/usr/local/../bin/x' contains '..'"),
        ("{deadline_s: 60}", "deadline_s"),
        ("{interval: 5 minutes}", "interval"),
    ],
)
def test_the_rules_on_the_section(tmp_path: Path, section: str, words: str) -> None:
    with pytest.raises(ProvisionError) as raised:
        load(tmp_path, RIG + f"node_check: {section}\n")
    assert words in str(raised.value)


def test_systemd_reads_the_service_and_timer_without_a_complaint(tmp_path: Path) -> None:
    checker = shutil.which("systemd-analyze")
    if checker is None:
        skip_or_fail("systemd-analyze is not installed (apt-get install systemd)")
    loaded = load(tmp_path, RIG + CHECK)
    host = loaded.host("gpu-a")
    units = {Path(f.path).name: f.content for f in node_check.desired(host_context(loaded, host, box()))}
    stand_in = tmp_path / "check"  # verify also checks that ExecStart's program exists
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    for name in ("mgpu-provision-check.service", "mgpu-provision-check.timer"):
        (tmp_path / name).write_text(units[name].replace(COMMAND, str(stand_in)))
    paths = [str(tmp_path / "mgpu-provision-check.timer"), str(tmp_path / "mgpu-provision-check.service")]
    run = subprocess.run([str(checker), "verify", *paths], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout + run.stderr) == (0, "")
