"""Hosts from an Ansible inventory, end to end: real sshd test hosts reached only through the inventory.

The rig file names no host, address, port, user or key: the inventory's `ansible_host`, `ansible_port`,
`ansible_user`, `ansible_ssh_private_key_file` and `ansible_python_interpreter` must be what the SSH
connections use, and `--limit` must take the inventory's groups.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_provision.cli import main
from tests.support.hosts import NODE_PYTHON, HostFactory, load_twin

pytest.importorskip("ansible", reason="ansible-core (the `ansible` extra) is not installed")


def test_plan_reaches_inventory_hosts_and_limit_takes_their_groups(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twin = load_twin("rtx3090-nvlink")
    rack_a, rack_b = (test_hosts.start(name, twin, rig="pair") for name in ("gpu-a", "gpu-b"))
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text(
        f"ansible_user: root\nansible_ssh_private_key_file: {test_hosts.client_key}\n"
        f"ansible_python_interpreter: {NODE_PYTHON}\n"
    )
    (tmp_path / "hosts.ini").write_text(
        f"[rack_a]\ngpu-a ansible_host={rack_a.address} ansible_port={rack_a.port}\n\n"
        f"[rack_b]\ngpu-b ansible_host={rack_b.address} ansible_port={rack_b.port}\n\n"
        "[gpu:children]\nrack_a\nrack_b\n\n[web]\nwww1 ansible_host=192.0.2.1\n"
    )
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "version: 1\ndefaults: {connect_timeout_s: 5}\ninventory: hosts.ini\nrig_groups: {gpu: pair}\n"
        'rigs:\n  pair:\n    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}\n'
    )
    known = ["--known-hosts", str(test_hosts.known_hosts)]

    assert main(["plan", str(rig), *known, "--json"]) == 2  # the env files are not there yet: drift
    doc = json.loads(capsys.readouterr().out)
    assert {name: entry["status"] for name, entry in doc["hosts"].items()} == {"gpu-a": "ok", "gpu-b": "ok"}

    assert main(["plan", str(rig), *known, "--json", "--limit", "rack_b"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["hosts"]) == ["gpu-b"]
    assert doc["hosts"]["gpu-b"]["status"] == "ok"
