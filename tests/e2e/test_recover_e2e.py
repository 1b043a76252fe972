"""`recover` end to end on SSH test hosts with twins: a GPU whose Xid asks for a reset is reset and checked
again; a reset that fails falls back to a (simulated) reboot of the test host under the rig's policy; a GPU
still held when the wait ends is reset by nothing and the host is left as it was. Without --yes nothing
changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import cli
from mgpu_provision.node.verbs.resets import RESET_FILE
from tests.support.factories import pair_rig_file, rtx3090_twin
from tests.support.hosts import MANAGED_DIRS, HostFactory, TestHost

pytestmark = pytest.mark.e2e


def sick(xid: int, **health: Any) -> dict[str, Any]:
    twin = rtx3090_twin(persistence=(True, True))
    twin["gpus"][1]["health"] = {"xid": [xid], **health}
    return twin


def reset_record(host: TestHost) -> Path:
    return host.dir / "managed" / str(MANAGED_DIRS.index("/var/lib/mgpu-provision")) / RESET_FILE


def boot_id(host: TestHost) -> str | None:
    state = host.twin_state_path  # the twin's overlay, in the host's own state folder
    found: str | None = json.loads(state.read_text()).get("boot_id") if state.exists() else None
    return found


def recover(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main(["recover", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_recover_resets_reboots_when_the_reset_fails_and_leaves_a_held_gpu_alone(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resets = test_hosts.start("gpu-a", sick(119), rig="pair")  # GSP RPC timeout: RESET_GPU
    fails = test_hosts.start("gpu-b", sick(95, reset="fails"), rig="pair")  # uncontained: reset, which fails
    held = sick(62)
    held["processes"] = [{"pid": 4242, "gpu": 1, "used_mib": 2000}]
    busy = test_hosts.start("gpu-c", held, rig="pair")
    hosts = [resets, fails, busy]
    rig = str(pair_rig_file(test_hosts, tmp_path / "rig.yaml", hosts, reboot="allowed"))
    known = ["--known-hosts", str(test_hosts.known_hosts)]

    code, dry = recover(capsys, rig, *known)
    assert code == 0, dry
    assert {name: h["status"] for name, h in dry["hosts"].items()} == dict.fromkeys(
        hosts_names(hosts), "would-recover"
    )
    assert [s["step"] for s in dry["hosts"]["gpu-a"]["steps"]] == ["judge", "reset", "check"]
    assert "would reset GPU 1" in dry["hosts"]["gpu-a"]["steps"][1]["words"]
    assert not any(reset_record(h).exists() for h in hosts) and boot_id(fails) is None  # nothing changed

    code, done = recover(capsys, rig, *known, "--yes", "--wait", "2")
    assert code == 2, done  # gpu-c is still held
    a, b, c = (done["hosts"][h.name] for h in hosts)
    assert (a["status"], [s["step"] for s in a["steps"]]) == ("recovered", ["judge", "reset", "check"]), a
    assert a["steps"][1] == {"step": "reset", "ok": True, "words": "GPU 1 reset"}
    assert reset_record(resets).exists()
    assert b["status"] == "recovered", b
    assert [(s["step"], s["ok"]) for s in b["steps"]] == [
        ("judge", True),
        ("reset", False),
        ("reboot", True),
        ("check", True),
    ]
    assert boot_id(fails) is not None  # the simulated reboot gave the test host a new boot id
    assert c["status"] == "failed" and c["steps"][-1]["step"] == "reset", c
    assert "still held after" in c["steps"][-1]["words"] and "pid 4242" in c["steps"][-1]["words"]
    assert not reset_record(busy).exists() and boot_id(busy) is None  # nothing changed on it

    # Afterwards the checks agree: the recovered hosts have nothing left to recover.
    code, again = recover(capsys, rig, *known, "--limit", "gpu-a,gpu-b")
    assert code == 0 and all(h["status"] == "healthy" for h in again["hosts"].values()), again


def test_recover_reboot_needed_under_policy_never_is_said_not_done(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = test_hosts.start("gpu-a", sick(79), rig="pair")  # fallen off the bus: RESTART_BM
    rig = str(pair_rig_file(test_hosts, tmp_path / "rig.yaml", [host], reboot="never"))
    code, done = recover(capsys, rig, "--known-hosts", str(test_hosts.known_hosts), "--yes")
    assert code == 2
    last = done["hosts"]["gpu-a"]["steps"][-1]
    assert last["step"] == "reboot" and not last["ok"] and "policy: never" in last["words"], done
    assert boot_id(host) is None


def hosts_names(hosts: list[TestHost]) -> list[str]:
    return [h.name for h in hosts]
