"""Kernel logs people published, read by the real backend's kernel log reader over a scripted NVML and
judged by the shipped judge: each failure is raised on the GPU the log names, with the advice for it; app
Xids and non-fatal SXids are no failure."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from mgpu_provision.facts import HostHealth
from mgpu_provision.judge import health, xids
from mgpu_provision.judge.records import Expectation
from mgpu_provision.node.nvidia import kernel
from mgpu_provision.node.nvidia.nvml_real import RealBackend
from mgpu_provision.node.verbs.facts import nvidia_facts
from tests.support.nvml import ScriptedNvml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel"


class TwoGpusAt(ScriptedNvml):
    """The scripted pair of cards, at the PCI addresses a fixture's box had."""

    def __init__(self, *bus_ids: str) -> None:
        self.bus_ids = [bus.encode() for bus in bus_ids]

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(busId=self.bus_ids[handle])

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return int(pynvml.nvmlClocksThrottleReasonGpuIdle)  # healthy clocks: only the log is judged


def judged(monkeypatch: pytest.MonkeyPatch, log: str, nvml: ScriptedNvml) -> list[str]:
    """The shipped judge's health findings for a box whose kernel log (journalctl -k) is the fixture."""
    nvml.install(monkeypatch)
    text = (FIXTURES / log).read_text()
    monkeypatch.setattr(kernel, "_journal", lambda: text)
    monkeypatch.setattr(RealBackend, "kernel_readiness", lambda self: None)
    monkeypatch.setattr(RealBackend, "installed_version", lambda self: "550.54.15")
    monkeypatch.setattr(RealBackend, "loaded_version", lambda self: "550.54.15")
    raw = json.loads(json.dumps(nvidia_facts(RealBackend())))  # as the control side receives it
    HostHealth.model_validate(raw["health"])
    pair = Expectation("NVIDIA GeForce RTX 3090", 2, critical_xids=xids.CRITICAL)
    return [finding.summary for finding in health.health(raw, pair)]


@pytest.mark.parametrize(
    "log, bus_ids, expected",
    [
        (
            "xid-119-gsp-timeout.log",
            ("00000000:1B:00.0", "00000000:9B:00.0"),
            "GPU 1 logged Xid 119 since boot (2 times) (GSP RPC timeout): reset the GPU (nvidia-smi -r -i 1, "
            "no process on it) or reboot; if it recurs, update the driver (R525 before 525.105.17 had this "
            "bug) or report it",
        ),
        (
            # A Grace-Blackwell tray, one PCI domain per GPU; its 145 (non-fatal) and the app's 45 pass.
            "xid-149-netir-gb200.log",
            ("00000018:01:00.0", "00000019:01:00.0"),
            "GPU 1 logged Xid 149 since boot (fatal NVLink network (NETIR) error): reset the GPU or reboot "
            "the tray; check the NVLink cables and the switch tray it names",
        ),
        (
            "fallen-off-bus-no-xid.log",
            ("00000000:B3:00.0", "00000000:B4:00.0"),
            "GPU 0 logged Xid 79 since boot (GPU has fallen off the bus): reboot, then check its power "
            "cables and PCIe seating; replace it if it recurs",
        ),
    ],
)
def test_each_log_fails_on_the_gpu_it_names_with_advice(
    monkeypatch: pytest.MonkeyPatch, log: str, bus_ids: tuple[str, str], expected: str
) -> None:
    assert judged(monkeypatch, log, TwoGpusAt(*bus_ids)) == [expected]


def test_a_fatal_sxid_names_its_switch_and_the_xid_79_its_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box = TwoGpusAt("00000000:91:00.0", "00000000:92:00.0")
    got = judged(monkeypatch, "sxid-nvswitch.log", box)
    assert got[0].startswith("GPU 0 logged Xid 79 since boot (GPU has fallen off the bus)")
    assert [line.split(":")[0] for line in got[1:]] == [
        "NVSwitch nvidia-nvswitch1 (0000",
        "NVSwitch nvidia-nvswitch0 (0000",
    ]  # the non-fatal SXid 12028 of nvidia-nvswitch3 is no failure
    assert "logged fatal SXid 20034 since boot: the fabric needs a reset" in got[1]


def test_application_xids_are_never_failures_by_default() -> None:
    assert not set(xids.APP) & set(xids.CRITICAL)
    events = [{"gpu": 0, "pci_bus_id": "0000:01:00", "code": code} for code in xids.APP]
    pair = Expectation("NVIDIA GeForce RTX 3090", 2, critical_xids=xids.CRITICAL)
    assert health.health({"health": {"xid": events}}, pair) == []
