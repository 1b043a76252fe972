"""`reclaim --via clush` end to end: ClusterShell runs the real agent's `reclaim` and `facts` over OpenSSH on
real sshd test hosts, with real leftover processes (multiprocessing spawn workers whose script was
SIGKILLed) and a live job listed in each host's twin as GPU memory holders.

The clush run's JSON must be the Fabric run's (same processes, same verdicts, same exit code), dry run and
after `--yes`; `--yes` through ClusterShell ends exactly the leftovers, checks with fresh facts that they are
gone, and logs in once per host and phase (one worker for the whole fleet's `reclaim`, one for `facts`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.cli import main
from tests.support.hosts import HostFactory, TestHost
from tests.support.reclaim_programs import SLEEP, alive, background, spawn_leftovers, twin_with, wait_until

pytest.importorskip("ClusterShell", reason="the clush extra is not installed")
pytestmark = pytest.mark.e2e


def reclaim(
    capsys: pytest.CaptureFixture[str], rig: Path, known: Path, *flags: str
) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["reclaim", str(rig), "--known-hosts", str(known), "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def but_the_dead_error(doc: dict[str, Any], dead: str) -> dict[str, Any]:
    """The document with the dead host's error left out: OpenSSH and Paramiko word a refusal each their
    own way (both name the host and the refusal: checked apart)."""
    hosts = {n: {**h, "error": None} if n == dead else h for n, h in doc["hosts"].items()}
    return {**doc, "hosts": hosts}


def logins(hosts: list[TestHost]) -> dict[str, int]:
    return {h.name: h.log().count("Accepted publickey") for h in hosts}


def test_reclaim_via_clush_is_the_fabric_reclaim(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = [test_hosts.start("gpu-001"), test_hosts.start("gpu-002")]
    started: list[int] = []
    try:
        leftovers: dict[str, list[int]] = {}
        live: dict[str, int] = {}
        for host in hosts:
            script_pid, leftovers[host.name] = spawn_leftovers(host, tmp_path, "left", SLEEP, 2)
            live[host.name] = background(host, "setsid sleep 300")  # its own job: kept by `orphans`
            started += [script_pid, live[host.name], *leftovers[host.name]]
            first, second = leftovers[host.name]
            host.set_twin(twin_with([(first, 0, 1000), (second, 1, 1000), (live[host.name], 0, 500)]))
        dead = {"name": "gpu-003", "address": test_hosts.dead_address(), "rig": "dead"}
        rig = test_hosts.write_rig(
            tmp_path / "rig.yaml", hosts, extra_hosts=[dead], reclaim={"policy": "orphans", "grace_s": 1}
        )
        known = test_hosts.known_hosts

        # First contact through ClusterShell: each host answers 97 and gets the agent.
        code, clush = reclaim(capsys, rig, known, "--via", "clush")
        assert code == 2
        code, fabric = reclaim(capsys, rig, known)
        assert code == 2
        assert but_the_dead_error(clush, "gpu-003") == but_the_dead_error(fabric, "gpu-003")
        for doc in (clush, fabric):
            assert doc["hosts"]["gpu-003"]["status"] == "unreachable"
            assert "gpu-003 (" in doc["hosts"]["gpu-003"]["error"], doc["hosts"]["gpu-003"]
            assert "connection refused" in doc["hosts"]["gpu-003"]["error"].lower(), doc["hosts"]["gpu-003"]
        would = {(name, p["pid"]): p["action"] for name, h in clush["hosts"].items() for p in h["processes"]}
        assert would == {
            **{(n, pid): "would-end" for n, pids in leftovers.items() for pid in pids},
            **{(n, pid): "keep" for n, pid in live.items()},
        }

        before = logins(hosts)
        code, done = reclaim(capsys, rig, known, "--via", "clush", "--yes", "--limit", "gpu-[001-002]")
        assert code == 0, done
        assert logins(hosts) == {h: before[h] + 2 for h in before}  # reclaim, facts
        ended = {(name, p["pid"]): p["action"] for name, h in done["hosts"].items() for p in h["processes"]}
        assert ended == {key: "ended" if action == "would-end" else action for key, action in would.items()}
        assert done["freed_mib"] == 4000
        wait_until("the leftovers to go", lambda: not any(alive(p) for ps in leftovers.values() for p in ps))
        assert all(alive(pid) for pid in live.values())

        # The twins still list the ended pids: both engines now see them gone and end nothing more.
        code, clush_again = reclaim(capsys, rig, known, "--via", "clush", "--yes")
        assert code == 2  # the dead host
        code, fabric_again = reclaim(capsys, rig, known, "--yes")
        assert but_the_dead_error(clush_again, "gpu-003") == but_the_dead_error(fabric_again, "gpu-003")
        assert clush_again["freed_mib"] == 0
    finally:
        for pid in started:
            if alive(pid):
                hosts[0].run_in_ns(f"kill -9 {pid}", check=False)
