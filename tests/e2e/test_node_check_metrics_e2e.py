"""The node check's .prom file read by the real tools: Debian's `promtool check metrics` and
`prometheus-node-exporter`'s textfile collector, started by the test on 127.0.0.1 and stopped by its pid.

node_exporter skips a whole file with a sample timestamp (`node_textfile_scrape_error 1`) and keeps only one
value of a series two files repeat (its log alone says so): both lose data silently, so the test scrapes
/metrics and reads the check's own series back, with the file of an older version left beside it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.factories import rtx3090_twin
from tests.support.hosts import skip_or_fail
from tests.support.node_check_helpers import Node

EXPORTER = "prometheus-node-exporter"


def need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        skip_or_fail(f"{tool} is not installed (apt-get install prometheus prometheus-node-exporter)", tool)
    return str(found)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def exporter(node: Node) -> Iterator[str]:
    """node_exporter reading the node's textfile folder; its /metrics URL."""
    port = free_port()
    command = [need(EXPORTER), f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
               "--collector.textfile", f"--collector.textfile.directory={node.textfile}"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        process.kill()
        process.wait()


def scrape(url: str) -> dict[str, str]:
    """Every sample line of /metrics, series -> value."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_promtool_passes_the_file_of_a_healthy_and_of_a_sick_node(node: Node) -> None:
    promtool = need("promtool")
    for twin_gpu in ({}, {"health": {"lost": True}}):
        twin = rtx3090_twin()
        twin["gpus"][1].update(twin_gpu)
        node.set_twin(twin)
        node.run()
        result = subprocess.run([promtool, "check", "metrics"], input=node.prom.read_text(),
                                capture_output=True, text=True)  # fmt: skip
        assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_node_exporter_serves_the_checks_series_and_an_older_file_leaves_no_duplicate(
    node: Node, exporter: str
) -> None:
    older = node.textfile / "mgpu-provision-check-0.prom"  # a file name an older version wrote
    older.write_text("# TYPE mgpu_provision_check_up gauge\nmgpu_provision_check_up 0\n")
    twin = rtx3090_twin()
    twin["gpus"][1]["health"] = {"lost": True}
    node.set_twin(twin)
    assert node.run().returncode == 2
    assert not older.exists()
    series = scrape(exporter)
    assert series["node_textfile_scrape_error"] == "0"
    assert series["mgpu_provision_check_up"] == "1"
    assert series["mgpu_provision_check_exit_code"] == "2"
    assert series['mgpu_provision_check_passed{check="inventory"}'] == "0"
    lost = 'mgpu_provision_check_gpu_passed{UUID="",check="inventory",gpu="1",pci_bus_id="00000000:21:00.0"}'
    assert series[lost] == "0"
    mtime = f'node_textfile_mtime_seconds{{file="{node.prom}"}}'
    assert mtime in series or f'node_textfile_mtime_seconds{{file="{node.prom.name}"}}' in series
