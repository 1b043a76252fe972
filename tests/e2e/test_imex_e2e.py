"""Two GB200 compute trays over real SSH (simulated NVIDIA layer) form an IMEX domain through the CLI as a
user runs it (issue 37 item 10): `driver.imex: true` installs nvidia-imex on both, writes the same
nodes_config.cfg on each (the trays' own addresses, one a line, `peers: fleet`), and the next plan is clean
on the tray whose domain is UP and fails the IMEX check on the one whose `nvidia-imex-ctl -N -j` says
DEGRADED (NVIDIA/DCGM's recorded answer, tests/fixtures/imex); a second apply changes nothing.

nodes_config.cfg is put under /etc/mgpu-provision (a folder each test host has privately) by the rig's
`driver.imex.nodes_config`, so no file of this machine's /etc is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.factories import example_twin
from tests.support.hosts import HostFactory, on_host
from tests.support.nodes import run_in_process

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "imex"
CONFIG = "/etc/mgpu-provision/imex/nodes_config.cfg"


def test_two_trays_get_one_domain_and_a_degraded_one_fails_its_plan(
    test_hosts: HostFactory, tmp_path: Path
) -> None:
    degraded = json.loads((FIXTURES / "nvidia-imex-ctl-N-j-degraded.json").read_text())
    a = test_hosts.start("tray-a", example_twin("gb200-tray"), rig="tray")
    b = test_hosts.start("tray-b", dict(example_twin("gb200-tray"), imex_domain=degraded), rig="tray")
    driver = {"version": "580.95.05", "source": "cuda", "imex": {"nodes_config": CONFIG}, "reboot": "never"}
    rig = {"gpus": {"model": "NVIDIA GB200", "count": 4}, "bridge": {"kind": "nvswitch", "links": 18}}
    files = {"profile_d": None, "environment_file": None, "launcher": None}
    path = test_hosts.write_rig(
        tmp_path / "rig.yaml", [a, b], rigs={"tray": {**rig, "driver": driver}}, files=files
    )
    common = [str(path), "--known-hosts", str(test_hosts.known_hosts)]

    first = run_in_process("apply", *common, "--yes", "--json")
    assert first.host("tray-a")["status"] == "changed", first.host("tray-a")
    # Installed and written there too, but its domain is not UP: the check apply ends with fails it.
    assert (first.host("tray-b")["status"], first.host("tray-b")["error"]) == (
        "failed",
        "1 check failed: imex",
    )
    for host in (a, b):
        assert on_host(host, CONFIG).read_text() == f"{a.address}\n{b.address}\n"

    plan = run_in_process("plan", *common, "--json")
    imex = {h: [c for c in plan.host(h)["changes"] if c["resource"] == "imex"] for h in ("tray-a", "tray-b")}
    assert imex["tray-a"] == []
    (check,) = imex["tray-b"]
    assert check["action"] == "verify-failed" and check["summary"].startswith("the IMEX domain is DEGRADED")
    second = run_in_process("apply", *common, "--yes", "--json")
    assert second.host("tray-a")["status"] == "ok", second.host("tray-a")
    assert [d for d in second.host("tray-b")["done"] if "nodes_config" in d or "imex" in d] == []
