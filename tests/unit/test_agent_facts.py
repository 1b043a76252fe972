"""The `facts` verb on simulated nodes (the example twins, link by link) and on this driverless machine."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision.catalog.topology import parse_topology
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.host.files import describe_file
from mgpu_provision.node.host.torch_probe import probe_torch
from mgpu_provision.node.nvidia.select import select_backend
from tests.support.factories import facts_from_twin, write_twin

ROOT = Path(__file__).resolve().parents[2]
TWINS = ROOT / "examples" / "twins"
REFERENCE = ROOT / "tests" / "fixtures" / "topologies"


@pytest.mark.parametrize("name", ["rtx3090-nvlink.yaml", "h100-hgx.yaml", "rtx4090-pcie.yaml"])
def test_example_twin_facts_equal_the_matrix_pair_by_pair(name: str) -> None:
    facts = facts_from_twin(TWINS / name)
    twin = yaml.safe_load((TWINS / name).read_text())
    matrix = parse_topology(twin["topology"])
    assert facts.host.simulated and facts.driver.nvml == "ok"
    assert facts.driver.version == twin["driver"]["version"] and facts.driver.cuda == twin["driver"]["cuda"]
    assert [g.name for g in facts.gpus] == [g["name"] for g in twin["gpus"]]
    assert [g.memory_mib for g in facts.gpus] == [g["memory_mib"] for g in twin["gpus"]]
    assert facts.nvswitch is twin["nvswitch"]
    for a in range(len(facts.gpus)):
        for b in range(a + 1, len(facts.gpus)):
            assert facts.cell(a, b) == matrix.gpu_cell(a, b)
    assert len({g.uuid for g in facts.gpus}) == len(facts.gpus)
    assert facts.gpus == facts_from_twin(TWINS / name).gpus  # generated UUIDs and bus ids are stable


def test_rtx3090_links_end_at_the_other_gpu() -> None:
    facts = facts_from_twin(TWINS / "rtx3090-nvlink.yaml")
    gpu0, gpu1 = facts.gpus
    assert [link.link for link in gpu0.nvlinks] == [0, 1, 2, 3]
    for gpu, other in ((gpu0, gpu1), (gpu1, gpu0)):
        assert all(link.active and link.remote_type == "gpu" for link in gpu.nvlinks)
        assert {link.remote_pci_bus_id for link in gpu.nvlinks} == {other.pci_bus_id}
    pair = facts.pair(0, 1)
    assert pair is not None and pair.p2p_nvlink == "OK" and pair.p2p_read == "OK"
    assert facts.board.vendor == "ASUSTeK COMPUTER INC."
    assert facts.fabricmanager is None


def test_h100_links_end_at_switches_and_fabric_manager_runs() -> None:
    facts = facts_from_twin(TWINS / "h100-hgx.yaml")
    assert all(len(g.nvlinks) == 18 for g in facts.gpus)
    assert {link.remote_type for g in facts.gpus for link in g.nvlinks} == {"switch"}
    bus_ids = {g.pci_bus_id for g in facts.gpus}
    assert not bus_ids & {link.remote_pci_bus_id for g in facts.gpus for link in g.nvlinks}
    assert facts.fabricmanager is not None
    assert (facts.fabricmanager.version, facts.fabricmanager.service) == ("550.54.15", "active")
    assert facts.gpus[0].pcie.gen == 5


def test_rtx4090_has_no_nvlink_and_reports_pcie_classes() -> None:
    facts = facts_from_twin(TWINS / "rtx4090-pcie.yaml")
    assert all(g.nvlinks == [] for g in facts.gpus)
    pair = facts.pair(1, 2)
    assert pair is not None and (pair.pcie, pair.nvlinks, pair.p2p_nvlink) == ("PHB", 0, "NS")
    assert facts.gpus[0].pcie.width == 16  # the default healthy x16 link


def test_a_loose_bridge_takes_both_ends_down(tmp_path: Path) -> None:
    text = (REFERENCE / "2x-rtx3090-nvlink-bridge.txt").read_text()
    facts = facts_from_twin(write_twin(tmp_path, text, 2, nvlink_down=[{"gpu": 1, "link": 2}]))
    assert [link.active for link in facts.gpus[1].nvlinks] == [True, True, False, True]
    assert [link.active for link in facts.gpus[0].nvlinks] == [True, True, False, True]
    assert facts.gpus[1].nvlinks[2].remote_type is None  # NVML is not asked about an inactive link
    assert facts.cell(0, 1) == "NV3"


def test_a_down_switch_link_lowers_only_that_gpus_pairs(tmp_path: Path) -> None:
    text = (REFERENCE / "8x-h100-hgx-nvswitch-with-nics.txt").read_text()
    facts = facts_from_twin(write_twin(tmp_path, text, 8, nvswitch=True, nvlink_down=[{"gpu": 3, "link": 0}]))
    assert facts.cell(3, 5) == "NV17" and facts.cell(5, 3) == "NV17"
    assert facts.cell(0, 1) == "NV18"


def test_links_are_matched_by_the_full_pci_address_across_domains(tmp_path: Path) -> None:
    # A multi-segment host (Grace, GB200): bus 01:00.0 exists in domain 0 and in domain 1.
    matrix = (
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
        "GPU0\t X \tNV4\tSYS\tSYS\t0\nGPU1\tNV4\t X \tSYS\tSYS\t0\n"
        "GPU2\tSYS\tSYS\t X \tNV4\t0\nGPU3\tSYS\tSYS\tNV4\t X \t0\n"
    )
    buses = ["00000000:01:00.0", "00000000:02:00.0", "00000001:01:00.0", "00000001:02:00.0"]
    twin = write_twin(tmp_path, matrix, 4)
    data = json.loads(twin.read_text())
    for gpu, bus in zip(data["gpus"], buses, strict=True):
        gpu["pci_bus_id"] = bus
    twin.write_text(json.dumps(data))
    facts = facts_from_twin(twin)
    assert (facts.cell(0, 1), facts.cell(2, 3)) == ("NV4", "NV4")
    assert (facts.cell(1, 2), facts.cell(0, 2), facts.cell(1, 3)) == ("SYS", "SYS", "SYS")


def test_mesh_links_are_handed_out_in_peer_order(tmp_path: Path) -> None:
    mesh = (
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\n"
        "GPU0\t X \tNV1\tNV2\t0\nGPU1\tNV1\t X \tSYS\t0\nGPU2\tNV2\tSYS\t X \t0\n"
    )
    facts = facts_from_twin(write_twin(tmp_path, mesh, 3))
    remotes = [link.remote_pci_bus_id for link in facts.gpus[0].nvlinks]
    assert remotes == [facts.gpus[1].pci_bus_id, facts.gpus[2].pci_bus_id, facts.gpus[2].pci_bus_id]
    assert (facts.cell(0, 1), facts.cell(0, 2), facts.cell(1, 2)) == ("NV1", "NV2", "SYS")


def test_no_driver_twin_reads_like_a_box_without_driver(tmp_path: Path) -> None:
    twin = write_twin(tmp_path, None, 2, driver={"version": None})
    facts = facts_from_twin(twin)
    assert facts.driver.nvml == "no-driver"
    assert facts.driver.message == "no NVIDIA driver is installed (libnvidia-ml.so.1 not found)"
    assert facts.gpus == [] and facts.driver.loaded is None and not facts.driver.reboot_required


def test_version_mismatch_hides_gpu_facts_and_asks_for_a_reboot(tmp_path: Path) -> None:
    twin = write_twin(tmp_path, None, 2, driver={"version": "550.90.07", "loaded": "550.54.15"})
    facts = facts_from_twin(twin)
    assert facts.driver.nvml == "version-mismatch"
    assert facts.driver.message is not None and "reboot" in facts.driver.message
    assert (facts.driver.installed, facts.driver.loaded, facts.driver.reboot_required) == (
        "550.90.07",
        "550.54.15",
        True,
    )
    assert facts.gpus == [] and facts.pairs == []


def test_installed_driver_without_a_loaded_module_asks_for_a_reboot(tmp_path: Path) -> None:
    twin = write_twin(tmp_path, None, 2, driver={"version": "550.54.15", "loaded": None})
    facts = facts_from_twin(twin)
    assert facts.driver.nvml == "driver-not-loaded"
    assert (facts.driver.installed, facts.driver.loaded, facts.driver.reboot_required) == (
        "550.54.15",
        None,
        True,
    )


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this machine has an NVIDIA driver")
def test_real_nvml_without_driver_is_a_fact_not_a_traceback() -> None:
    facts = facts_from_twin(None)
    assert not facts.host.simulated
    assert facts.driver.nvml == "no-driver"
    assert facts.driver.message == "no NVIDIA driver is installed (libnvidia-ml.so.1 not found)"
    assert facts.host.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # Until the child has exec'd, /proc shows the forking pytest's command line: wait for its own.
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + 10
    while b"time.sleep(60)" not in cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def test_twin_processes_are_real_processes_read_from_proc(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    gone = 2**22 + 1  # above the largest pid_max Linux allows: never a live process
    processes = [{"pid": sleeper.pid, "gpu": 1, "used_mib": 1200}, {"pid": gone, "gpu": 0, "used_mib": 5}]
    facts = facts_from_twin(write_twin(tmp_path, None, 2, processes=processes))
    by_pid = {p.pid: p for p in facts.processes}
    live = by_pid[sleeper.pid]
    assert (live.gpu, live.used_mib, live.ppid, live.alive) == (1, 1200, os.getpid(), True)
    assert live.command is not None and "time.sleep(60)" in live.command
    assert live.owner is not None and live.start_time is not None and live.state in ("S", "R")
    assert not live.orphaned
    assert by_pid[gone].alive is False


def test_files_sli_and_torch_facts(tmp_path: Path) -> None:
    managed = tmp_path / "env.sh"
    managed.write_text("export A=1\n")
    managed.chmod(0o640)
    binary = tmp_path / "blob"
    binary.write_bytes(b"\xff\xfe")
    xorg = tmp_path / "xorg.conf.d"
    xorg.mkdir()
    (xorg / "10-other.conf").write_text('Section "Screen"\n  # Option "SLI" "On"\nEndSection\n')
    (xorg / "20-nvidia.conf").write_text('Section "Screen"\n    Option  "SLI" "Mosaic"\nEndSection\n')
    facts = facts_from_twin(
        TWINS / "rtx3090-nvlink.yaml",
        files=[str(managed), str(binary), str(tmp_path / "absent")],
        include_content=True,
        xorg_paths=[str(tmp_path / "xorg.conf"), str(xorg)],
        python=str(tmp_path / "no-python"),
    )
    env, blob, absent = facts.files
    assert (env.exists, env.mode, env.content) == (True, "0640", "export A=1\n")
    assert env.sha256 == hashlib.sha256(b"export A=1\n").hexdigest()
    assert blob.exists and blob.content is None
    assert not absent.exists and absent.sha256 is None
    assert (facts.sli.mode, facts.sli.file) == ("Mosaic", str(xorg / "20-nvidia.conf"))
    assert facts.torch is not None and not facts.torch.ok
    assert facts.torch.error == f"{tmp_path / 'no-python'} does not exist"


@pytest.mark.skipif(
    subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0,
    reason="/usr/bin/python3 has torch here",
)
def test_torch_missing_is_said_plainly() -> None:
    facts = facts_from_twin(TWINS / "rtx4090-pcie.yaml", python="/usr/bin/python3")
    assert facts.torch is not None
    assert facts.torch.error == "torch is not installed in /usr/bin/python3"


@pytest.mark.torch
def test_torch_probe_reports_version_and_devices() -> None:
    facts = facts_from_twin(TWINS / "rtx4090-pcie.yaml", python=sys.executable)
    assert facts.torch is not None and facts.torch.ok, facts.torch
    import torch

    assert facts.torch.version == torch.__version__
    assert facts.torch.cuda_available is False and facts.torch.device_count == 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"topology": "garbage"}, "topology: line 1: header has no 'CPU Affinity' column"),
        ({"gpus": [{"name": "A", "memory_mib": 1}]}, "topology has 2 GPUs, gpus lists 1"),
        ({"gpus": [{"memory_mib": 1}, {"name": "A", "memory_mib": 1}]}, "gpus[0].name must be a string"),
        ({"gpus": [{"name": "A"}, {"name": "A", "memory_mib": 1}]}, "gpus[0].memory_mib must be an integer"),
        ({"nvlink_down": [{"gpu": 0}]}, "nvlink_down[].link must be an integer"),
        ({"processes": {"pid": 1}}, "processes must be a list"),
        ({"topology": None, "topology_file": "missing.txt"}, "topology_file: cannot read"),
        (
            {
                "gpus": [
                    {"name": "A", "memory_mib": 1, "health": {"ecc": {"mode": "on"}}},
                    {"name": "A", "memory_mib": 1},
                ]
            },
            "gpus[0].health.ecc.mode must be true or false, got 'on'",
        ),
        (
            {
                "gpus": [
                    {"name": "A", "memory_mib": 1},
                    {"name": "A", "memory_mib": 1, "health": {"xids": [79]}},
                ]
            },
            "gpus[1].health has an unknown key 'xids' (known: xid, ecc,",
        ),
        (
            {
                "gpus": [
                    {"name": "A", "memory_mib": 1, "health": {"throttle": ["hot"]}},
                    {"name": "A", "memory_mib": 1},
                ]
            },
            "gpus[0].health.throttle must be a list of these: sw_power_cap, hw_slowdown,",
        ),
        (
            {
                "gpus": [
                    {"name": "A", "memory_mib": 1, "health": {"nvlink_errors": [{"crc": 1}]}},
                    {"name": "A", "memory_mib": 1},
                ]
            },
            "gpus[0].health.nvlink_errors[0].link is required",
        ),
        ({"kernel": {"installed": ["6.8.0-45-generic"]}}, "kernel.running is required"),
        (
            {"kernel": {"running": "6.8.0-45-generic", "secure_boot": "yes"}},
            "kernel.secure_boot must be true or false",
        ),
    ],
)
def test_bad_twins_are_refused_with_the_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    change = dict(change)
    text = change.pop("topology", (REFERENCE / "2x-rtx3090-nvlink-bridge.txt").read_text())
    twin = write_twin(tmp_path, text, 2, **change)
    with pytest.raises(AgentFailure) as caught:
        select_backend(str(twin))
    assert caught.value.kind == "twin"
    assert message in caught.value.message


def test_unreadable_twin_documents(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "twin.yaml"
    bad_yaml.write_text("driver: &x 1\n")
    with pytest.raises(AgentFailure, match="line 1: anchors"):
        select_backend(str(bad_yaml))
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(AgentFailure, match="the document must be a mapping"):
        select_backend(str(listed))
    with pytest.raises(AgentFailure, match="cannot read twin file"):
        select_backend(str(tmp_path / "nope.yaml"))


def test_topology_file_is_relative_to_the_twin(tmp_path: Path) -> None:
    (tmp_path / "topo.txt").write_text((REFERENCE / "5x-rtx4090-pcie-dual-socket.txt").read_text())
    facts = facts_from_twin(write_twin(tmp_path, None, 5, topology_file="topo.txt"))
    assert facts.cell(3, 4) == "PHB"


@pytest.mark.parametrize(
    ("release", "pretty"),
    [
        (
            {
                "id": "sles",
                "version_id": "15.6",
                "like": ["suse"],
                "pretty_name": "SUSE Linux Enterprise Server 15 SP6",
            },
            "SUSE Linux Enterprise Server 15 SP6",
        ),
        ({"id": "rocky", "version_id": "9.5", "like": ["rhel"]}, "rocky 9.5"),
        (None, "Ubuntu 22.04 LTS"),
    ],
)
def test_a_simulated_nodes_distribution_comes_from_the_twin_alone(
    tmp_path: Path, release: dict[str, Any] | None, pretty: str
) -> None:
    extra = {"os_release": release} if release else {}
    host = facts_from_twin(write_twin(tmp_path, None, 1, **extra)).host
    want = release or {"id": "ubuntu", "version_id": "22.04", "like": ["debian"]}
    assert (host.os_id, host.os_version_id, host.os_like) == (want["id"], want["version_id"], want["like"])
    assert host.os == pretty  # never this machine's own PRETTY_NAME next to the twin's ID


def test_a_real_nodes_distribution_is_its_own_os_release() -> None:
    host = facts_from_twin(None).host
    text = Path("/etc/os-release").read_text()
    assert host.os_id is not None and f"ID={host.os_id}" in text.replace('"', "")
    assert host.os in text


def test_schema_describes_every_field_the_examples_use() -> None:
    schema = json.loads((ROOT / "schemas" / "twin.schema.json").read_text())
    gpu_fields = set(schema["properties"]["gpus"]["items"]["properties"])
    for path in TWINS.glob("*.yaml"):
        twin = yaml.safe_load(path.read_text())
        assert set(twin) <= set(schema["properties"]), path
        assert all(set(gpu) <= gpu_fields for gpu in twin["gpus"]), path
        assert set(schema["required"]) <= set(twin)


def fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    "body, error",
    [
        ("echo boom >&2; exit 3", "the torch probe in {py} failed: boom"),
        ("exit 5", "the torch probe in {py} failed: exit code 5"),
        (
            'echo \'{"import_error": "libcudart.so.12: cannot open", "missing": false}\'',
            "import torch failed in {py}: libcudart.so.12: cannot open",
        ),
        (
            'echo \'{"import_error": "No module named torch", "missing": true}\'',
            "torch is not installed in {py}",
        ),
        ("sleep 5", "the torch probe in {py} did not finish within 0.5 s"),
    ],
)
def test_torch_probe_failures_are_plain(tmp_path: Path, body: str, error: str) -> None:
    python = fake_python(tmp_path, body)
    probe = probe_torch(python, timeout_s=0.5)
    assert probe["ok"] is False and probe["error"] == error.format(py=python)


def test_a_folder_given_as_managed_file_does_not_break_facts(tmp_path: Path) -> None:
    assert describe_file(str(tmp_path), include_content=True) == {"path": str(tmp_path), "exists": True}


A100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}


def test_twin_health_reads_as_nvml_would_answer(tmp_path: Path) -> None:
    sick = {
        "xid": [79, 79],
        "ecc": {
            "mode": True,
            "volatile_uncorrectable": 2,
            "sram_volatile_uncorrectable": 2,
            "sram_aggregate_uncorrectable": 3,
            "dram_volatile_uncorrectable": 0,
            "sram_threshold_exceeded": True,
        },
        "remapped_rows": {"pending": True, "uncorrectable": 1},
        "nvlink_errors": [{"link": 1, "crc": 500}],
        "throttle": ["hw_slowdown", "sw_power_cap"],
        "power_limit_w": 300,
        "default_power_limit_w": 400,
        "enforced_power_limit_w": 250,
        "compute_mode": "exclusive_process",
        "mig": True,
        "fabric": {
            "state": "in_progress",
            "status": "success",
            "health": ["degraded_bandwidth", "insufficient_nvlinks"],
            "summary": "limited_capacity",
        },
        "recovery_action": "drain_and_reset",
        "violation_ms": {"thermal": 1500},
    }
    kernel = {"running": "6.8.0-45-generic", "installed": ["6.8.0-45-generic", "6.8.0-47-generic"]}
    text = (REFERENCE / "2x-rtx3090-nvlink-bridge.txt").read_text()
    sxid = [{"switch": "nvidia-nvswitch1", "pci_bus_id": "0000:06:00.0", "code": 20034, "fatal": True}]
    twin = write_twin(tmp_path, text, 2, kernel=kernel, sxid=sxid, uptime_s=7_776_000)
    data = json.loads(twin.read_text())
    data["gpus"] = [dict(A100, health=sick), dict(A100, health={"lost": True})]
    twin.write_text(json.dumps(data))
    facts = facts_from_twin(twin)
    assert [g.index for g in facts.gpus] == [0] and [g.index for g in facts.lost_gpus] == [1]
    assert facts.health is not None and facts.health.xid_source == "twin"
    assert [(x.gpu, x.pci_bus_id, x.code) for x in facts.health.xid] == [(0, "00000000:11:00", 79)] * 2
    gpu = facts.health.gpus[0]
    assert (gpu.ecc_mode, gpu.ecc_volatile_uncorrectable, gpu.ecc_aggregate_uncorrectable) == (True, 2, 0)
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_failure, gpu.retired_pages_pending) == (
        True,
        False,
        None,
    )
    assert [(e.link, e.crc, e.replay) for e in gpu.nvlink_errors] == [
        (0, 0, 0),
        (1, 500, 0),
        (2, 0, 0),
        (3, 0, 0),
    ]
    assert gpu.throttle == ["sw_power_cap", "hw_slowdown"]
    assert (gpu.power_limit_w, gpu.default_power_limit_w, gpu.compute_mode, gpu.mig) == (
        300,
        400,
        "exclusive_process",
        True,
    )
    assert (gpu.fabric_state, gpu.fabric_status) == ("in_progress", "success")
    assert (gpu.fabric_health, gpu.fabric_summary) == (
        ["degraded_bandwidth", "insufficient_nvlinks"],
        "limited_capacity",
    )
    assert (gpu.recovery_action, gpu.enforced_power_limit_w) == ("drain_and_reset", 250)
    assert gpu.violation_ms == {"power": 0, "thermal": 1500, "board_limit": 0, "reliability": 0}
    sram = (gpu.ecc_sram_volatile_uncorrectable, gpu.ecc_sram_aggregate_uncorrectable)
    assert sram == (2, 3) and gpu.sram_threshold_exceeded is True
    assert (gpu.ecc_dram_volatile_uncorrectable, gpu.ecc_dram_aggregate_uncorrectable) == (0, None)
    assert [(s.switch, s.code, s.fatal) for s in facts.health.sxid] == [("nvidia-nvswitch1", 20034, True)]
    # No state folder: the changes are the totals, over the twin's 90 days since boot.
    assert (facts.health.counters_since, facts.health.counters_interval_s) == ("boot", 7_776_000)
    assert gpu.nvlink_errors[1].change == {"crc": 500, "replay": 0, "recovery": 0}
    assert facts.health.kernel is not None and facts.health.kernel.nvidia_module_for == []
    assert facts.health.not_checked == []


def test_a_twin_without_health_is_a_healthy_box(tmp_path: Path) -> None:
    text = (REFERENCE / "2x-rtx3090-nvlink-bridge.txt").read_text()
    facts = facts_from_twin(write_twin(tmp_path, text, 2))
    assert facts.health is not None and facts.health.xid == [] and facts.health.kernel is None
    gpu = facts.health.gpus[0]
    assert (gpu.ecc_mode, gpu.power_limit_w, gpu.mig, gpu.fabric_state) == (None, None, None, None)
    assert (gpu.compute_mode, gpu.throttle) == ("default", [])
    assert facts.health.not_checked == [
        "ecc: not supported on GPU 0, 1",
        "memory repair: not supported on GPU 0, 1",
        "power limit: not supported on GPU 0, 1",
        "recovery action: not supported on GPU 0, 1",
        "violation time: not supported on GPU 0, 1",
        "kernel: not read (no /lib/modules, or a twin without `kernel`)",
    ]
    assert [p.p2p_read for p in facts.pairs] == ["OK"]


def test_p2p_ok_with_lists_the_peers_reads_reach(tmp_path: Path) -> None:
    text = (REFERENCE / "2x-rtx3090-nvlink-bridge.txt").read_text()
    twin = write_twin(tmp_path, text, 2)
    data = json.loads(twin.read_text())
    data["gpus"][1]["health"] = {"p2p_ok_with": []}
    twin.write_text(json.dumps(data))
    assert [(p.p2p_read, p.p2p_nvlink) for p in facts_from_twin(twin).pairs] == [("CNS", "OK")]


# The health part of the twin format exactly as issue 15 gives it (with a topology for two GPUs).
ISSUE_TWIN = """\
driver: {version: "550.54.15", loaded: "550.54.15", cuda: "12.4"}
gpus:
  - name: "NVIDIA A100-SXM4-80GB"
    memory_mib: 81920
    health:
      xid: [79]
      ecc: {mode: true, volatile_uncorrectable: 0, aggregate_uncorrectable: 0,
            sram_volatile_uncorrectable: 0, sram_aggregate_uncorrectable: 0,
            dram_volatile_uncorrectable: 0, dram_aggregate_uncorrectable: 0, sram_threshold_exceeded: false}
      retired_pages: {pending: false, count: 0}
      remapped_rows: {pending: false, failure: false, uncorrectable: 0}
      nvlink_errors: [{link: 0, crc: 0, replay: 0, recovery: 0, recovery_events: 0, recovery_failed: 0,
                       symbol: 0, malformed: 0, dropped: 0, rx_errors: 0, rx_remote: 0, rx_general: 0,
                       integrity: 0, effective_errors: 0}]
      nvlink_ber: {effective: [15, 255], symbol: [15, 238]}
      nvlink_error_api: counters
      throttle: []
      power_limit_w: 400
      default_power_limit_w: 400
      enforced_power_limit_w: 400
      recovery_action: none
      violation_ms: {power: 0, thermal: 0, board_limit: 0, reliability: 0}
      compute_mode: default
      mig: false
      fabric: {state: completed, status: success, health: [], summary: healthy, clique_id: 3,
               cluster_uuid: "9b0c6f0e-3d5a-4c1e-8f2b-6a7d1e4c9b20"}
      lost: false
      p2p_ok_with: [1]
      reset: succeeds
      memory_unrepairable: false
  - name: "NVIDIA A100-SXM4-80GB"
    memory_mib: 81920
kernel: {running: "6.8.0-45-generic", installed: ["6.8.0-45-generic", "6.8.0-47-generic"],
         nvidia_module_for: ["6.8.0-45-generic"], secure_boot: false, module_signed: true,
         module_key_enrolled: true, next_boot: "6.8.0-45-generic"}
uptime_s: 86400
sxid: [{switch: nvidia-nvswitch0, pci_bus_id: "0000:05:00.0", code: 12028, fatal: false}]
"""


def test_the_issue_twin_format_is_read_and_described_by_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "twin.yaml"
    path.write_text(ISSUE_TWIN)
    facts = facts_from_twin(path)
    assert facts.health is not None and facts.health.kernel is not None
    assert facts.health.kernel.nvidia_module_for == ["6.8.0-45-generic"]
    assert [(x.gpu, x.code) for x in facts.health.xid] == [(0, 79)]
    schema = json.loads((ROOT / "schemas" / "twin.schema.json").read_text())
    twin = yaml.safe_load(ISSUE_TWIN)
    health = schema["properties"]["gpus"]["items"]["properties"]["health"]["properties"]
    assert set(twin["gpus"][0]["health"]) == set(health)
    for key in ("ecc", "retired_pages", "remapped_rows", "fabric", "violation_ms"):
        assert set(twin["gpus"][0]["health"][key]) == set(health[key]["properties"]), key
    link = health["nvlink_errors"]["items"]["properties"]
    assert set(twin["gpus"][0]["health"]["nvlink_errors"][0]) == set(link)
    assert set(twin["kernel"]) == set(schema["properties"]["kernel"]["properties"])
    assert set(twin["sxid"][0]) == set(schema["properties"]["sxid"]["items"]["properties"])
    assert [(x.switch, x.fatal) for x in facts.health.sxid] == [("nvidia-nvswitch0", False)]


def test_the_blackwell_twins_read_as_their_boxes() -> None:
    """HGX B200: NVSwitch, open modules, Fabric Manager at the driver's version. GB200 compute tray: links
    to switch trays, no Fabric Manager of its own, every GPU registered in the rack's NVLink domain."""
    hgx = facts_from_twin(TWINS / "hgx-b200.yaml")
    assert (hgx.nvswitch, hgx.driver.kernel_module, len(hgx.gpus)) == (True, "open", 8)
    assert hgx.fabricmanager is not None and hgx.fabricmanager.version == "580.95.05"
    assert all(gpu.fabric is None for gpu in hgx.gpus)  # registered, but in no multi-node domain
    tray = facts_from_twin(TWINS / "gb200-tray.yaml")
    assert (tray.nvswitch, len(tray.gpus), tray.gpus[0].name) == (True, 4, "NVIDIA GB200")
    assert tray.fabricmanager is not None and tray.fabricmanager.version is None
    fabrics = {(g.fabric.clique_id, g.fabric.cluster_uuid) for g in tray.gpus if g.fabric is not None}
    assert fabrics == {(7, "5e1c9a52-7f3d-4a8b-9c0e-2d6f8b1a4c37")}


def test_imex_facts_of_a_tray(tmp_path: Path) -> None:
    twin = tmp_path / "tray.yaml"
    twin.write_text((TWINS / "gb200-tray.yaml").read_text())
    assert facts_from_twin(twin).imex is None  # not installed yet
    twin.write_text(twin.read_text() + 'imex: "580.95.05"\n')
    twin.write_text(
        twin.read_text().replace(
            "nvidia-imex: {enabled: false, running: false}", "nvidia-imex: {enabled: true, running: true}"
        )
    )
    imex = facts_from_twin(twin).imex
    assert imex is not None and (imex.version, imex.service, imex.enabled, imex.channels) == (
        "580.95.05",
        "active",
        True,
        1,
    )
