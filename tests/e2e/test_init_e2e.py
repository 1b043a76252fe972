"""`mgpu-provision init --from HOST` against a real test host: the rig file it writes validates and its plan
against the same host is empty (the box it was read from is, by definition, what the rig file describes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.cli import main
from tests.support.hosts import NODE_PYTHON, HostFactory, load_twin


@pytest.mark.parametrize("twin", ["rtx3090-nvlink", "h100-hgx"])
def test_init_writes_a_rig_that_plans_clean(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], twin: str
) -> None:
    host = test_hosts.start("known-good", load_twin(twin))
    known = str(test_hosts.known_hosts)
    out = tmp_path / "rig.yaml"
    code = main(
        [
            "init",
            "--from", f"root@{host.address}:{host.port}",
            "--identity-file", str(test_hosts.client_key),
            "--known-hosts", known,
            "--python", NODE_PYTHON,
            "-o", str(out),
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr()
    assert (tmp_path / "rig.topo.txt").read_text().startswith("\tGPU0\tGPU1")
    text = out.read_text()
    assert "name: known-good" in text  # the box's hostname, as its UTS namespace says
    assert main(["validate", str(out)]) == 0
    capsys.readouterr()
    assert main(["plan", str(out), "--known-hosts", known]) == 0, capsys.readouterr().out
    assert "No changes. 1 host matches the rig file." in capsys.readouterr().out


@pytest.mark.parametrize("existing", ["rig.yaml", "rig.topo.txt"])
def test_init_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str], existing: str) -> None:
    (tmp_path / existing).write_text("keep me\n")
    assert main(["init", "--from", "gpu-a", "-o", str(tmp_path / "rig.yaml")]) == 1
    assert f"{tmp_path / existing} exists; choose another --output or pass --force" in capsys.readouterr().err
    assert (tmp_path / existing).read_text() == "keep me\n"
