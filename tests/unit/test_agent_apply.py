"""The `apply` and `reboot` verbs: atomic file steps, the host lock, simulated drivers and persistence."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision import protocol
from mgpu_provision.node.__main__ import handle
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.nvidia.twin import state_file
from mgpu_provision.node.packages.driver import install, version_key
from mgpu_provision.node.packages.runfile import fetch as fetch_runfile
from mgpu_provision.node.verbs.apply import BACKUP_SUFFIX, write_file
from mgpu_provision.protocol import GPU_SETTINGS_UNIT as UNIT
from tests.support.factories import facts_from_twin, twin_state_dir

ROOT = Path(__file__).resolve().parents[2]
TWINS = ROOT / "examples" / "twins"


def call(verb: str, args: dict[str, Any], twin: Path | None = None) -> dict[str, Any]:
    request = {"args": args, "simulate": str(twin) if twin else None}
    if twin:  # the node's state folder, for the verbs whose arguments name none (reboot without a lock)
        request["state_dir"] = twin_state_dir(twin)
    reply, _after = handle(verb, json.dumps(request))
    return reply


def apply_steps(
    tmp_path: Path, steps: list[dict[str, Any]], twin: Path | None = None
) -> list[dict[str, Any]]:
    reply = call(
        "apply", {"lock": str(tmp_path / "lock" / "apply.lock"), "lock_wait_s": 2, "steps": steps}, twin
    )
    assert reply["ok"], reply
    results: list[dict[str, Any]] = reply["result"]["results"]
    return results


@pytest.fixture
def twin(tmp_path: Path) -> Path:
    """A private copy of an example twin (its overlay lands in the state folder `lock/` beside it)."""
    path = tmp_path / "twin.yaml"
    shutil.copy(TWINS / "h100-hgx.yaml", path)
    return path


def test_file_is_created_then_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "etc" / "profile.d" / "mgpu.sh"
    step = {"kind": "file", "path": str(target), "content": "export A=1\n", "mode": "0644"}
    first = apply_steps(tmp_path, [step])
    assert first[0]["changed"] and first[0]["error"] is None and first[0]["message"].startswith("created")
    assert target.read_text() == "export A=1\n" and oct(target.stat().st_mode & 0o777) == "0o644"
    before = target.stat().st_mtime_ns
    time.sleep(0.01)
    second = apply_steps(tmp_path, [step])
    assert second[0]["changed"] is False and second[0]["message"] == f"{target} is up to date"
    assert target.stat().st_mtime_ns == before
    assert not (tmp_path / "etc" / "profile.d" / ("mgpu.sh" + BACKUP_SUFFIX)).exists()
    assert sorted(p.name for p in target.parent.iterdir()) == ["mgpu.sh"]  # no temp files left behind


def test_changed_file_keeps_a_backup_and_mode_only_changes_chmod(tmp_path: Path) -> None:
    target = tmp_path / "env"
    target.write_text("OLD=1\n")
    target.chmod(0o600)
    changed, message = write_file(str(target), "NEW=1\n", 0o640)
    assert changed and message.startswith(f"updated {target}")
    assert target.read_text() == "NEW=1\n" and target.stat().st_mode & 0o777 == 0o640
    backup = Path(str(target) + BACKUP_SUFFIX)
    assert backup.read_text() == "OLD=1\n" and backup.stat().st_mode & 0o777 == 0o600
    inode = target.stat().st_ino
    assert write_file(str(target), "NEW=1\n", 0o644) == (True, f"{target}: mode 0640 -> 0644")
    assert target.stat().st_ino == inode  # chmod in place, no rewrite


def test_write_is_a_rename_so_readers_never_see_half_a_file(tmp_path: Path) -> None:
    target = tmp_path / "big"
    target.write_text("a" * 100_000)
    old_inode = target.stat().st_ino
    with open(target) as reader:  # an open reader keeps the complete old version
        write_file(str(target), "b" * 100_000, 0o644)
        assert reader.read() == "a" * 100_000
    assert target.stat().st_ino != old_inode and target.read_text() == "b" * 100_000


def test_first_failure_skips_the_rest(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    steps = [
        {"kind": "file", "path": str(tmp_path / "ok"), "content": "x"},
        {"kind": "file", "path": str(blocker / "f"), "content": "x"},
        {"kind": "file", "path": str(tmp_path / "later"), "content": "x"},
    ]
    ok, failed, skipped = apply_steps(tmp_path, steps)
    assert ok["changed"] and ok["error"] is None
    assert failed["error"] is not None and "Not a directory" in failed["error"] and not failed["changed"]
    assert skipped["message"] == "skipped: an earlier step failed" and skipped["skipped"] is True
    assert not (tmp_path / "later").exists()


@pytest.mark.parametrize(
    "step, error",
    [
        ({"kind": "teleport"}, "apply: step 1: unknown kind 'teleport'; kinds are file, remove, driver"),
        (
            {"kind": "file", "path": "/tmp/x", "content": "x", "owner": "root"},
            "apply: step 1 (file): unknown field `owner`; its fields are path, content, mode",
        ),
        (
            {"kind": "file", "path": "/tmp/x", "content": 7},
            "apply: step 1 (file): `content` must be a string, got 7",
        ),
        ({"kind": "file", "content": "x"}, "apply: step 1 (file): `path` is missing"),
        ({"kind": "remove"}, "apply: step 1 (remove): `path` is missing"),
        (
            {"kind": "file", "path": "/tmp/x", "content": "x", "mode": "rwx"},
            "apply: step 1 (file): `mode` must be an octal permission like 0644, got 'rwx'",
        ),
        ({"kind": "driver", "method": "apt"}, "apply: step 1 (driver): `source` is missing"),
        (
            {"kind": "compute-mode", "mode": "exclusive_thread"},
            "apply: step 1 (compute-mode): `mode` must be one of default, exclusive_process, prohibited",
        ),
        (
            {"kind": "power-limit", "watts": "300"},
            "apply: step 1 (power-limit): `watts` must be a whole number",
        ),
        ({"kind": "power-limit"}, "apply: step 1 (power-limit): `watts` is missing"),
    ],
)
def test_the_door_refuses_a_bad_step_by_index_kind_and_field_and_changes_nothing(
    tmp_path: Path, twin: Path, step: dict[str, Any], error: str
) -> None:
    """An unknown field, a mistyped field, a missing field: refused before any step runs, so the valid file
    step in front of it writes nothing (it used to be written, and the bad step failed deep in a verb)."""
    first = tmp_path / "etc" / "first"
    steps = [{"kind": "file", "path": str(first), "content": "x\n", "mode": "0644"}, step]
    reply = call(
        "apply", {"lock": str(tmp_path / "lock" / "apply.lock"), "lock_wait_s": 2, "steps": steps}, twin
    )
    assert reply["ok"] is False and reply["error"]["kind"] == "bad-request"
    assert reply["error"]["message"].startswith(error), reply["error"]["message"]
    assert not first.exists() and not (tmp_path / "lock").exists()


def test_the_door_fills_in_declared_defaults(tmp_path: Path) -> None:
    target = tmp_path / "f"
    (result,) = apply_steps(tmp_path, [{"kind": "file", "path": str(target), "content": "x"}])
    assert result["changed"] and target.stat().st_mode & 0o777 == 0o644  # STEP_FIELDS: mode "0644"


def test_a_gpu_without_a_power_limit_fails_its_step(tmp_path: Path, twin: Path) -> None:
    (result,) = apply_steps(tmp_path, [{"kind": "power-limit", "gpus": [], "watts": 300}], twin)
    assert result["error"] == "GPU 0 reports no power limit (NVML: not supported)"


def test_apply_needs_a_lock_path() -> None:
    reply = call("apply", {"steps": []})
    assert reply["error"] == {
        "kind": "bad-request",
        "message": "apply: `lock` is missing; it must be a non-empty one-line string",
    }


def test_a_second_apply_waits_then_refuses_naming_the_holder(tmp_path: Path, twin: Path) -> None:
    lock = tmp_path / "locks" / "apply.lock"
    holder_code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from mgpu_provision.node.core.atomic import HostLock;"
        "lock = HostLock(sys.argv[2], 1).__enter__(); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(ROOT), str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        reply = call("apply", {"lock": str(lock), "lock_wait_s": 0.5, "steps": []})
        waited = time.monotonic() - started
        assert reply["ok"] is False and reply["error"]["kind"] == "locked"
        assert (
            f"pid {holder.pid}" in reply["error"]["message"] and "waited 0.5 s" in reply["error"]["message"]
        )
        assert 0.5 <= waited < 3
        # A reboot waits for the same lock: it must not land in the middle of the holder's steps.
        boot_before = facts_from_twin(twin).host.boot_id
        reply = call("reboot", {"lock": str(lock), "lock_wait_s": 0.2}, twin)
        assert reply["ok"] is False and reply["error"]["kind"] == "locked"
        assert facts_from_twin(twin).host.boot_id == boot_before
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()
    # Once the holder is gone the lock is free again.
    assert call("apply", {"lock": str(lock), "lock_wait_s": 0.5, "steps": []})["ok"]


def test_simulated_driver_install_mismatch_reboot_converged(tmp_path: Path, twin: Path) -> None:
    original = twin.read_text()
    step = protocol.driver_step("apt", "ubuntu", "server", "550", "550.90.07", hold=True, fabricmanager=True)
    (result,) = apply_steps(tmp_path, [step], twin)
    assert result["changed"] and "reboot required" in result["message"]
    between = facts_from_twin(twin)
    assert between.driver.nvml == "version-mismatch" and between.driver.reboot_required
    assert (between.driver.installed, between.driver.loaded) == ("550.90.07", "550.54.15")
    assert between.gpus == []
    assert between.fabricmanager is not None and between.fabricmanager.service == "failed"
    old_boot = between.host.boot_id

    reply = call("reboot", {}, twin)
    assert reply == {"ok": True, "agent_version": reply["agent_version"], "result": {"boot_id": old_boot}}
    after = facts_from_twin(twin)
    assert (
        after.driver.nvml == "ok" and after.driver.version == "550.90.07" and not after.driver.reboot_required
    )
    assert after.host.boot_id != old_boot and len(after.gpus) == 8
    assert after.fabricmanager is not None
    assert (after.fabricmanager.version, after.fabricmanager.service) == ("550.90.07", "active")

    (again,) = apply_steps(tmp_path, [step], twin)
    assert again["changed"] is False and again["message"] == "driver 550.90.07 already installed"
    assert twin.read_text() == original  # the twin is never written; the overlay holds the state
    state = json.loads(Path(state_file(str(twin), twin_state_dir(twin))).read_text())
    assert state["driver_version"] == "550.90.07" and state["loaded"] == "550.90.07"


def test_simulated_fabric_manager_behind_is_installed_at_the_driver_version_and_enabled(
    tmp_path: Path, twin: Path
) -> None:
    """Defect 5 on the node: the `fabricmanager` step brings FM to the driver's version and enables it."""
    text = twin.read_text().replace('fabricmanager: "550.54.15"', 'fabricmanager: "550.54.14"')
    twin.write_text(text + "services:\n  nvidia-fabricmanager: {enabled: false, running: false}\n")
    before = facts_from_twin(twin).fabricmanager
    assert before is not None and (before.version, before.service, before.enabled) == (
        "550.54.14",
        "inactive",
        False,
    )
    step = protocol.fabricmanager_step(
        "550.54.15", "ubuntu", "apt", protocol.NO_PACKAGES, hold=True, start=True
    )
    (result,) = apply_steps(tmp_path, [step], twin)
    assert result["changed"] and result["message"].startswith("installed Fabric Manager 550.54.15")
    after = facts_from_twin(twin).fabricmanager
    assert after is not None and (after.version, after.service, after.enabled) == (
        "550.54.15",
        "active",
        True,
    )
    (again,) = apply_steps(tmp_path, [step], twin)
    assert again["changed"] is False


def test_simulated_persistence_daemon_survives_reboots_and_the_legacy_setting_does_not(
    tmp_path: Path, twin: Path
) -> None:
    """Defect 6 on the node: NVML's setting is lost at boot; the enabled daemon sets it at every boot."""
    legacy = {"kind": "persistence", "enabled": True}
    apply_steps(tmp_path, [legacy], twin)
    assert all(g.persistence_mode for g in facts_from_twin(twin).gpus)
    call("reboot", {}, twin)
    assert not any(g.persistence_mode for g in facts_from_twin(twin).gpus)
    daemon = protocol.persistenced_step(enabled=True, start=True)
    (result,) = apply_steps(tmp_path, [daemon], twin)
    assert result["changed"] and result["message"] == (
        "nvidia-persistenced enabled and started (simulated: in the twin's state, not systemd)"
    )
    call("reboot", {}, twin)
    after = facts_from_twin(twin)
    assert after.persistenced is not None and (after.persistenced.service, after.persistenced.enabled) == (
        "active",
        True,
    )
    assert all(g.persistence_mode for g in after.gpus)
    (off,) = apply_steps(tmp_path, [protocol.persistenced_step(False, False)], twin)
    assert off["changed"] and not any(g.persistence_mode for g in facts_from_twin(twin).gpus)


def test_simulated_nouveau_is_gone_after_blacklist_and_reboot(tmp_path: Path, twin: Path) -> None:
    twin.write_text(twin.read_text() + "nouveau: true\n")
    assert facts_from_twin(twin).driver.nouveau
    (result,) = apply_steps(tmp_path, [{"kind": "nouveau"}], twin)
    assert result["changed"] and facts_from_twin(twin).driver.nouveau  # still bound until the reboot
    call("reboot", {}, twin)
    assert not facts_from_twin(twin).driver.nouveau


def test_simulated_branch_install_picks_the_newest_available(tmp_path: Path, twin: Path) -> None:
    branch = protocol.driver_step("apt", "ubuntu", "server", "535", None, hold=False, fabricmanager=False)
    (result,) = apply_steps(tmp_path, [branch], twin)
    assert result["changed"] and result["message"].startswith("installed driver 535.161.08")
    (missing,) = apply_steps(tmp_path, [dict(branch, branch="999")], twin)
    assert missing["error"] == "no driver of branch '999' is available (simulated: twin available_drivers)"


def test_simulated_persistence_mode(tmp_path: Path, twin: Path) -> None:
    step = {"kind": "persistence", "gpus": [0, 2], "enabled": True}
    (first,) = apply_steps(tmp_path, [step], twin)
    assert first == {
        "index": 0,
        "kind": "persistence",
        "changed": True,
        "error": None,
        "message": "persistence mode enabled on GPU 0,2",
    }
    assert [g.persistence_mode for g in facts_from_twin(twin).gpus][:3] == [True, False, True]
    (second,) = apply_steps(tmp_path, [step], twin)
    assert second["changed"] is False and second["message"] == "persistence mode already enabled on GPU 0,2"


def test_simulated_compute_mode_and_power_limit(tmp_path: Path, twin: Path) -> None:
    data = yaml.safe_load(twin.read_text())
    for gpu in data["gpus"]:
        gpu["health"] = {"power_limit_w": 500, "default_power_limit_w": 700, "compute_mode": "prohibited"}
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps(data))
    steps = [
        {"kind": "compute-mode", "gpus": [1, 2], "mode": "exclusive_process"},
        {"kind": "power-limit", "gpus": [0], "watts": 600},
        {"kind": "power-limit", "gpus": [3], "watts": None},
    ]
    first = apply_steps(tmp_path, steps, twin)
    assert [(r["changed"], r["message"]) for r in first] == [
        (True, "compute mode exclusive_process set on GPU 1,2"),
        (True, "power limit 600 W set on GPU 0"),
        (True, "power limit default set on GPU 3"),
    ]
    health = facts_from_twin(twin).health
    assert health is not None
    modes = [g.compute_mode for g in health.gpus][:3]
    assert modes == ["prohibited", "exclusive_process", "exclusive_process"]
    assert [g.power_limit_w for g in health.gpus][:4] == [600, 500, 500, 700]
    second = apply_steps(tmp_path, steps, twin)
    assert [r["changed"] for r in second] == [False, False, False]
    assert second[0]["message"] == "compute mode exclusive_process already on GPU 1,2"


def test_simulated_reboot_forgets_compute_mode_and_power_limit_unless_the_boot_unit_is_enabled(
    tmp_path: Path, twin: Path
) -> None:
    """NVML's settings are lost when the driver loads again; the enabled boot unit sets them at boot."""
    data = yaml.safe_load(twin.read_text())
    for gpu in data["gpus"]:
        gpu["health"] = {"power_limit_w": 500, "default_power_limit_w": 700}
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps(data))
    settings = [
        {"kind": "compute-mode", "gpus": [], "mode": "exclusive_process"},
        {"kind": "power-limit", "gpus": [], "watts": 600},
    ]

    def read() -> set[tuple[str | None, int | None]]:
        health = facts_from_twin(twin).health
        assert health is not None
        return {(g.compute_mode, g.power_limit_w) for g in health.gpus}

    apply_steps(tmp_path, settings, twin)
    assert read() == {("exclusive_process", 600)}
    call("reboot", {}, twin)
    assert read() == {("default", 700)}  # the defaults, not the twin's 500 W someone once set
    enable = {"kind": "service", "unit": UNIT, "enable": True, "start": False}
    apply_steps(tmp_path, [*settings, enable], twin)
    state = call("facts", {"units": [UNIT]}, twin)["result"]["units"]
    assert state == {UNIT: {"service": "inactive", "enabled": True}}
    call("reboot", {}, twin)
    assert read() == {("exclusive_process", 600)}
    state = call("facts", {"units": [UNIT]}, twin)["result"]["units"]
    assert state == {UNIT: {"service": "active", "enabled": True}}  # it ran at this boot
    apply_steps(tmp_path, [{"kind": "service", "unit": UNIT, "enable": False, "start": False}], twin)
    call("reboot", {}, twin)
    assert read() == {("default", 700)}


def test_persistence_without_nvml_fails_plainly(tmp_path: Path) -> None:
    twin = tmp_path / "t.json"
    twin.write_text(json.dumps({"driver": {"version": None}, "gpus": []}))
    (result,) = apply_steps(tmp_path, [{"kind": "persistence", "enabled": True}], twin)
    assert (
        result["error"]
        == "cannot set persistence mode: no NVIDIA driver is installed (libnvidia-ml.so.1 not found)"
    )


def test_apply_is_atomic_under_sigkill(tmp_path: Path) -> None:
    """Kill a writer at random moments: the file is always the whole old or the whole new content."""
    target = tmp_path / "managed"
    old, new = "old\n" * 50_000, "new\n" * 50_000
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from mgpu_provision.node.verbs.apply import write_file;"
        "import itertools;"
        "[write_file(sys.argv[2], c * 50_000, 0o644) for c in itertools.cycle(['old\\n', 'new\\n'])]"
    )
    target.write_text(old)
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31):
        proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT), str(target)])
        time.sleep(delay)
        proc.kill()
        proc.wait()
        assert target.read_text() in (old, new)


def test_driver_install_refusals_before_any_command(tmp_path: Path) -> None:
    pacman = dict(
        protocol.driver_step("apt", "ubuntu", "server", "550", "550.54.15", False, False), method="pacman"
    )
    reply = call("apply", {"lock": str(tmp_path / "apply.lock"), "steps": [pacman]})
    assert reply["error"]["message"] == (
        "apply: step 0 (driver): `method` must be one of apt, dnf, yum, zypper, runfile, got 'pacman'"
    )
    runfile = tmp_path / "NVIDIA.run"
    runfile.write_bytes(b"#!/bin/sh\nexit 0\n")
    step = protocol.driver_step("runfile", None, None, "550", "550.54.15", False, False, runfile=str(runfile))
    with pytest.raises(AgentFailure, match="the runfile method needs `sha256`"):
        install(step, None)
    with pytest.raises(AgentFailure, match=f"checksum mismatch for {runfile}: got "):
        install(dict(step, sha256="0" * 64), None)
    assert install(step, "550.54.15") == (False, "driver 550.54.15 already installed")


def test_driver_versions_order_numerically() -> None:
    versions = ["550.90.07", "550.127.05", "535.161.08"]
    assert max(versions, key=version_key) == "550.127.05"


def test_a_runfile_path_is_used_as_given_and_an_unreachable_url_is_a_plain_error(tmp_path: Path) -> None:
    assert fetch_runfile({"runfile": "/opt/NVIDIA-Linux-x86_64-550.54.15.run"}) == (
        "/opt/NVIDIA-Linux-x86_64-550.54.15.run"
    )
    # Port 9 on loopback: nothing listens, so the download fails at once, without leaving a partial file.
    step = {"runfile": "https://127.0.0.1:9/NVIDIA.run", "sha256": "ab" * 32}
    with pytest.raises(AgentFailure, match=r"could not download https://127\.0\.0\.1:9/NVIDIA\.run"):
        fetch_runfile(step, cache_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_cached_download_is_reused(tmp_path: Path) -> None:
    cached = tmp_path / f"NVIDIA-{'cd' * 8}.run"
    cached.write_bytes(b"#!/bin/sh\n")
    step = {"runfile": "https://127.0.0.1:9/NVIDIA.run", "sha256": "cd" * 32}
    assert fetch_runfile(step, cache_dir=str(tmp_path)) == str(cached)


@pytest.mark.parametrize(
    ("verb", "planned_as_simulated"), [("apply", True), ("apply", False), ("reboot", True)]
)
def test_a_node_that_is_not_what_it_was_planned_as_is_never_changed(
    tmp_path: Path, twin: Path, verb: str, planned_as_simulated: bool
) -> None:
    target = tmp_path / "written"
    step = {"kind": "file", "path": str(target), "content": "x\n", "mode": "0644"}
    args = {"lock": str(tmp_path / "apply.lock"), "steps": [step], "simulated": planned_as_simulated}
    # Planned as simulated, now answering from the real machine (sudo dropped the twin), or the reverse.
    reply = call(verb, args, None if planned_as_simulated else twin)
    assert reply["ok"] is False and reply["error"]["kind"] == "refused"
    assert "nothing was changed" in reply["error"]["message"]
    assert not target.exists()


def test_a_state_folder_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state folder should be")
    reply = call("apply", {"lock": str(blocker / "apply.lock"), "steps": []})
    assert reply["error"]["kind"] == "lock"
    assert f"cannot take the host lock {blocker}/apply.lock" in reply["error"]["message"]
    assert f"the state folder {blocker} must be creatable" in reply["error"]["message"]


def test_remove_step_deletes_the_file_and_keeps_a_backup(tmp_path: Path) -> None:
    target = tmp_path / "20-mgpu-provision.conf"
    target.write_text('Section "Screen"\nEndSection\n')
    (first,) = apply_steps(tmp_path, [{"kind": "remove", "path": str(target)}])
    assert first["changed"] and first["message"] == f"removed {target} (backup {target}{BACKUP_SUFFIX})"
    assert not target.exists()
    assert Path(f"{target}{BACKUP_SUFFIX}").read_text() == 'Section "Screen"\nEndSection\n'
    (again,) = apply_steps(tmp_path, [{"kind": "remove", "path": str(target)}])
    assert not again["changed"] and again["message"] == f"{target} is already absent"


def test_every_builder_makes_a_step_the_door_takes_as_it_is() -> None:
    """The builders and STEP_FIELDS are two statements of each kind: every field a builder writes is
    declared, of its declared type, and nothing is left for the door to fill in."""
    apt = protocol.PackageSet([], ["nvidia-driver-550-server"], ["*nvidia*-550"])
    runfile = protocol.driver_step(
        "runfile", None, "open", "570", "570.86.16", False, False,
        runfile="/r", sha256="0" * 64, kernel_module_type="open",
    )  # fmt: skip
    built = [
        protocol.file_step("/etc/x", "x\n", "0644"),
        protocol.remove_step("/etc/x"),
        protocol.agent_step("/usr/local/lib/mgpu-provision/agent.pyz", "0" * 64),
        protocol.driver_step("apt", "ubuntu", "server", "550", "550.54.15", True, True, packages=apt),
        runfile,
        protocol.fabricmanager_step("550.54.15", "cuda", "dnf", protocol.NO_PACKAGES, True, False),
        protocol.persistenced_step(True, True, "nvidia-persistenced", "dnf"),
        protocol.service_step(UNIT, True, False),
        protocol.nouveau_step(),
        protocol.persistence_step([0, 1], True),
        protocol.compute_mode_step([1], "exclusive_process"),
        protocol.power_limit_step([0], None),
        protocol.restart_step(["systemctl", "restart", "slurmd"]),
        protocol.container_toolkit_step("1.17.8", "apt", True, ["nvidia-container-toolkit"]),
        protocol.cdi_generate_step("/etc/cdi/nvidia.yaml", "/", "/usr/bin/nvidia-cdi-hook"),
        protocol.runtime_configure_step("docker"),
    ]
    assert sorted({step["kind"] for step in built}) == sorted(protocol.STEP_KINDS)
    for index, step in enumerate(built):
        assert protocol.check_step(index, step) == step
