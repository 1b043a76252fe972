"""`mgpu-provision apply` end to end: real sshd test hosts with simulated NVIDIA layers, the real agent.

Drifted boxes converge and stay converged (a second apply writes nothing), reboot policy is honoured, a
rollout stops at a failed batch, a held host lock makes apply wait or refuse, and the control process
killed at random moments never leaves a managed file half-written or missing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision import cli
from mgpu_provision.node.verbs.health_rates import SAMPLE_FILE
from mgpu_provision.plan.resources.envfiles import SYSTEMD_DEFAULT_PATH
from tests.support.factories import pair_rig_file as rig_file
from tests.support.factories import rtx3090_twin
from tests.support.hosts import (
    APPLY_LOCK,
    REPO,
    HostFactory,
    TestHost,
    desired_files_on,
    hold_lock,
    on_host,
)
from tests.support.systemd_envfile import read_environment_file

LOCK = APPLY_LOCK


def start(factory: HostFactory, name: str, box: dict[str, Any]) -> TestHost:
    return factory.start(name, box, rig="pair")


def managed_state(hosts: list[TestHost]) -> dict[str, tuple[int, int]]:
    """mtime (ns) and size of every file in every host's managed folders, but the node's own health
    counter sample (every facts call may record one: node/verbs/health_rates.py), which apply does not
    write."""
    state = {}
    for host in hosts:
        for path in sorted((host.dir / "managed").rglob("*")):
            if path.is_file() and path.name != SAMPLE_FILE:
                info = path.stat()
                state[str(path)] = (info.st_mtime_ns, info.st_size)
    return state


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_apply_converges_drifted_hosts_and_a_second_apply_writes_nothing(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = start(test_hosts, "gpu-a", rtx3090_twin(driver="535.161.08"))  # old driver: install, reboot
    b = start(test_hosts, "gpu-b", rtx3090_twin(persistence=(True, True)))  # stale and wrongly-moded files
    c = start(test_hosts, "gpu-c", rtx3090_twin(persistence=(True, False)))  # one GPU off, SLI Mosaic
    rig = rig_file(test_hosts, tmp_path / "rig.yaml", [a, b, c])
    want = {
        name: {f.path: f for f in files}
        for name, files in desired_files_on(rig, test_hosts.known_hosts).items()
    }
    profile, launcher, xorg = (
        "/etc/profile.d/mgpu-provision.sh",
        "/usr/local/bin/mgpu-torchrun",
        "/etc/X11/xorg.conf.d/20-mgpu-provision.conf",
    )
    on_host(b, profile).write_text("export OLD=1\n")
    on_host(b, launcher).write_text(want["gpu-b"][launcher].content)
    on_host(b, launcher).chmod(0o644)
    on_host(c, xorg).write_text('Section "Screen"\n    Option "SLI" "Mosaic"\nEndSection\n')
    common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]

    code, first = cli_json(capsys, "apply", *common, "--yes")
    assert code == 0, first
    assert {name: h["status"] for name, h in first["hosts"].items()} == dict.fromkeys(
        ("gpu-a", "gpu-b", "gpu-c"), "changed"
    )
    assert first["hosts"]["gpu-a"]["rebooted"] is True
    assert not first["hosts"]["gpu-b"]["rebooted"] and not first["hosts"]["gpu-c"]["rebooted"]
    assert a.twin()["driver"]["version"] == "535.161.08"  # the twin is never written; the overlay is
    for host in (a, b, c):
        for path, file in want[host.name].items():
            assert on_host(host, path).read_text() == file.content
            assert oct(on_host(host, path).stat().st_mode & 0o777) == oct(int(file.mode, 8))
    assert on_host(b, profile + ".mgpu-provision.bak").read_text() == "export OLD=1\n"
    # SLI Off is the driver default: the snippet an earlier mode left is removed, its text kept as the backup
    assert not on_host(c, xorg).exists()
    assert "Mosaic" in on_host(c, xorg + ".mgpu-provision.bak").read_text()

    assert cli.main(["plan", *common]) == 0
    before = managed_state([a, b, c])
    code, second = cli_json(capsys, "apply", *common, "--yes")
    assert code == 0
    assert {h["status"] for h in second["hosts"].values()} == {"ok"}
    assert managed_state([a, b, c]) == before  # nothing written: mtimes and sizes unchanged


def sourced_twice(profile: Path) -> dict[str, str]:
    """The environment after dash sources the host's profile.d script twice (as a login shell and again)."""
    out = subprocess.run(
        ["dash", "-c", '. "$1"; . "$1"; /usr/bin/env -0', "sh", str(profile)],
        capture_output=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def test_env_values_and_path_prepend_drift_converge_and_read_back_on_the_host(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = start(test_hosts, "gpu-a", rtx3090_twin())
    canary = tmp_path / "canary"
    rig = rig_file(test_hosts, tmp_path / "rig.yaml", [host])
    document = yaml.safe_load(rig.read_text())
    note = f'/usr/local/cuda/bin:$PATH `touch {canary}` $(touch {canary}) "q" \'x\'\n# line 2 \\'
    note += "\r\t\x1b[31m é 日本 😀 "  # through YAML, the agent's JSON, its facts and back, byte for byte
    document["env"]["NOTE"] = note
    document["path_prepend"] = {"PATH": ["/usr/local/cuda/bin"]}
    rig.write_text(yaml.safe_dump(document))
    common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]
    profile, environment = "/etc/profile.d/mgpu-provision.sh", "/etc/mgpu-provision/environment"

    code, first = cli_json(capsys, "apply", *common, "--yes")
    assert code == 0, first
    assert cli.main(["plan", *common]) == 0
    env = sourced_twice(on_host(host, profile))
    assert env["NOTE"] == note
    assert env["PATH"] == "/usr/local/cuda/bin:/usr/bin:/bin"  # once, though sourced twice
    systemd = read_environment_file(on_host(host, environment))
    assert systemd["NOTE"] == note
    assert systemd["PATH"] == "/usr/local/cuda/bin:" + SYSTEMD_DEFAULT_PATH

    # The rig changes its value and its prepends: plan names exactly the two env files, apply converges
    document["env"]["NOTE"] = note + " $HOME"
    document["rigs"]["pair"]["path_prepend"] = {"LD_LIBRARY_PATH": ["/usr/local/cuda/lib64"]}
    rig.write_text(yaml.safe_dump(document))
    code, drift = cli_json(capsys, "plan", *common)
    assert code == 2, drift
    changes = drift["hosts"]["gpu-a"]["changes"]
    assert sorted((c["resource"], c["summary"]) for c in changes) == [
        (f"file:{environment}", "content differs"),
        (f"file:{profile}", "content differs"),
    ]
    code, second = cli_json(capsys, "apply", *common, "--yes")
    assert code == 0, second
    assert cli.main(["plan", *common]) == 0
    env = sourced_twice(on_host(host, profile))
    assert env["NOTE"] == note + " $HOME" and env["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert read_environment_file(on_host(host, environment))["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert not canary.exists()


def test_sli_mosaic_then_off_removes_the_snippet_and_a_second_plan_is_clean(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a6000 = "NVIDIA RTX A6000"
    box = rtx3090_twin(persistence=(True, True))
    for gpu in box["gpus"]:
        gpu["name"] = a6000
    a = start(test_hosts, "gpu-a", box)
    xorg = on_host(a, "/etc/X11/xorg.conf.d/20-mgpu-provision.conf")
    known = ["--known-hosts", str(test_hosts.known_hosts)]
    mosaic = rig_file(test_hosts, tmp_path / "mosaic.yaml", [a], sli="Mosaic", model=a6000)
    code, report = cli_json(capsys, "apply", str(mosaic), *known, "--yes")
    assert code == 0, report
    content = xorg.read_text()
    assert content.count('Section "Device"') == 2 and 'Option         "SLI" "Mosaic"' in content
    assert 'BusID          "PCI:' in content

    off = rig_file(test_hosts, tmp_path / "off.yaml", [a], sli="Off", model=a6000)
    code, plan = cli_json(capsys, "plan", str(off), *known)
    assert code == 2
    [change] = plan["hosts"]["gpu-a"]["changes"]
    assert (change["action"], change["resource"]) == (
        "delete",
        "file:/etc/X11/xorg.conf.d/20-mgpu-provision.conf",
    )
    code, report = cli_json(capsys, "apply", str(off), *known, "--yes")
    assert code == 0, report
    assert not xorg.exists()
    assert Path(f"{xorg}.mgpu-provision.bak").read_text() == content
    code, plan = cli_json(capsys, "plan", str(off), *known)
    assert (code, plan["hosts"]["gpu-a"]["changes"]) == (0, [])


def test_reboot_never_ends_as_reboot_required(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = start(test_hosts, "gpu-a", rtx3090_twin(driver="535.161.08", persistence=(True, True)))
    common = [
        str(rig_file(test_hosts, tmp_path / "rig.yaml", [a], reboot="never")),
        "--known-hosts",
        str(test_hosts.known_hosts),
    ]
    code, result = cli_json(capsys, "apply", *common, "--yes")
    assert code == 2
    host = result["hosts"]["gpu-a"]
    assert (host["status"], host["reboot_required"], host["rebooted"]) == ("changed", True, False)
    assert result["recap"]["reboot_required"] == 1
    code, plan = cli_json(capsys, "plan", *common)
    assert code == 2
    summaries = [c["summary"] for c in plan["hosts"]["gpu-a"]["changes"]]
    assert "reboot required to load driver 550.54.15 (policy: never)" in summaries
    capsys.readouterr()
    assert cli.main(["apply", *common, "--yes"]) == 2
    assert "reboot required" in capsys.readouterr().out


def test_a_failed_batch_stops_the_rollout(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = start(test_hosts, "gpu-a", rtx3090_twin())
    on_host(bad, LOCK).mkdir(parents=True)  # a lock that cannot be opened: the agent's apply fails there
    b = start(test_hosts, "gpu-b", rtx3090_twin())
    c = start(test_hosts, "gpu-c", rtx3090_twin())
    rig = rig_file(test_hosts, tmp_path / "rig.yaml", [bad, b, c])
    args = ["apply", str(rig), "--known-hosts", str(test_hosts.known_hosts), "--yes", "--serial", "1"]
    code, result = cli_json(capsys, *args, "--max-fail-percent", "0")
    assert code == 2
    hosts = result["hosts"]
    assert hosts["gpu-a"]["status"] == "failed"
    assert hosts["gpu-a"]["error"].startswith("agent apply failed on gpu-a")
    for name in ("gpu-b", "gpu-c"):
        assert hosts[name]["status"] == "skipped"
        assert hosts[name]["error"] == "not touched: 1 of 1 host(s) of batch 1 failed (--max-fail-percent 0)"
    assert managed_state([b, c]) == {}  # nothing was written on the skipped hosts
    capsys.readouterr()
    cli.main([*args, "--max-fail-percent", "0"])
    assert "skipped" in capsys.readouterr().out


def test_a_second_apply_refuses_or_waits_for_the_lock(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = start(test_hosts, "gpu-a", rtx3090_twin())
    args = [
        "apply",
        str(rig_file(test_hosts, tmp_path / "rig.yaml", [a])),
        "--known-hosts",
        str(test_hosts.known_hosts),
        "--yes",
    ]
    holder = hold_lock(a, 30)
    try:
        code, refused = cli_json(capsys, *args, "--lock-wait", "1")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert code == 2
    error = refused["hosts"]["gpu-a"]["error"]
    assert f"another apply is running on this host (pid {holder.pid}, lock {LOCK}); waited 1 s" in error
    assert not on_host(a, "/etc/profile.d/mgpu-provision.sh").exists()

    holder = hold_lock(a, 2)
    started = time.monotonic()
    code, waited = cli_json(capsys, *args, "--lock-wait", "30")
    holder.wait()
    assert code == 0, waited
    assert waited["hosts"]["gpu-a"]["status"] == "changed"
    assert time.monotonic() - started >= 1  # it waited for the holder instead of failing


def test_sigkill_at_random_moments_never_leaves_a_partial_file(
    test_hosts: HostFactory, tmp_path: Path
) -> None:
    hosts = [
        start(test_hosts, "gpu-a", rtx3090_twin(persistence=(True, True))),
        start(test_hosts, "gpu-b", rtx3090_twin(persistence=(True, True))),
    ]
    variants = {}
    for variant in ("a", "b"):
        wanted = desired_files_on(
            rig_file(test_hosts, tmp_path / f"rig-{variant}.yaml", hosts, env=variant), test_hosts.known_hosts
        )
        variants[variant] = {name: {f.path: f.content for f in files} for name, files in wanted.items()}
    rig = tmp_path / "rig.yaml"
    command = [
        sys.executable,
        "-m",
        "mgpu_provision",
        "apply",
        str(rig),
        "--known-hosts",
        str(test_hosts.known_hosts),
        "--yes",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def use(variant: str) -> None:
        rig.write_text((tmp_path / f"rig-{variant}.yaml").read_text())

    use("a")
    assert subprocess.run(command, env=env, capture_output=True).returncode == 0
    chance = random.Random(20261129)
    outcomes = []  # per round: which variant the files hold after the kill
    for attempt in range(20):
        new = "ab"[(attempt + 1) % 2]
        use(new)  # every round rewrites every env file
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if attempt % 2:  # a random moment of the whole run
            time.sleep(chance.uniform(0.2, 2.5))
        else:  # a random moment once the batch is being applied (the agent is writing)
            assert proc.stderr is not None
            for line in proc.stderr:
                if "applying on" in line:
                    break
            time.sleep(chance.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for host in hosts:
            for path in variants["a"][host.name]:
                file = on_host(host, path)
                assert file.exists(), f"round {attempt}: {path} missing on {host.name}"
                content = file.read_text()
                versions = (variants["a"][host.name][path], variants["b"][host.name][path])
                assert content in versions, f"round {attempt}: {path} on {host.name} is partial:\n{content}"
                if versions[0] != versions[1]:
                    outcomes.append(content == variants[new][host.name][path])
    # The kills landed at different moments: some before the agent wrote the round's files, some after.
    assert 0 < sum(outcomes) < len(outcomes), outcomes
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for host in hosts:
        for path, content in variants[new][host.name].items():
            assert on_host(host, path).read_text() == content
