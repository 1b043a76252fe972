"""tools/device-check against a twin, so that the script a GPU box's first day runs cannot rot: every item
runs through the agent's real door (facts, reclaim, smoke, the node check), NVML answered by the twin, the
rank on Gloo; the report is one JSON object with PASS/FAIL/SKIP per item. Root: reclaim and the node check
read every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.hosts import REPO, TWINS_DIR, skip_or_fail


def test_the_device_check_passes_against_a_twin(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_or_fail("the device check needs root")
    out = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "device-check"),
            "--simulate",
            str(TWINS_DIR / "rtx4090-pcie.yaml"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=480,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    report = json.loads(out.read_text())
    statuses = {row["item"]: row["status"] for row in report["items"]}
    assert statuses == {
        "nvml-facts": "PASS",
        "reclaim": "PASS",
        "smoke": "PASS",
        "data-parallel": "SKIP",
        "node-check": "PASS",
    }
    assert report["simulated"] is True and report["elapsed_s"] < 8 * 60
    facts = next(row for row in report["items"] if row["item"] == "nvml-facts")
    assert facts["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090" and facts["gpus"][0]["pcie"]
    assert any(line.startswith("recovery action: not supported") for line in facts["not_supported"])
    reclaim = next(row for row in report["items"] if row["item"] == "reclaim")
    assert "reclaim: ended; freed 256 MiB" in reclaim["detail"]
    smoke = next(row for row in report["items"] if row["item"] == "smoke")
    assert smoke["plain_all_reduce"]["backend"] == "gloo" and [b["size_mib"] for b in smoke["bandwidth"]] == [
        1,
        16,
        64,
    ]
    assert "PASS reclaim:" in run.stdout and "NotSupported: recovery action" in run.stdout
