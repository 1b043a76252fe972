"""The control side of smoke without nodes: a rig file of DDP groups, its smoke plan, and a node's passing
answer, for the tests of the fleet verdict and its measures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mgpu_provision.fleet.pool import HostOutcome
from mgpu_provision.jobs import smoke as control
from mgpu_provision.rig import load_rig


def rig_file(tmp_path: Path, hosts: list[dict[str, Any]], **over: Any) -> Path:
    ddp = {"master": "gpu-a", "port": 29555, "backend": "gloo", "nproc_per_node": 2, "ifname": "lo"}
    rigs = {
        "pair": {"gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2}, "ddp": ddp},
        "quad": {
            "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 4},
            "ddp": {**ddp, "nproc_per_node": 4},
        },
        "solo": {
            "gpus": {"model": "NVIDIA A100-SXM4-80GB", "count": 1},
            "ddp": {**ddp, "master": "hgx", "nproc_per_node": 1},
        },
        "bare": {"gpus": {"model": "NVIDIA A100-SXM4-80GB", "count": 1}},
    }
    document: dict[str, Any] = {
        "version": 1,
        "hosts": hosts,
        "rigs": {name: rig for name, rig in rigs.items() if any(h["rig"] == name for h in hosts)},
        "env": {"NCCL_DEBUG": "WARN"},
        "path_prepend": {"PATH": ["/usr/local/cuda/bin"]},
        "smoke": {"python": "/opt/venv/bin/python", "timeout_s": 60, "batch_size": 4, "sizes_mib": [1, 4]},
    }
    document.update(over)
    path = tmp_path / "rig.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


HOSTS = [
    {"name": "gpu-b", "address": "10.0.0.12", "rig": "pair"},
    {"name": "gpu-a", "address": "10.0.0.11", "rig": "pair"},
    {"name": "gpu-c", "address": "10.0.0.13", "rig": "pair"},
]


def plan(
    tmp_path: Path, hosts: list[dict[str, Any]], names: list[str] | None = None
) -> list[control.NodePart]:
    loaded = load_rig(rig_file(tmp_path, hosts))
    chosen = [loaded.host(n) for n in names] if names else list(loaded.spec.hosts)
    return control.plan_smoke(loaded, chosen, "run-1")


def ranks_of(node_rank: int, world: int = 4, busbw: float = 2.0) -> list[dict[str, Any]]:
    band = [{"size_mib": 1.0, "busbw_gbps": 9.0}, {"size_mib": 4.0, "busbw_gbps": busbw}]
    return [{"rank": 2 * node_rank + i, "world_size": world, "ok": True, "bandwidth": band} for i in range(2)]


def ok_outcome(node_rank: int, **value: Any) -> HostOutcome[dict[str, Any]]:
    answer = {"ok": True, "kind": None, "diagnosis": None, "ranks": ranks_of(node_rank), "elapsed_s": 3.0}
    return HostOutcome("ok", {**answer, **value}, None, 3.5)
