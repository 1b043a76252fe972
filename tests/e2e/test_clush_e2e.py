"""`--via clush` end to end: ClusterShell runs the real agent over OpenSSH on real sshd test hosts.

plan through ClusterShell must give the plan the Fabric path gives (same hosts, same changes), upload the
agent where it is missing (exit 97) on first contact, and keep a dead host `unreachable` with ssh's reason
while the others answer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision.cli import main
from tests.support.factories import pair_rig_file, rtx3090_twin
from tests.support.hosts import HostFactory, load_twin

pytest.importorskip("ClusterShell", reason="the clush extra is not installed")
pytestmark = pytest.mark.e2e

RIG = {
    "pair": {
        "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
        "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
        "driver": {"version": "550.54.15", "reboot": "never"},
    }
}


def twin(driver: str | None = None) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(load_twin("rtx3090-nvlink"))
    if driver:
        loaded["driver"] = {"version": driver, "loaded": driver, "cuda": "12.2"}
    return loaded


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out)


def changes(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        name: (
            entry["status"],
            [(c["resource"], c["action"], c["summary"]) for c in entry.get("changes", [])],
        )
        for name, entry in doc["hosts"].items()
    }


def test_plan_via_clush_is_the_fabric_plan(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = [
        test_hosts.start("gpu-001", twin(), rig="pair"),
        test_hosts.start("gpu-002", twin(), rig="pair"),
        test_hosts.start("gpu-003", twin("535.161.08"), rig="pair"),
    ]
    dead = {"name": "gpu-004", "address": test_hosts.dead_address(), "rig": "pair"}
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", hosts, rigs=RIG, extra_hosts=[dead])
    known = str(test_hosts.known_hosts)

    # First contact through ClusterShell: no agent on any host yet, so each answers 97 and gets one.
    code, clush = cli_json(capsys, "plan", str(rig), "--known-hosts", known, "--json", "--via", "clush")
    assert code == 2
    for host in hosts:
        assert host.run_in_ns("ls ~/.cache/mgpu-provision").stdout.strip(), host.name
    code, fabric = cli_json(capsys, "plan", str(rig), "--known-hosts", known, "--json")
    assert code == 2
    assert changes(clush) == changes(fabric)
    assert clush["totals"] == fabric["totals"]
    assert ("driver", "update") in [c[:2] for c in changes(clush)["gpu-003"][1]]  # its old driver
    assert "driver" not in [c[0] for c in changes(clush)["gpu-001"][1]]
    assert clush["hosts"]["gpu-004"]["status"] == "unreachable"
    assert "Connection refused" in clush["hosts"]["gpu-004"]["error"], clush["hosts"]["gpu-004"]
    assert "gpu-004 (" in clush["hosts"]["gpu-004"]["error"]

    # One OpenSSH login per host for the whole run (the agent is cached now): ClusterShell's one worker.
    before = {h.name: h.log().count("Accepted publickey") for h in hosts}
    code, facts = cli_json(
        capsys,
        "facts",
        str(rig),
        "--known-hosts",
        known,
        "--json",
        "--via",
        "clush",
        "--limit",
        "gpu-[001-003]",
    )
    assert code == 0
    assert {name: entry["status"] for name, entry in facts["hosts"].items()} == dict.fromkeys(
        ["gpu-001", "gpu-002", "gpu-003"], "ok"
    )
    assert facts["hosts"]["gpu-003"]["facts"]["driver"]["version"] == "535.161.08"
    assert {h.name: h.log().count("Accepted publickey") - before[h.name] for h in hosts} == dict.fromkeys(
        ["gpu-001", "gpu-002", "gpu-003"], 1
    )


def test_refused_key_and_silent_sshd_each_fail_alone(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host key not in known_hosts is refused (StrictHostKeyChecking=yes), an sshd that never sends its
    banner times out after --timeout: each its own host's `unreachable`, with OpenSSH's words."""
    good = test_hosts.start("gpu-001", twin(), rig="pair")
    stranger = test_hosts.start("gpu-002", twin(), rig="pair")
    silent_sshd = test_hosts.silent_server()
    silent = {"name": "gpu-003", "address": silent_sshd.address, "port": silent_sshd.port, "rig": "pair"}
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [good, stranger], rigs=RIG, extra_hosts=[silent])
    known = tmp_path / "known_hosts"
    known.write_text(good.known_hosts_line + "\n")
    code, doc = cli_json(
        capsys, "facts", str(rig), "--known-hosts", str(known), "--json", "--via", "clush", "--timeout", "1"
    )
    assert code == 2
    hosts = doc["hosts"]
    assert hosts["gpu-001"]["status"] == "ok"
    assert hosts["gpu-002"]["status"] == "unreachable"
    assert "Host key verification failed" in hosts["gpu-002"]["error"], hosts["gpu-002"]
    assert hosts["gpu-003"]["status"] == "unreachable"
    assert "timed out" in hosts["gpu-003"]["error"], hosts["gpu-003"]


def recap_of(doc: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """An apply --json document with its hosts renamed by `names`, without the times and the written
    files' hashes (each fleet's env files name its own DDP master)."""
    hosts = {
        names[name]: {
            **{key: value for key, value in entry.items() if key != "elapsed_s"},
            "done": [re.sub(r" \(sha256 [0-9a-f]+…\)", "", line) for line in entry["done"]],
        }
        for name, entry in doc["hosts"].items()
    }
    return {**doc, "hosts": hosts}


def test_apply_via_clush_converges_as_the_fabric_apply_does(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two twin fleets, each a box on an old driver (install, reboot) and one with persistence off: apply
    through ClusterShell converges its fleet with the recap the Fabric path gives the other, word for word
    (but the times), and a second apply through it finds nothing to do."""
    fleets = {}
    for via in ("clush", "fabric"):
        hosts = [
            test_hosts.start(f"{via}-1", rtx3090_twin("535.161.08", (True, True)), rig="pair"),
            test_hosts.start(f"{via}-2", rtx3090_twin(persistence=(True, False)), rig="pair"),
        ]
        fleets[via] = (hosts, pair_rig_file(test_hosts, tmp_path / f"{via}.yaml", hosts))
    known = str(test_hosts.known_hosts)

    def apply(via: str, *more: str) -> tuple[int, dict[str, Any]]:
        rig = str(fleets[via][1])
        return cli_json(capsys, "apply", rig, "--known-hosts", known, "--json", "--yes", "--via", via, *more)

    code, clush = apply("clush")
    assert code == 0, clush
    code, fabric = apply("fabric")
    assert code == 0, fabric
    same = recap_of(fabric, {"fabric-1": "clush-1", "fabric-2": "clush-2"})
    assert recap_of(clush, {"clush-1": "clush-1", "clush-2": "clush-2"}) == same
    assert clush["hosts"]["clush-1"]["rebooted"] and not clush["hosts"]["clush-2"]["rebooted"]
    assert {n: h["status"] for n, h in clush["hosts"].items()} == {"clush-1": "changed", "clush-2": "changed"}

    hosts = fleets["clush"][0]
    before = {h.name: h.log().count("Accepted publickey") for h in hosts}
    code, again = apply("clush")
    assert code == 0 and {h["status"] for h in again["hosts"].values()} == {"ok"}, again
    # Nothing to do: the plan's facts, one login a host.
    assert {h.name: h.log().count("Accepted publickey") - before[h.name] for h in hosts} == dict.fromkeys(
        before, 1
    )
