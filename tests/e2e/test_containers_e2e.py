"""Containers end to end: a driver upgrade on a simulated box whose CDI spec is of the old driver, judged by
the tool and by the real podman (Debian 12's 4.3) reading the same spec inside the test host.

The twin's driver files (device nodes made with mknod as /dev/null's numbers, the driver's
versioned libraries as empty files) live under a driver root of the test's own, which the spec names through
`--driver-root`, as nvidia-ctk does for a containerized driver. The judge and the runtime must agree both
ways: a spec the tool calls fresh starts a container that sees the spec's device node and library; one it
calls stale is the one podman refuses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import cli
from mgpu_provision.node.nvidia import ctk_sim
from mgpu_provision.node.nvidia.nvml_sim import SimulatedBackend
from tests.support.factories import rtx3090_twin
from tests.support.hosts import HostFactory, on_host, skip_or_fail
from tests.support.podman import Podman, unavailable

OLD, NEW = "550.54.15", "570.86.15"
SPEC = "/etc/cdi/nvidia.yaml"
LIB = ctk_sim.LIB_DIR


@pytest.fixture
def podman() -> Iterator[Podman]:
    why = unavailable()
    if why is not None:
        skip_or_fail(why, "podman cannot run")
    runner = Podman()
    yield runner
    runner.close()


def driver_root(folder: Path, version: str) -> Path:
    """The stand-in driver files: the nodes a spec names, and the libraries of `version`."""
    (folder / "dev").mkdir(parents=True)
    for node in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        os.mknod(folder / "dev" / node, 0o666 | 0o020000, os.makedev(1, 3))  # a character device: /dev/null's
    libs = folder / LIB.lstrip("/")
    libs.mkdir(parents=True)
    for library in ctk_sim.LIBRARIES:
        (libs / f"{library}.{version}").write_bytes(b"")
    return folder


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def upgrade_box(test_hosts: HostFactory, podman: Podman, tmp_path: Path) -> tuple[list[str], Any]:
    """A box at the old driver whose spec nvidia-ctk wrote for it, and a rig pinning the new driver with a
    reboot allowed: the CLI's common arguments and `sees(version)`, podman's run that lists the spec's
    device node and library of that version."""
    root = driver_root(tmp_path / "driver", OLD)
    hook = tmp_path / "nvidia-cdi-hook"  # runc runs the spec's createContainer hooks on the host
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    twin = rtx3090_twin(driver=OLD, containers={"toolkit": "1.17.8", "driver_root": str(root)})
    host = test_hosts.start("gpu-a", twin, rig="pair")
    cdi = {"output": str(on_host(host, SPEC)), "driver_root": str(root), "hook_path": str(hook)}
    assert SimulatedBackend(str(host.twin_path)).generate_cdi(cdi)[0]
    containers = {
        "toolkit": "1.17.8",
        "runtimes": ["podman"],
        "cdi": {"driver_root": str(root), "hook_path": str(hook)},
    }
    rig = test_hosts.write_rig(
        tmp_path / "rig.yaml",
        [host],
        rigs={"pair": {"gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
                       "driver": {"version": NEW, "reboot": "allowed"}, "containers": containers}},
    )  # fmt: skip
    assert host.process is not None
    pid = host.process.pid

    def sees(version: str) -> Any:
        return podman.run_in(pid, "nvidia.com/gpu=all", f"ls /dev/nvidia1 {LIB}/libcuda.so.{version}")

    return [str(rig), "--known-hosts", str(test_hosts.known_hosts)], sees


def test_one_apply_upgrades_the_driver_reboots_and_then_regenerates_the_spec(
    test_hosts: HostFactory, podman: Podman, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common, sees = upgrade_box(test_hosts, podman, tmp_path)
    code, done = cli_json(capsys, "apply", *common, "--yes")
    assert code == 0, done
    steps = [line.split(":")[0] for line in done["hosts"]["gpu-a"]["done"]]
    assert steps.index("driver") < steps.index("cdi-generate") and done["hosts"]["gpu-a"]["rebooted"], done
    code, plan = cli_json(capsys, "plan", *common)
    assert (code, plan["hosts"]["gpu-a"]["changes"]) == (0, [])
    after = sees(NEW)
    assert after.returncode == 0 and f"libcuda.so.{NEW}" in after.stdout, after.stderr


def test_a_driver_upgrade_leaves_the_spec_stale_apply_regenerates_it_and_podman_agrees(
    test_hosts: HostFactory, podman: Podman, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common, sees = upgrade_box(test_hosts, podman, tmp_path)

    def cdi_changes(plan: dict[str, Any]) -> list[dict[str, Any]]:
        return [c for c in plan["hosts"]["gpu-a"]["changes"] if c["resource"] == "cdi"]

    # Before: the spec matches the loaded driver; the plan regenerates it only after the upgrade's reboot.
    code, plan = cli_json(capsys, "plan", *common)
    assert code == 2
    [cdi_change] = cdi_changes(plan)
    assert "stale" not in cdi_change["summary"] and "after its reboot" in cdi_change["summary"]
    before = sees(OLD)
    assert before.returncode == 0, before.stderr
    assert f"libcuda.so.{OLD}" in before.stdout and "/dev/nvidia1" in before.stdout

    # The upgrade alone (containers left out): the spec still names the old driver's libraries.
    code, done = cli_json(capsys, "apply", *common, "--yes", "--skip-tags", "containers")
    assert code == 0, done
    code, plan = cli_json(capsys, "plan", *common)
    [stale] = cdi_changes(plan)
    assert code == 2 and "is stale" in stale["summary"] and f"libcuda.so.{OLD}" in stale["summary"], stale
    assert f"mounts driver libraries {OLD}, the loaded driver is {NEW}" in stale["summary"]
    refused = sees(OLD)
    assert refused.returncode != 0 and f"libcuda.so.{OLD}" in refused.stderr, refused.stdout

    # apply regenerates it after the driver; the next plan is clean and podman starts with the new one.
    code, done = cli_json(capsys, "apply", *common, "--yes")
    assert code == 0, done
    assert any(line.startswith("cdi-generate:") for line in done["hosts"]["gpu-a"]["done"]), done
    code, plan = cli_json(capsys, "plan", *common)
    assert (code, plan["hosts"]["gpu-a"]["changes"]) == (0, [])
    after = sees(NEW)
    assert after.returncode == 0, after.stderr
    assert f"libcuda.so.{NEW}" in after.stdout


def test_bad_input_is_a_plain_finding_nothing_is_overwritten_and_podman_agrees(
    test_hosts: HostFactory, podman: Podman, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another vendor's spec at the managed path, a spec that is not JSON, a runtime that is not installed:
    findings, not a traceback and not an overwrite; podman skips the broken file as the judge says."""
    root = driver_root(tmp_path / "driver", OLD)
    twin = rtx3090_twin(driver=OLD, containers={"toolkit": "1.17.8", "driver_root": str(root)})
    host = test_hosts.start("gpu-a", twin, rig="pair")
    foreign = 'cdiVersion: "0.5.0"\nkind: amd.com/gpu\ndevices:\n  - name: "0"\n    containerEdits: {}\n'
    on_host(host, SPEC).write_text(foreign)
    broken = on_host(host, "/var/run/cdi/broken.json")
    broken.write_text('{"kind": "nvidia.com/gpu", ')
    hook = tmp_path / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    cdi = {"driver_root": str(root), "hook_path": str(hook)}
    containers = {"toolkit": "1.17.8", "runtimes": ["podman", "docker"], "cdi": cdi}
    rig = test_hosts.write_rig(
        tmp_path / "rig.yaml",
        [host],
        rigs={"pair": {"gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2}, "driver": {"version": OLD},
                       "containers": containers}},
    )  # fmt: skip
    common = [str(rig), "--known-hosts", str(test_hosts.known_hosts)]
    code, plan = cli_json(capsys, "plan", *common)
    found = {(c["resource"], c["action"]): c["summary"] for c in plan["hosts"]["gpu-a"]["changes"]}
    assert code == 2
    assert found[("cdi", "manual")].startswith(f"{SPEC} holds another vendor's spec (kind amd.com/gpu)")
    assert found[("cdi", "verify-failed")].startswith(
        "CDI spec /var/run/cdi/broken.json cannot be read (not valid JSON"
    )
    assert (
        found[("runtime", "verify-failed")]
        == "docker is not installed; the rig asks for it to run GPU containers"
    )
    code, done = cli_json(capsys, "apply", *common, "--yes")
    assert code == 2 and on_host(host, SPEC).read_text() == foreign, done
    assert host.process is not None
    refused = podman.run_in(host.process.pid, "nvidia.com/gpu=all", "true")
    assert refused.returncode != 0 and "unresolvable CDI devices nvidia.com/gpu=all" in refused.stderr

    # The other vendor's spec moved away by a person: apply generates ours; podman skips the broken file.
    on_host(host, SPEC).rename(on_host(host, "/etc/cdi/amd.yaml"))
    code, done = cli_json(capsys, "apply", *common, "--yes")
    assert any(line.startswith("cdi-generate:") for line in done["hosts"]["gpu-a"]["done"]), done
    started = podman.run_in(host.process.pid, "nvidia.com/gpu=all", f"ls /dev/nvidia0 {LIB}/libcuda.so.{OLD}")
    assert started.returncode == 0, started.stderr
    assert broken.read_text() == '{"kind": "nvidia.com/gpu", '
