"""`init`'s rig-file writer: from each example twin's facts, a rig file that validates and plans clean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mgpu_provision.catalog.topology import format_topology, gpu_matrix
from mgpu_provision.cli import main
from mgpu_provision.commands.init import parse_destination
from mgpu_provision.errors import ProvisionError
from mgpu_provision.facts import Facts
from mgpu_provision.jobs.init import env_file_paths, rig_from_facts, rig_name_for
from mgpu_provision.plan.host import plan_host
from mgpu_provision.rig import load_rig
from mgpu_provision.rig.models import SCHEMA_FILE, schema_comment
from tests.support.factories import facts_from_twin

TWINS = Path(__file__).resolve().parents[2] / "examples" / "twins"


def facts_of(twin: Path, **args: Any) -> Facts:
    return facts_from_twin(twin, files=env_file_paths(), **args)


def write_init(tmp_path: Path, facts: Facts) -> Path:
    topo = tmp_path / "rig.topo.txt"
    topo.write_text(format_topology(gpu_matrix(len(facts.gpus), facts.cell)))
    rig = tmp_path / "rig.yaml"
    connection = {"user": "ubuntu", "port": 2222}
    rig.write_text(
        rig_from_facts("box-1", "10.0.0.11", facts, topo.name, connection, schema_comment(tmp_path))
    )
    return rig


@pytest.mark.parametrize(
    ("twin", "rig_name", "bridge"),
    [
        ("rtx3090-nvlink.yaml", "rtx3090-x2", "{kind: nvlink-bridge, pairs: [[0, 1]], links: 4"),
        ("h100-hgx.yaml", "h100-80gb-x8", "{kind: nvswitch, links: 18"),
        ("rtx4090-pcie.yaml", "rtx4090-x5", "{kind: none"),
    ],
)
def test_init_rig_validates_and_plans_clean(tmp_path: Path, twin: str, rig_name: str, bridge: str) -> None:
    facts = facts_of(TWINS / twin)
    rig = write_init(tmp_path, facts)
    text = rig.read_text()
    assert rig_name_for(facts) == rig_name
    assert f"bridge: {bridge}" in text
    assert f'version: "{facts.driver.version}"' in text
    loaded = load_rig(rig)
    host = loaded.host("box-1")
    assert host.user == "ubuntu" and host.port == 2222
    assert loaded.rig_of(host).gpus.count == len(facts.gpus)
    assert plan_host(loaded, host, facts) == []


def test_existing_env_files_stay_managed(tmp_path: Path) -> None:
    facts = facts_of(TWINS / "rtx3090-nvlink.yaml")
    present = facts.model_copy(update={"files": [f.model_copy(update={"exists": True}) for f in facts.files]})
    assert "profile_d: null" in write_init(tmp_path, facts).read_text()
    assert "files:" not in write_init(tmp_path, present).read_text()


def test_a_box_without_driver_gets_a_review_note(tmp_path: Path) -> None:
    facts = facts_of(TWINS / "rtx3090-nvlink.yaml")
    text = rig_from_facts(
        "box-1",
        "10.0.0.11",
        facts.model_copy(update={"driver": facts.driver.model_copy(update={"version": None})}),
    )
    assert "# review: no driver section:" in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu-a", (None, "gpu-a", None)),
        ("ubuntu@10.0.0.11", ("ubuntu", "10.0.0.11", None)),
        ("root@127.0.0.5:2222", ("root", "127.0.0.5", 2222)),
    ],
)
def test_destination_parsing(text: str, expected: tuple[str | None, str, int | None]) -> None:
    assert parse_destination(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("root@host:70000", "port 70000 is not between 1 and 65535"),
        ("host;rm -rf /", "expected [user@]host[:port]"),
        ("$(touch x)", "expected [user@]host[:port]"),
    ],
)
def test_bad_destinations_are_refused(text: str, message: str) -> None:
    with pytest.raises(ProvisionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_destination(text)


def test_gpu_settings_not_at_the_defaults_are_written_and_only_the_boot_unit_planned(tmp_path: Path) -> None:
    twin: dict[str, Any] = yaml.safe_load((TWINS / "rtx3090-nvlink.yaml").read_text())
    for gpu in twin["gpus"]:
        gpu["health"] = {"compute_mode": "exclusive_process", "ecc": {"mode": True}}
        gpu["health"].update(power_limit_w=300, default_power_limit_w=350)
    path = tmp_path / "twin.json"
    path.write_text(json.dumps(twin))
    facts = facts_of(path)
    rig = write_init(tmp_path, facts)
    assert "    health: {ecc: true, compute_mode: exclusive_process, power_limit_w: 300}" in rig.read_text()
    loaded = load_rig(rig)
    # NVML's values plan clean; what remains is the boot unit that keeps them after the box's next reboot.
    changes = [(c.resource, c.action) for c in plan_host(loaded, loaded.host("box-1"), facts)]
    unit = "mgpu-provision-gpu-settings"
    assert changes == [(f"file:/etc/systemd/system/{unit}.service", "create"), (f"service:{unit}", "update")]


def test_init_reads_this_machine_with_a_simulated_nvidia_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    out = tmp_path / "rigs" / "rig.yaml"
    out.parent.mkdir()
    twin = TWINS / "rtx3090-nvlink.yaml"
    argv = ["init", "--connection", "local", "--simulate", str(twin), "--name", "box-1", "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr()
    text = out.read_text()
    assert '  - {name: box-1, address: "127.0.0.1", rig: rtx3090-x2, connection: "local", simulate: ' in text
    assert "# Written by `mgpu-provision init --connection local` from the box as it is now." in text
    host = load_rig(out).host("box-1")
    assert host.connection == "local" and (out.parent / str(host.simulate)).resolve() == twin
    assert main(["validate", str(out)]) == 0
    # plan keeps this (local) box's health sample in files.state_dir: the test's folder, not this machine's.
    state = f"  state_dir: {tmp_path / 'state'}\n"
    with_state = text.replace("files:\n", "files:\n" + state)
    out.write_text(with_state if "\nfiles:\n" in text else text + "files:\n" + state)
    capsys.readouterr()
    assert main(["plan", str(out)]) == 0, capsys.readouterr().out
    assert "No changes. 1 host matches the rig file." in capsys.readouterr().out


def test_init_refuses_a_box_without_gpus_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps({"driver": {"version": "550.54.15"}, "gpus": []}))
    out = tmp_path / "rig.yaml"
    argv = ["init", "--connection", "local", "--simulate", str(twin), "-o", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "error: NVML sees no GPU on " in err and "init describes a box whose GPUs work" in err, err
    assert not out.exists() and not (tmp_path / "rig.topo.txt").exists()


def test_init_needs_from_unless_local(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init"]) == 1
    assert "error: init needs --from HOST (or --connection local for this machine)" in capsys.readouterr().err
    assert main(["init", "--connection", "local", "--from", "gpu-a"]) == 1
    assert "--from is for SSH; --connection local reads this machine" in capsys.readouterr().err


def test_ports_are_written_as_numbers_and_the_schema_line_is_a_real_file(tmp_path: Path) -> None:
    rig = write_init(tmp_path, facts_of(TWINS / "rtx3090-nvlink.yaml"))
    text = rig.read_text()
    assert "port: 2222" in text and '"2222"' not in text
    first = text.splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema="), first
    assert (tmp_path / first.split("$schema=")[1]).resolve() == SCHEMA_FILE
