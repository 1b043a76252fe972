"""Health checks end to end: one fleet of simulated boxes (2x RTX 3090 and HGX H100) behind real sshd test
hosts, each with one health problem in its twin, must report that problem on the right GPU with the right
advice, while healthy twins of both rig types on the same fleet pass; apply then converges power limit and
compute mode, writes and enables the boot unit that sets them again after a reboot, and plans after apply and
after a simulated reboot are clean.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision import cli
from mgpu_provision.node.__main__ import handle
from mgpu_provision.protocol import GPU_SETTINGS_UNIT as UNIT
from tests.support.hosts import HostFactory, TestHost, load_twin

KERNEL = "6.8.0-45-generic"
UNIT_FILE = f"/etc/systemd/system/{UNIT}.service"
READY = {"running": KERNEL, "installed": [KERNEL], "nvidia_module_for": [KERNEL], "secure_boot": False}
HEALTHY_GPU = {"power_limit_w": 300, "default_power_limit_w": 350}
RIG = {
    "pair": {
        "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
        "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
        "driver": {"version": "550.54.15", "reboot": "never"},
        "health": {"power_limit_w": 300},
    },
    "hgx": {
        "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 8},
        "bridge": {"kind": "nvswitch", "links": 18},
        "driver": {"version": "550.54.15", "reboot": "never", "fabricmanager": True},
    },
}
REGISTERED = {"fabric": {"state": "completed", "status": "success"}}
# Per host: (GPU index -> health keys its twin adds, top-level twin keys) and the one Change it must show.
SICK: dict[str, tuple[dict[int, dict[str, Any]], dict[str, Any], tuple[str, str, str]]] = {
    "healthy": ({}, {}, ("", "", "")),
    "xid": (
        {1: {"xid": [79]}},
        {},
        ("xid", "verify-failed", "GPU 1 logged Xid 79 since boot (GPU has fallen"),
    ),
    "remap": (
        {0: {"remapped_rows": {"pending": True, "uncorrectable": 1}}},
        {},
        ("memory-repair", "warn", "GPU 0 has remapped rows pending: reset required"),  # DCGM: WARN
    ),
    "hot": (
        {1: {"throttle": ["hw_thermal"]}},
        {},
        ("throttle", "warn", "GPU 1 is in HW thermal slowdown"),  # azurehpc: logged only
    ),
    "lost": ({1: {"lost": True}}, {}, ("gpus", "verify-failed", "GPU 1 (00000000:21:00.0) is lost")),
    # Counters are judged as rates over the time since the node's previous sample (here: none yet, so
    # since boot): 3 replays 30 s after boot fail (DCGM: 1 per minute), 120 CRC errors over months do not.
    "replay": (
        {0: {"nvlink_errors": [{"link": 1, "crc": 500, "replay": 3}]}},
        {"uptime_s": 30},
        ("nvlink-errors", "verify-failed", "GPU 0 link 1: replay 6.0/min over the last 30 s"),
    ),
    "crc-months": ({0: {"nvlink_errors": [{"link": 1, "crc": 120}]}}, {"uptime_s": 23_328_000}, ("", "", "")),
    "gsp": (
        {0: {"xid": [119, 13]}},
        {},
        ("xid", "verify-failed", "GPU 0 logged Xid 119 since boot (GSP RPC timeout): reset the GPU"),
    ),
    "recovery": (
        {1: {"recovery_action": "node_reboot"}},
        {},
        ("recovery-action", "verify-failed", "the driver says GPU 1 needs recovery (node_reboot): reboot"),
    ),
    "sram": (
        {1: {"ecc": {"mode": True, "sram_aggregate_uncorrectable": 1, "dram_aggregate_uncorrectable": 0}}},
        {},
        ("ecc", "verify-failed", "GPU 1 has 1 uncorrectable SRAM (on-chip) ECC error(s)"),
    ),
    "p2p": (
        {1: {"p2p_ok_with": []}},
        {},
        ("topology", "verify-failed", "P2P reads between GPU 0 and GPU 1 fail (CNS: chipset not supported)"),
    ),
    "ecc": (
        {0: {"ecc": {"mode": True, "volatile_uncorrectable": 2}}},
        {},
        ("ecc", "verify-failed", "GPU 0 has 2 uncorrectable ECC error(s) since the driver loaded"),
    ),
    "mig": ({1: {"mig": True}}, {}, ("mig", "manual", "MIG is on on GPU 1, the rig expects off")),
    "hgx-ok": ({i: REGISTERED for i in range(8)}, {}, ("", "", "")),
    "hgx-fabric": (
        {i: REGISTERED if i != 5 else {"fabric": {"state": "in_progress"}} for i in range(8)},
        {},
        (
            "fabric",
            "verify-failed",
            "GPU 5 fabric registration is in_progress: check that nvidia-fabricmanager",
        ),
    ),
    "hgx-degraded": (
        {i: {"fabric": dict(REGISTERED["fabric"], health=["route_unhealthy"] * (i == 3))} for i in range(8)},
        {},
        ("fabric", "verify-failed", "GPU 3 on the NVSwitch fabric: a route is unhealthy"),
    ),
    "hgx-sxid": (
        {i: REGISTERED for i in range(8)},
        {"sxid": [{"switch": "nvidia-nvswitch2", "pci_bus_id": "0000:07:00.0", "code": 20034}]},  # fatal
        ("sxid", "verify-failed", "NVSwitch nvidia-nvswitch2 (0000:07:00.0) logged fatal SXid 20034"),
    ),
    "upgraded": (
        {},
        {"kernel": dict(READY, installed=[KERNEL, "6.8.0-47-generic"])},
        ("kernel", "warn", "not built for kernel 6.8.0-47-generic, the newest installed"),  # a risk
    ),
}


def rig_of(name: str) -> str:
    return "hgx" if name.startswith("hgx") else "pair"


def twin_for(gpus: dict[int, dict[str, Any]], top: dict[str, Any], rig: str = "pair") -> dict[str, Any]:
    twin: dict[str, Any] = yaml.safe_load(load_twin("h100-hgx" if rig == "hgx" else "rtx3090-nvlink"))
    healthy = HEALTHY_GPU if rig == "pair" else {}
    for index, gpu in enumerate(twin["gpus"]):
        gpu["health"] = dict(healthy, **copy.deepcopy(gpus.get(index, {})))
    twin["kernel"] = READY
    twin.update(top)
    return twin


def plan_json(capsys: pytest.CaptureFixture[str], rig: Path, known: Path, *more: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = cli.main(["plan", str(rig), "--known-hosts", str(known), "--json", *more])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def fleet(test_hosts: HostFactory, tmp_path: Path) -> tuple[list[TestHost], Path]:
    hosts = [
        test_hosts.start(name, twin_for(gpus, top, rig_of(name)), rig=rig_of(name))
        for name, (gpus, top, _) in SICK.items()
    ]
    # The boot unit has its own test below; here each host shows its one health Change.
    files = {"profile_d": None, "environment_file": None, "launcher": None, "systemd_dir": None}
    return hosts, test_hosts.write_rig(tmp_path / "rig.yaml", hosts, rigs=RIG, files=files)


def test_each_unhealthy_twin_is_reported_on_its_gpu_and_the_healthy_one_passes(
    fleet: tuple[list[TestHost], Path], test_hosts: HostFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    _, rig = fleet
    code, doc = plan_json(capsys, rig, test_hosts.known_hosts)
    assert code == 2
    for name, (_, _, (resource, action, summary)) in SICK.items():
        entry = doc["hosts"][name]
        assert entry["status"] == "ok", (name, entry)
        got = [(c["resource"], c["action"], c["summary"]) for c in entry["changes"]]
        if not resource:
            assert got == [], (name, got)
            continue
        assert [(r, a) for r, a, _ in got] == [(resource, action)], (name, got)
        assert summary in got[0][2], (name, got[0][2])


def test_apply_converges_power_limit_and_compute_mode_and_they_survive_a_reboot(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    drifted = twin_for({0: {"power_limit_w": 350}, 1: {"compute_mode": "exclusive_process"}}, {})
    host = test_hosts.start("settings", drifted, rig="pair")
    files = {"profile_d": None, "environment_file": None, "launcher": None}  # systemd_dir: the default
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [host], rigs=RIG, files=files)
    code, doc = plan_json(capsys, rig, test_hosts.known_hosts)
    assert code == 2
    got = [(c["resource"], c["summary"]) for c in doc["hosts"]["settings"]["changes"]]
    assert got == [
        ("power", "power limit 350 W → 300 W on GPU 0"),
        ("compute-mode", "compute mode exclusive_process → default on GPU 1"),
        (f"file:{UNIT_FILE}", "new file, 17 lines, mode 0644"),  # one ExecStart: power
        (f"service:{UNIT}", f"enable {UNIT}: it sets power limit 300 W at every boot"),
    ]
    capsys.readouterr()
    assert cli.main(["apply", str(rig), "--known-hosts", str(test_hosts.known_hosts), "--yes"]) == 0
    code, doc = plan_json(capsys, rig, test_hosts.known_hosts)
    assert (code, doc["hosts"]["settings"]["changes"]) == (0, [])
    state = json.loads(host.twin_state_path.read_text())
    assert (state["power_limit_w"], state["compute_mode"]) == ({"0": 300}, {"1": "default"})
    assert state["services"][UNIT] == {"enabled": True, "running": False}  # starts at the next boot
    unit = host.run_in_ns(f"cat {UNIT_FILE}").stdout
    assert "ExecStart=/usr/bin/nvidia-smi -pl 300\n" in unit and "-c " not in unit  # default mode: no line

    reboot(host)
    code, doc = plan_json(capsys, rig, test_hosts.known_hosts)
    assert (code, doc["hosts"]["settings"]["changes"]) == (0, [])
    facts = doc_facts(capsys, rig, test_hosts.known_hosts)["settings"]["facts"]
    assert [g["power_limit_w"] for g in facts["health"]["gpus"]] == [300, 300]
    assert facts["units"] == {UNIT: {"service": "active", "enabled": True}}  # it ran at boot


def test_without_the_boot_unit_a_reboot_brings_the_drift_back(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the unit is for: with `systemd_dir: null` (no unit), the settings apply made are gone after a
    reboot and the plan shows them again; a rig that asks for the defaults has its unit disabled and removed.
    A rig that says nothing about power_limit_w leaves the limit as it is (plan case
    health-power-capped-450-no-rig-limit)."""
    host = test_hosts.start("forgets", twin_for({}, {}), rig="pair")
    files = {"profile_d": None, "environment_file": None, "launcher": None, "systemd_dir": None}
    rig = test_hosts.write_rig(tmp_path / "rig.yaml", [host], rigs=RIG, files=files)
    assert cli.main(["apply", str(rig), "--known-hosts", str(test_hosts.known_hosts), "--yes"]) == 0
    code, doc = plan_json(capsys, rig, test_hosts.known_hosts)
    assert (code, doc["hosts"]["forgets"]["changes"]) == (0, [])
    reboot(host)
    code, doc = plan_json(capsys, rig, test_hosts.known_hosts)
    got = [(c["resource"], c["summary"]) for c in doc["hosts"]["forgets"]["changes"]]
    assert (code, got) == (2, [("power", "power limit 350 W → 300 W on GPU 0, 1")])

    # The rig's unit, then a rig that asks for the default limits: the limits go back to the GPUs' default,
    # the unit (a boot sets the defaults itself) is disabled, then removed.
    managed = test_hosts.write_rig(
        tmp_path / "managed.yaml", [host], rigs=RIG, files=dict(files, systemd_dir="/etc/systemd/system")
    )
    assert cli.main(["apply", str(managed), "--known-hosts", str(test_hosts.known_hosts), "--yes"]) == 0
    assert host.run_in_ns(f"test -f {UNIT_FILE}", check=False).returncode == 0
    defaults = {
        name: dict(rig_type, health={"power_limit_w": "default"}) if "health" in rig_type else rig_type
        for name, rig_type in RIG.items()
    }
    plain = test_hosts.write_rig(
        tmp_path / "plain.yaml", [host], rigs=defaults, files=dict(files, systemd_dir="/etc/systemd/system")
    )
    code, doc = plan_json(capsys, plain, test_hosts.known_hosts)
    got = [(c["resource"], c["action"]) for c in doc["hosts"]["forgets"]["changes"]]
    assert got == [("power", "update"), (f"service:{UNIT}", "update"), (f"file:{UNIT_FILE}", "delete")]
    capsys.readouterr()
    assert cli.main(["apply", str(plain), "--known-hosts", str(test_hosts.known_hosts), "--yes"]) == 0
    assert host.run_in_ns(f"test -f {UNIT_FILE}", check=False).returncode == 1
    code, doc = plan_json(capsys, plain, test_hosts.known_hosts)
    assert (code, doc["hosts"]["forgets"]["changes"]) == (0, [])


def reboot(host: TestHost) -> None:
    """The agent's `reboot` verb on the host's twin: a simulated box reboots by changing its twin's state."""
    # The host's own state folder, as this machine sees it: where its agent keeps the twin's overlay.
    state_dir = str(host.twin_state_path.parent.parent)
    reply, _ = handle(
        "reboot", json.dumps({"args": {}, "simulate": str(host.twin_path), "state_dir": state_dir})
    )
    assert reply["ok"], reply


def doc_facts(capsys: pytest.CaptureFixture[str], rig: Path, known: Path) -> Any:
    capsys.readouterr()
    assert cli.main(["facts", str(rig), "--known-hosts", str(known), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["hosts"]
