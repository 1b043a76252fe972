"""Data-driven plan tests, in pyinfra's style: each `plan_cases/*.yaml` holds a rig, a box's facts and the
Changes `plan_host` must give, in order (resource, action, and a substring of the summary).

A case gives its facts inline (`facts:`), or builds them from a `box:` (a `nvidia-smi topo -m` file
from `tests/fixtures/topologies/`, the GPU model, and what is broken: down links, odd GPUs, PCIe
links, lost GPUs) with `facts:` keys replacing the built ones, `facts_patch_pairs:` ("a-b": {...})
changing single GPU pairs and `health:` adding health facts (see `case_health`). Either way the result is
validated by `facts.Facts`, as the agent's answer is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision.facts import Facts
from mgpu_provision.node.topology import nvlink_count, parse_topology
from mgpu_provision.plan.host import plan_host
from mgpu_provision.spec import load_rig

CASES_DIR = Path(__file__).parent / "plan_cases"
TOPOLOGIES = Path(__file__).parents[1] / "fixtures" / "topologies"
CASES = sorted(CASES_DIR.glob("*.yaml"))

HOST_INFO = {
    "hostname": "gpu-a",
    "os": "Ubuntu 22.04.4 LTS",
    "kernel": "5.15.0-105-generic",
    "arch": "x86_64",
    "boot_id": "0c9ad0e5-7e2f-4f37-9d1c-3f8a3f0f0a11",
    "python": "3.10.12",
    "user": "root",
}
DRIVER_OK = {
    "nvml": "ok",
    "version": "550.54.15",
    "installed": "550.54.15",
    "loaded": "550.54.15",
    "cuda": "12.4",
}


def box_facts(box: dict[str, Any]) -> dict[str, Any]:
    """Facts of a box wired as a `topo -m` file says, then broken as the case says."""
    matrix = parse_topology((TOPOLOGIES / box["topology"]).read_text())
    n = matrix.gpu_count
    nvswitch = bool(box.get("nvswitch", False))
    names = {int(k): v for k, v in box.get("names", {}).items()}
    down = {(d["gpu"], d["link"]) for d in box.get("down", [])}
    pcie = {int(k): v for k, v in box.get("pcie", {}).items()}
    bus = [f"00000000:{0x11 + 0x10 * i:02X}:00.0" for i in range(n)]
    gpus: list[dict[str, Any]] = []
    for i in range(n):
        ends: list[tuple[str, str | None]] = []  # (remote type, remote bus id) per link, in link order
        for j in range(n):
            if j != i:
                links = nvlink_count(matrix.gpu_cell(i, j))
                if nvswitch:
                    ends = [
                        ("switch", "00000000:C1:00.0")
                    ] * links  # every pair shows the links to the fabric
                else:
                    ends += [("gpu", bus[j])] * links
        nvlinks = [
            {"link": k, "active": (i, k) not in down, "remote_type": t, "remote_pci_bus_id": b}
            for k, (t, b) in enumerate(ends)
        ]
        gpus.append(
            {
                "index": i,
                "name": names.get(i, box["model"]),
                "uuid": f"GPU-00000000-0000-0000-0000-{i:012d}",
                "pci_bus_id": bus[i],
                "memory_mib": 24576,
                "persistence_mode": box.get("persistence", True),
                "pcie": {"gen": 1, "width": 16, "max_gen": 4, "max_width": 16, **pcie.get(i, {})},
                "nvlinks": nvlinks,
            }
        )
    pairs = []
    for i in range(n):
        for j in range(i + 1, n):
            cell = matrix.gpu_cell(i, j)
            links = nvlink_count(cell)
            lost = sum(
                1
                for g, k in down
                if g in (i, j) and (nvswitch or gpus[g]["nvlinks"][k]["remote_pci_bus_id"] == bus[i + j - g])
            )
            active = max(0, links - lost)
            pairs.append(
                {
                    "a": i,
                    "b": j,
                    "pcie": None if links else cell,
                    "nvlinks": active,
                    "p2p_nvlink": "OK" if active else "NS",
                }
            )
    lost = set(box.get("lost", []))  # GPUs NVML answers GpuIsLost for: out of gpus and pairs
    return {
        "gpus": [g for g in gpus if g["index"] not in lost],
        "lost_gpus": [{"index": i, "pci_bus_id": bus[i], "error": "GPU is lost"} for i in sorted(lost)],
        "pairs": [p for p in pairs if not lost & {p["a"], p["b"]}],
        "nvswitch": nvswitch,
        "driver": DRIVER_OK,
    }


def case_health(health: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """`health:` of a case: every GPU healthy (what a GeForce card answers), then `gpus: {"1": {...}}` patches
    single GPUs; `xid`, `kernel` and `not_checked` are taken as given."""
    patches = {int(k): v for k, v in (health.get("gpus") or {}).items()}
    return {
        "gpus": [
            {"index": g["index"], "compute_mode": "default", "throttle": [], **patches.get(g["index"], {})}
            for g in gpus
        ],
        "xid": health.get("xid", []),
        "xid_source": "journal",
        "kernel": health.get("kernel"),
        "not_checked": health.get("not_checked", []),
    }


def case_facts(case: dict[str, Any]) -> Facts:
    facts: dict[str, Any] = {"agent_version": "0.1.0", "host": HOST_INFO, "driver": DRIVER_OK}
    if "box" in case:
        facts.update(box_facts(case["box"]))
    facts.update(case.get("facts") or {})
    if "health" in case:
        facts["health"] = case_health(case["health"], facts.get("gpus", []))
    for key, patch in (case.get("facts_patch_pairs") or {}).items():
        a, b = (int(i) for i in key.split("-"))
        pair = next(p for p in facts["pairs"] if (p["a"], p["b"]) == (a, b))
        pair.update(patch)
    return Facts.model_validate(facts)


def load_case(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = yaml.safe_load(path.read_text())
    return case


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_plan_case(path: Path, tmp_path: Path) -> None:
    case = load_case(path)
    rig_file = tmp_path / "rig.yaml"
    rig_file.write_text(yaml.safe_dump(case["rig"]))
    (tmp_path / "topologies").symlink_to(TOPOLOGIES)  # the rig's topology_file is relative
    loaded = load_rig(rig_file)
    host = loaded.host(case.get("host", loaded.spec.hosts[0].name))
    changes = plan_host(loaded, host, case_facts(case))
    got = [(c.resource, c.action, c.summary) for c in changes]
    expected = case["expect"] or []
    assert [(r, a) for r, a, _ in got] == [(e["resource"], e["action"]) for e in expected], got
    for change, e in zip(changes, expected, strict=True):
        assert e["summary"] in change.summary
        # `step:` pins the keys of the agent step that apply would send (a subset: the rest may vary).
        for key, value in (e.get("step") or {}).items():
            step = change.agent_step
            assert step is not None and step.get(key) == value, (key, step)


def test_every_case_has_a_description_and_an_expectation() -> None:
    assert len(CASES) >= 20
    for path in CASES:
        case = load_case(path)
        assert case.get("description"), path.name
        assert "expect" in case, path.name
