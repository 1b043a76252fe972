"""Kernel logs people published, read by the real backend's kernel log reader over a scripted NVML and
judged by the plan: each failure is raised on the GPU the log names, with the advice for it; app Xids and
non-fatal SXids are no failure."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from mgpu_provision.facts import Facts, HostHealth
from mgpu_provision.node.nvidia import kernel
from mgpu_provision.node.nvidia.nvml_real import RealBackend
from mgpu_provision.node.verbs.facts import nvidia_facts
from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.resources import health
from mgpu_provision.rig import load_rig
from tests import factories
from tests.unit.test_agent_nvml_real import ScriptedNvml

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


def judged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, log: str, nvml: ScriptedNvml) -> list[str]:
    """The health check's failures for a box whose kernel log (journalctl -k) is the fixture."""
    nvml.install(monkeypatch)
    text = (FIXTURES / log).read_text()
    monkeypatch.setattr(kernel, "_journal", lambda: text)
    monkeypatch.setattr(RealBackend, "kernel_readiness", lambda self: None)
    monkeypatch.setattr(RealBackend, "installed_version", lambda self: "550.54.15")
    monkeypatch.setattr(RealBackend, "loaded_version", lambda self: "550.54.15")
    raw = nvidia_facts(RealBackend())
    facts = Facts.model_validate({**factories.case_facts({}).model_dump(), **raw})
    assert isinstance(facts.health, HostHealth)
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "hosts: [{name: box, address: 10.0.0.1, rig: r}]\n"
        "rigs: {r: {gpus: {model: NVIDIA GeForce RTX 3090, count: 2}}}\n"
    )
    loaded = load_rig(rig)
    host = loaded.host("box")
    ctx = HostContext(host=host, rig=loaded.rig_of(host), facts=facts, visible_count=2)
    return [change.summary for change in health.diff(ctx)]


def test_xid_119_is_raised_on_gpu_at_9b_with_reset_advice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    box = TwoGpusAt("00000000:1B:00.0", "00000000:9B:00.0")
    got = judged(monkeypatch, tmp_path, "xid-119-gsp-timeout.log", box)
    assert got == [
        "GPU 1 logged Xid 119 since boot (2 times) (GSP RPC timeout): reset the GPU (nvidia-smi -r -i 1, no "
        "process on it) or reboot; if it recurs, update the driver (R525 before 525.105.17 had this bug) or "
        "report it"
    ]


def test_xid_149_in_pci_domain_0019_is_raised_and_its_app_xid_45_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    box = TwoGpusAt("00000018:01:00.0", "00000019:01:00.0")  # a Grace-Blackwell tray: one domain per GPU
    got = judged(monkeypatch, tmp_path, "xid-149-netir-gb200.log", box)
    assert got == [
        "GPU 1 logged Xid 149 since boot (fatal NVLink network (NETIR) error): reset the GPU or reboot the "
        "tray; check the NVLink cables and the switch tray it names"
    ]  # 145 (non-fatal RLW on GPU 0) and 45 (the app's channel torn down) are no failure


def test_a_gpu_fallen_off_the_bus_without_an_xid_line_fails_as_xid_79(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    box = TwoGpusAt("00000000:B3:00.0", "00000000:B4:00.0")
    got = judged(monkeypatch, tmp_path, "fallen-off-bus-no-xid.log", box)
    assert got == [
        "GPU 0 logged Xid 79 since boot (GPU has fallen off the bus): reboot, then check its power cables "
        "and PCIe seating; replace it if it recurs"
    ]


def test_a_fatal_sxid_names_its_switch_and_the_xid_79_its_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    box = TwoGpusAt("00000000:91:00.0", "00000000:92:00.0")
    got = judged(monkeypatch, tmp_path, "sxid-nvswitch.log", box)
    assert got[0].startswith("GPU 0 logged Xid 79 since boot (GPU has fallen off the bus)")
    assert [line.split(":")[0] for line in got[1:]] == [
        "NVSwitch nvidia-nvswitch1 (0000",
        "NVSwitch nvidia-nvswitch0 (0000",
    ]  # the non-fatal SXid 12028 of nvidia-nvswitch3 is no failure
    assert "logged fatal SXid 20034 since boot: the fabric needs a reset" in got[1]
