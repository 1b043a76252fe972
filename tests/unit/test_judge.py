"""The shipped judge: its checks on plain data, its expectation record through JSON, the same findings as
plan for the same facts and rig, and all of it running from the agent zipapp on a stdlib-only python."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision.catalog.topology import parse_topology
from mgpu_provision.fleet.bundle import build_agent
from mgpu_provision.judge import driver, files, health, inventory, topology, xids
from mgpu_provision.judge.records import Expectation, Finding, expectation_from_json, expectation_to_json
from mgpu_provision.judge.verdict import judge_node
from mgpu_provision.plan import expectation
from mgpu_provision.plan.host import desired_files, expectation_of, host_context, plan_host
from mgpu_provision.rig import LoadedRig, load_rig
from mgpu_provision.rig.models import Health, Host
from tests.support.agent import NODE_PYTHON, TWINS, run_agent
from tests.support.factories import TOPOLOGIES, bus_id, case_facts, facts, gpu
from tests.support.plan_cases import CASES, load_case

PAIR = Expectation(gpu_model="NVIDIA GeForce RTX 3090", gpu_count=2, critical_xids=xids.CRITICAL)
OK = {"nvml": "ok", "version": "550.54.15", "installed": "550.54.15", "loaded": "550.54.15"}


def box(**fields: Any) -> dict[str, Any]:
    """Facts as plain JSON, as the agent's facts verb prints them: a healthy pair of RTX 3090s."""
    return {"driver": dict(OK), "gpus": [gpu(0), gpu(1)], **fields}


def checks(findings: list[Finding]) -> list[tuple[str, str | None, str | None]]:
    return [(f.check, f.current, f.desired) for f in findings]


# --- the checks on plain data --------------------------------------------------------------------------


def test_xids_are_grouped_by_gpu_and_code_and_only_critical_ones_count() -> None:
    events = [
        {"gpu": 0, "pci_bus_id": bus_id(0), "code": 79},
        {"gpu": 0, "pci_bus_id": bus_id(0), "code": 79},
        {"gpu": None, "pci_bus_id": "0000:41:00", "code": 48},
        {"gpu": 1, "pci_bus_id": bus_id(1), "code": 13},  # an application error, not critical
    ]
    found = health.health(box(health={"xid": events}), PAIR)
    assert [(f.gpu, f.current) for f in found] == [(0, "Xid 79"), (None, "Xid 48")]
    assert found[0].message == "GPU 0 logged Xid 79 since boot (2 times) (GPU has fallen off the bus)"
    assert found[0].summary == f"{found[0].message}: {xids.CATALOG[79].advice}"
    assert found[1].summary.startswith("the GPU at 0000:41:00 (no longer listed by NVML)")
    assert health.health(box(health={"xid": events}), PAIR._replace(health_skip=("xid",))) == []


def test_per_gpu_health_judges_what_was_read_and_nothing_else() -> None:
    gpus = [
        {"index": 0, "ecc_mode": False, "ecc_pending_mode": True, "ecc_volatile_uncorrectable": 2},
        {
            "index": 1,
            "remapped_rows_failure": True,
            "remapped_rows_pending": True,
            "throttle": ["hw_thermal"],
        },
        {
            "index": 2,
            "ecc_mode": None,
            "nvlink_errors": [{"link": 3, "crc": 101, "replay": 100, "recovery": 0}],
        },
    ]
    found = health.health(box(health={"gpus": gpus}), PAIR._replace(ecc=True))
    assert checks(found) == [
        ("ecc", "off", "on"),
        ("ecc", "2", "0"),
        ("memory-repair", "remap failed", "no failure"),  # the failure, not the pending remap too
        ("throttle", "HW thermal slowdown", "no hardware slowdown"),
        ("nvlink-errors", "101 CRC", "at most 100"),
    ]
    assert "a change is pending: reboot to apply it" in found[0].summary
    assert [f.gpu for f in found] == [0, 0, 1, 1, 2]
    assert all(f.advice and f.summary == f"{f.message}: {f.advice}" for f in found)  # each says what to do


def test_fabric_registration_is_judged_on_nvswitch_rigs_only() -> None:
    facts_ = box(health={"gpus": [{"index": 0, "fabric_state": "in_progress"}]})
    assert health.health(facts_, PAIR) == []
    found = health.health(facts_, PAIR._replace(bridge_kind="nvswitch"))
    assert checks(found) == [("fabric", "in_progress", "completed")]


def test_kernel_readiness_names_the_next_boots_kernel() -> None:
    kernel = {
        "running": "6.8.0-45-generic",
        "installed": ["6.8.0-45-generic", "6.8.0-47-generic"],
        "nvidia_module_for": ["6.8.0-45-generic"],
    }
    found = health.kernel(box(health={"kernel": kernel}), PAIR)
    assert checks(found) == [("kernel", "6.8.0-47-generic: not built", "6.8.0-47-generic: built")]
    no_driver = box(driver={"nvml": "no-driver"}, health={"kernel": kernel})
    assert health.kernel(no_driver, PAIR) == []  # the driver check says what to install


def test_inventory_counts_lost_gpus_and_names_the_odd_one() -> None:
    found = inventory.inventory(box(gpus=[gpu(0), gpu(1, "NVIDIA GeForce RTX 2080")]), PAIR)
    assert [f.summary for f in found] == [
        "GPUs are not matched: GPU 1 is an NVIDIA GeForce RTX 2080, the others are NVIDIA GeForce RTX 3090"
    ]
    lost = box(gpus=[gpu(0)], lost_gpus=[{"index": 1, "pci_bus_id": bus_id(1), "error": "GPU is lost"}])
    assert inventory.inventory(lost, PAIR) == [inventory.inventory(lost, PAIR)[0]]
    assert checks(inventory.inventory(lost, PAIR._replace(gpu_count=4))) == [
        ("gpus", "lost", "present"),
        ("gpus", "2", "4"),
    ]
    dead = inventory.inventory(box(driver={"nvml": "no-driver", "message": "no libnvidia-ml"}), PAIR)
    assert [f.summary for f in dead] == ["NVML is not usable (no-driver): no libnvidia-ml; GPUs not checked"]


def test_pcie_width_as_it_runs_and_generation_by_its_maximum() -> None:
    slow = [gpu(0, pcie={"gen": 1, "max_gen": 4, "width": 16}), gpu(1, pcie={"width": 4, "max_width": 16})]
    found = inventory.pcie(box(gpus=slow), PAIR._replace(min_pcie_width=16, min_pcie_gen=4))
    assert checks(found) == [("pcie", "x4", "x16")]
    assert found[0].gpu == 1 and "slot gives x4 of its x16" in found[0].summary


def test_a_bridged_pair_without_nvlink_and_a_farther_captured_cell() -> None:
    want = PAIR._replace(bridge_kind="nvlink-bridge", bridge_pairs=((0, 1),), bridge_links=4)
    pcie_only = box(pairs=[{"a": 0, "b": 1, "pcie": "SYS", "nvlinks": 0}])
    assert checks(topology.topology(pcie_only, want)) == [("topology", "no NVLink", "NV4")]
    captured = PAIR._replace(topology=(("X", "PHB"), ("PHB", "X")))
    found = topology.topology(pcie_only, captured)
    assert checks(found) == [("topology", "SYS", "PHB")]
    assert "another bridge or socket" in found[0].summary
    nearer = box(pairs=[{"a": 0, "b": 1, "pcie": "PIX", "nvlinks": 0}])
    assert topology.topology(nearer, captured) == []


def test_driver_installed_against_the_pin_then_loaded() -> None:
    pinned = PAIR._replace(driver_branch="550")
    assert driver.driver(box(), pinned) == []
    assert [f.kind for f in driver.driver(box(), PAIR._replace(driver_version="535.183.01"))] == [
        "not-installed"
    ]
    after_install = box(driver={**OK, "installed": "550.90.07", "reboot_required": True})
    assert checks(driver.driver(after_install, pinned)) == [("driver", "550.54.15", "550.90.07")]
    assert driver.driver(box(), PAIR) == []  # no pin, nothing to judge


def test_fabric_manager_missing_behind_and_stopped() -> None:
    nvswitch = PAIR._replace(fabricmanager=True)
    assert [f.kind for f in driver.fabricmanager(box(), nvswitch)] == ["missing"]
    behind = box(fabricmanager={"version": "550.54.14", "service": "failed"})
    assert checks(driver.fabricmanager(behind, nvswitch)) == [
        ("fabricmanager", "550.54.14", "550.54.15"),
        ("fabricmanager", "failed", "active"),
    ]
    assert driver.fabricmanager(behind, PAIR) == []  # not expected on this rig


def test_managed_file_digest_against_what_apply_wrote() -> None:
    want = PAIR._replace(files={"/etc/a": "a" * 64, "/etc/b": "b" * 64, "/etc/c": "c" * 64})
    reported = [
        {"path": "/etc/a", "exists": True, "sha256": "a" * 64},
        {"path": "/etc/b", "exists": True, "sha256": "f" * 64},
        {"path": "/etc/c", "exists": False},
    ]
    found = files.files(box(files=reported), want)
    assert [(f.check, f.kind) for f in found] == [("file:/etc/b", "changed"), ("file:/etc/c", "missing")]
    assert files.same_digest("a" * 64, "a" * 64) and not files.same_digest(None, "a" * 64)


def test_findings_carry_the_gpus_uuid() -> None:
    found = judge_node(box(gpus=[gpu(0), gpu(1, "NVIDIA GeForce RTX 2080")]), PAIR._replace(gpu_count=3))
    assert [(f.gpu, f.uuid) for f in found] == [(None, None), (None, None)]
    lost = judge_node(box(gpus=[gpu(0, pcie={"width": 8})]), PAIR._replace(gpu_count=1, min_pcie_width=16))
    assert [(f.gpu, f.uuid) for f in lost] == [(0, gpu(0)["uuid"])]


# --- the expectation record ----------------------------------------------------------------------------


def test_rig_default_critical_xids_are_the_judges_and_each_has_advice() -> None:
    assert Health().critical_xids == list(xids.CRITICAL)
    assert set(xids.CRITICAL) <= set(xids.CATALOG)


def rig_expectation(loaded: LoadedRig, host: Host, files: dict[str, str] | None = None) -> Expectation:
    """The rig's record for `host`, with its captured topology and these managed files' digests."""
    return expectation.for_rig(loaded, host, files)


def test_expectation_round_trips_through_json(tmp_path: Path) -> None:
    case = load_case(Path(__file__).parent / "plan_cases" / "bridge-captured-only-loose.yaml")
    loaded, host = _load(case, tmp_path)
    want = rig_expectation(loaded, host, {"/etc/profile.d/x.sh": "0" * 64})
    assert want.topology is not None and want.topology[0][0] == "X"
    text = json.dumps(expectation_to_json(want))
    assert expectation_from_json(json.loads(text)) == want


def test_the_expectation_after_apply_holds_the_digests_of_the_files_apply_writes(tmp_path: Path) -> None:
    case = load_case(Path(__file__).parent / "plan_cases" / "bridge-loose-link.yaml")
    case["rig"]["files"] = {
        "profile_d": str(tmp_path / "profile.sh"),
        "environment_file": None,
        "launcher": None,
    }
    case["rig"]["hosts"][0]["connection"] = "local"  # relative and local paths are the local hosts' only
    loaded, host = _load(case, tmp_path)
    box_facts = case_facts(case)
    want = expectation_of(loaded, host, box_facts)
    written = {f.path: f.sha256 for f in desired_files(host_context(loaded, host, box_facts), checked=True)}
    assert want.files == written and list(written) == [str(tmp_path / "profile.sh")]
    # Before apply the node has no such file: the judge says so, as plan says "create".
    assert [(f.check, f.kind) for f in files.files(json.loads(box_facts.model_dump_json()), want)] == [
        (f"file:{tmp_path / 'profile.sh'}", "missing")
    ]


@pytest.mark.parametrize("path", sorted(TOPOLOGIES.glob("*.txt")), ids=lambda p: p.stem)
def test_the_captured_cells_are_the_matrixs(path: Path) -> None:
    matrix = parse_topology(path.read_text())
    cells = expectation.captured_cells(matrix)
    count = matrix.gpu_count
    assert cells == tuple(tuple(matrix.gpu_cell(i, j) for j in range(count)) for i in range(count))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"version": 2, "gpu_model": "x", "gpu_count": 1}, "not an expectation of version 1"),
        ({"version": 1, "gpu_model": "x", "gpu_count": 1, "gpus": 2}, "unknown expectation field(s): gpus"),
        ({"version": 1, "gpu_model": "x"}, "malformed expectation"),
        ({"version": 1, "gpu_model": "x", "gpu_count": 1, "bridge_pairs": [[0]]}, "malformed expectation"),
    ],
)
def test_a_bad_expectation_is_a_plain_error(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        expectation_from_json(data)


# --- plan and the judge agree --------------------------------------------------------------------------

# The checks plan makes only through the judge, as failed checks (Fabric Manager where apply does not own it).
JUDGED = {
    "gpus",
    "topology",
    "pcie",
    "fabricmanager",
    "xid",
    "ecc",
    "memory-repair",
    "nvlink-errors",
    "throttle",
    "fabric",
    "kernel",
}


def _load(case: dict[str, Any], tmp_path: Path) -> Any:
    rig_file = tmp_path / "rig.yaml"
    rig_file.write_text(yaml.safe_dump(case["rig"]))
    (tmp_path / "topologies").symlink_to(TOPOLOGIES)
    loaded = load_rig(rig_file)
    return loaded, loaded.host(case.get("host", loaded.spec.hosts[0].name))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_plan_and_the_judge_agree_on_every_plan_case(path: Path, tmp_path: Path) -> None:
    case = load_case(path)
    loaded, host = _load(case, tmp_path)
    box_facts = case_facts(case)
    plan_said = [
        (c.resource, c.summary, c.current, c.desired)
        for c in plan_host(loaded, host, box_facts)
        if c.action in ("verify-failed", "warn") and c.resource in JUDGED
    ]
    # What a node has: the facts as JSON text and the expectation as a JSON file.
    want = expectation_from_json(json.loads(json.dumps(expectation_to_json(rig_expectation(loaded, host)))))
    pin = loaded.rig_of(host).driver
    owned = pin is not None and pin.fabricmanager and host.os == "linux"
    judged = [
        (f.check, f.summary, f.current, f.desired)
        for f in judge_node(json.loads(box_facts.model_dump_json()), want)
        if f.check in JUDGED and not (owned and f.check == "fabricmanager")  # apply's to converge
    ]
    assert plan_said == judged


def test_the_judge_runs_from_the_zipapp_on_a_stdlib_only_python(tmp_path: Path) -> None:
    bundle = build_agent()
    pyz = tmp_path / bundle.name
    pyz.write_bytes(bundle.data)
    twin = TWINS / "rtx3090-nvlink.yaml"
    reply = run_agent(pyz, "facts", {"args": {}, "simulate": str(twin)})
    assert reply["ok"], reply
    raw = reply["result"]
    rig = {
        "hosts": [{"name": "box", "rig": "r", "connection": "local", "simulate": str(twin)}],
        "files": {"profile_d": None, "environment_file": None, "launcher": None},
        # A rig the twin does not match: four GPUs of another model, a bridge it lacks, wide links.
        "rigs": {
            "r": {
                "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 4, "min_pcie_width": 32},
                "bridge": {"kind": "nvswitch", "links": 18},
            }
        },
    }
    (tmp_path / "rig.yaml").write_text(yaml.safe_dump(rig))
    loaded = load_rig(tmp_path / "rig.yaml")
    host = loaded.host("box")
    (tmp_path / "facts.json").write_text(json.dumps(raw))
    (tmp_path / "expect.json").write_text(json.dumps(expectation_to_json(rig_expectation(loaded, host))))
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from mgpu_provision.judge.records import expectation_from_json;"
        "from mgpu_provision.judge.verdict import judge_node;"
        "facts = json.load(open(sys.argv[2])); want = expectation_from_json(json.load(open(sys.argv[3])));"
        "print(json.dumps([[f.check, f.summary, f.advice] for f in judge_node(facts, want)]));"
        "assert not [m for m in sys.modules if m.startswith('mgpu_provision.node')]"
    )
    done = subprocess.run(
        [
            NODE_PYTHON,
            "-S",
            "-I",
            "-c",
            script,
            str(pyz),
            str(tmp_path / "facts.json"),
            str(tmp_path / "expect.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    on_node = [(check, summary) for check, summary, _ in json.loads(done.stdout)]
    plan_said = [
        (c.resource, c.summary)
        for c in plan_host(loaded, host, facts(**{k: v for k, v in raw.items() if k != "agent_version"}))
        if c.action in ("verify-failed", "warn") and c.resource in JUDGED
    ]
    assert {check for check, _ in on_node} >= {"gpus", "topology", "pcie", "fabricmanager"}
    assert on_node == plan_said
