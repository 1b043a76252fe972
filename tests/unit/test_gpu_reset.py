"""Xid memory and the node's `gpu-reset` verb: an Xid logged before a recorded successful reset is judged no
more, a corrupt record falls back to the kernel log alone with a note, and the verb resets nothing while a
process holds the GPU or when the (simulated) reset fails."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from mgpu_provision import protocol
from mgpu_provision.judge import health, xids
from mgpu_provision.judge.records import Expectation
from mgpu_provision.node.__main__ import handle
from mgpu_provision.node.nvidia import kernel
from mgpu_provision.node.nvidia.nvml_real import RealBackend
from mgpu_provision.node.verbs import resets
from mgpu_provision.node.verbs.facts import nvidia_facts
from tests.support.factories import rtx3090_twin
from tests.support.nvml import ScriptedNvml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel"
PAIR = Expectation("NVIDIA GeForce RTX 3090", 2, critical_xids=xids.CRITICAL)
BOOT = "c0ffee00-0000-4000-8000-000000000001"


class TwoGpus(ScriptedNvml):
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(busId=[b"00000000:01:00.0", b"00000000:02:00.0"][handle])

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return int(pynvml.nvmlClocksThrottleReasonGpuIdle)


@pytest.fixture
def real_box(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real backend over a scripted NVML whose kernel log (journalctl -k) is the Xid 94/95 fixture."""
    TwoGpus().install(monkeypatch)
    text = (FIXTURES / "xid-94-95-contained.log").read_text()
    monkeypatch.setattr(kernel, "_journal", lambda: text)
    monkeypatch.setattr(RealBackend, "kernel_readiness", lambda self: None)
    monkeypatch.setattr(RealBackend, "installed_version", lambda self: "550.54.15")
    monkeypatch.setattr(RealBackend, "loaded_version", lambda self: "550.54.15")
    monkeypatch.setattr(RealBackend, "boot_id", lambda self: BOOT)


def judged(state: Path) -> tuple[list[tuple[str, str]], list[str]]:
    raw = json.loads(json.dumps(nvidia_facts(RealBackend(), str(state))))
    found = health.health(raw, PAIR)
    notes = [n for n in raw["health"]["not_checked"] if n.startswith("xid memory")]
    return [(f.current or "", f.severity) for f in found], notes


def test_xid_94_then_a_recorded_successful_reset_gives_no_failure(real_box: None, tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert judged(state)[0] == [("Xid 94", "warn"), ("Xid 95", "fail")]  # 94 warns (DCGM), 95 fails
    _, events, _ = kernel.read_events()
    resets.record(str(state), BOOT, ["00000000:01:00.0"], events)
    assert judged(state) == ([], [])
    # Another boot's record is forgotten: the new boot's log counts again.
    resets.record(str(state), "another-boot", ["00000000:01:00.0"], events)
    assert judged(state)[0] == [("Xid 94", "warn"), ("Xid 95", "fail")]


def test_a_corrupt_record_judges_from_the_kernel_log_alone_with_a_note(
    real_box: None, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / resets.RESET_FILE).write_text('{"version": 1, "boot_id": "c0ff')  # cut off mid-write
    found, notes = judged(state)
    assert found == [("Xid 94", "warn"), ("Xid 95", "fail")]
    assert len(notes) == 1 and notes[0].startswith("xid memory: ") and "kernel log alone" in notes[0]


def call(verb: str, args: dict[str, Any], twin: Path) -> dict[str, Any]:
    reply, _ = handle(verb, json.dumps({"args": args, "simulate": str(twin)}))
    assert reply["ok"], reply
    result: dict[str, Any] = reply["result"]
    return result


def reset_args(state: Path, gpus: list[int], wait_s: float = 0.0) -> dict[str, Any]:
    return protocol.gpu_reset_request(gpus, False, wait_s, str(state), str(state / "lock"), 5.0)


def sick_twin(tmp_path: Path, **health_more: Any) -> Path:
    twin = rtx3090_twin()
    twin["gpus"][0]["health"] = {"xid": [95], "recovery_action": "gpu_reset", **health_more}
    path = tmp_path / "twin.json"
    path.write_text(json.dumps(twin))
    return path


def findings(twin: Path, state: Path) -> list[tuple[str, str | None]]:
    facts = call("facts", protocol.facts_request(state_dir=str(state)), twin)
    return [(f.check, f.recovery) for f in health.health(facts, PAIR)]


def test_a_successful_simulated_reset_clears_the_xid_and_the_recovery_action(tmp_path: Path) -> None:
    twin, state = sick_twin(tmp_path), tmp_path / "state"
    assert findings(twin, state) == [("xid", "reset"), ("recovery-action", "reset")]
    done = call("gpu-reset", reset_args(state, [0]), twin)
    assert done["reset"] is True and done["error"] is None and done["held"] == []
    assert findings(twin, state) == []
    assert (state / resets.RESET_FILE).exists()


def test_a_held_gpu_is_not_reset_and_nothing_is_recorded(tmp_path: Path) -> None:
    twin, state = sick_twin(tmp_path), tmp_path / "state"
    data = json.loads(twin.read_text())
    data["processes"] = [{"pid": 4242, "gpu": 0, "used_mib": 1000}]
    twin.write_text(json.dumps(data))
    done = call("gpu-reset", reset_args(state, [0], wait_s=1.0), twin)
    assert done["reset"] is False and done["held"] == [{"gpu": 0, "pids": [4242]}]
    assert done["waited_s"] >= 1.0
    assert not (state / resets.RESET_FILE).exists()
    assert findings(twin, state) == [("xid", "reset"), ("recovery-action", "reset")]


def test_a_failing_simulated_reset_says_so_and_changes_nothing(tmp_path: Path) -> None:
    twin, state = sick_twin(tmp_path, reset="fails"), tmp_path / "state"
    done = call("gpu-reset", reset_args(state, [0]), twin)
    assert done["reset"] is False and "Unable to reset" in (done["error"] or "")
    assert findings(twin, state) == [("xid", "reset"), ("recovery-action", "reset")]


def test_a_simulated_reboot_clears_the_old_boots_xids(tmp_path: Path) -> None:
    twin, state = sick_twin(tmp_path, reset="fails"), tmp_path / "state"
    request = {"args": {"simulated": True}, "simulate": str(twin), "state_dir": str(state)}
    reply, _ = handle("reboot", json.dumps(request))
    assert reply["ok"], reply
    assert findings(twin, state) == []
