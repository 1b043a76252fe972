"""The node check's timer under real systemd (PID 1 of the real-systemd test host,
tests/support/systemd_host.py): the agent's own `apply`, with the steps plan makes, writes the check's files
and enables and starts the timer through the real systemctl; the timer fires the service again and again, and
the service runs the check, whose .prom file shows each run. The box has no GPU, so a drop-in points the
check at a twin."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from mgpu_provision import protocol
from mgpu_provision.facts import Facts
from mgpu_provision.fleet.bundle import build_agent
from mgpu_provision.plan.host import facts_request, plan_host
from mgpu_provision.plan.resources import node_check
from mgpu_provision.rig import load_rig
from tests.support.factories import rtx3090_twin
from tests.support.systemd_host import SystemdHost

TEXTFILE = "/var/lib/prometheus/node-exporter"
APPLIED_KINDS = {protocol.FILE, protocol.AGENT, protocol.SERVICE, protocol.REMOVE}


def put(host: SystemdHost, path: str, data: bytes) -> None:
    argv = ["nsenter", "-t", str(host.pid1()), "-m", "-u", "-i", "-p", "--", "chroot", str(host.merged)]
    subprocess.run([*argv, "sh", "-c", f"mkdir -p $(dirname {path}) && cat > {path}"], input=data, check=True)


def agent(host: SystemdHost, path: str, verb: str, request: dict[str, Any]) -> dict[str, Any]:
    put(host, "/root/request.json", json.dumps(request).encode())
    done = host.run(f"python3 -S -I {path} {verb} < /root/request.json")
    reply: dict[str, Any] = json.loads(done.stdout)
    assert reply["ok"], reply
    return reply["result"]


def test_the_timer_fires_the_service_and_the_service_runs_the_check(
    booted_host: SystemdHost, tmp_path: Path
) -> None:
    host = booted_host
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "version: 1\nhosts: [{name: sd-host, address: 127.0.0.1, rig: pair}]\n"
        "rigs: {pair: {gpus: {model: NVIDIA GeForce RTX 3090, count: 2}}}\n"
        f"node_check: {{interval: 2s, deadline_s: 20, textfile_dir: {TEXTFILE}}}\n"
    )
    loaded = load_rig(rig)
    bundle = build_agent(tmp_path / "bundles")
    uploaded = f"/root/.cache/mgpu-provision/{bundle.name}"
    put(host, uploaded, bundle.data)
    host.run(f"mkdir -p {TEXTFILE}")
    put(host, "/root/twin.json", json.dumps(rtx3090_twin()).encode())
    dropin = "[Service]\nEnvironment=MGPU_PROVISION_SIMULATE=/root/twin.json\n"
    put(host, f"/etc/systemd/system/{node_check.SERVICE}.d/twin.conf", dropin.encode())

    sd = loaded.host("sd-host")
    facts = Facts.model_validate(agent(host, uploaded, "facts", {"args": facts_request(loaded, sd)}))
    assert facts.agent_digest == bundle.digest
    steps = [
        c.agent_step
        for c in plan_host(loaded, sd, facts)
        if c.agent_step and c.agent_step["kind"] in APPLIED_KINDS
    ]
    assert protocol.service_step(node_check.TIMER, True, True) in steps
    request = protocol.apply_request("/var/lib/mgpu-provision/apply.lock", 10, steps, False)
    results = agent(host, uploaded, "apply", {"args": request})["results"]
    assert [r["error"] for r in results] == [None] * len(steps), results

    assert host.systemctl("is-enabled", node_check.TIMER) == "enabled"
    assert host.systemctl("is-active", node_check.TIMER) == "active"
    runs: set[str] = set()
    deadline = time.monotonic() + 30
    while len(runs) < 2 and time.monotonic() < deadline:
        text = host.run(f"cat {TEXTFILE}/mgpu-provision-check.prom").stdout
        found = re.search(r"^mgpu_provision_check_last_run_timestamp_seconds (\S+)$", text, re.MULTILINE)
        if found:
            runs.add(found.group(1))
            assert "mgpu_provision_check_exit_code 0\n" in text, text
        time.sleep(0.5)
    why = host.run(f"systemctl list-timers --no-pager; systemctl status --no-pager {node_check.SERVICE}")
    assert len(runs) >= 2, why.stdout + why.stderr
    assert host.systemctl("show", "-p", "Result", "--value", node_check.SERVICE) == "success"
    journal = host.run(f"journalctl -u {node_check.SERVICE} --no-pager").stdout
    assert re.search(r"OK: \S+ is healthy and as the rig says", journal), journal
