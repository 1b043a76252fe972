"""`--via clush` on the control side: the extra missing is one line saying what to install; the ssh_config
and options ClusterShell's OpenSSH runs with (aliases, key exchange, host-key policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.cli import main
from mgpu_provision.fleet import clush
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.targets import HostTarget
from mgpu_provision.rig import nodesets

RIG = """\
hosts:
  - {name: gpu-001, address: 10.0.0.1, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
"""


def test_via_clush_without_the_extra_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(nodesets, "clustershell", lambda: False)
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG)
    assert main(["plan", str(rig), "--via", "clush"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--via clush needs ClusterShell" in err and "pip install 'mgpu-provision[clush]'" in err


def test_a_node_set_that_does_not_parse_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG)
    assert main(["facts", str(rig), "--limit", "gpu-[001-", "--json"]) == 1
    captured = capsys.readouterr()
    assert "--limit: 'gpu-[001-'" in captured.err + captured.out
    assert "Traceback" not in captured.err


def target(name: str, **fields: object) -> HostTarget:
    base: dict[str, object] = {
        "name": name, "address": "127.0.0.9", "port": 2222, "user": "root", "identity_file": "/k/id",
        "jump": None, "become": False, "python": "python3", "connection": "ssh", "simulate": None,
        "connect_timeout_s": 5.0, "command_timeout_s": 60.0,
    }  # fmt: skip
    base.update(fields)
    return HostTarget(**base)  # type: ignore[arg-type]


def test_ssh_config_aliases_each_rig_name() -> None:
    text = clush.ssh_config(
        [target("gpu-001"), target("gpu-002", port=None, user=None, jump="bastion")], None
    )
    assert text.split("\n\n")[0] == (
        "Host gpu-001\n  HostName 127.0.0.9\n  Port 2222\n  User root\n  IdentityFile /k/id\n"
        "  IdentitiesOnly yes"
    )
    assert "Host gpu-002\n  HostName 127.0.0.9\n  Port 22\n  IdentityFile /k/id" in text
    assert "  ProxyJump bastion" in text


def test_openssh_options_prefer_curve25519_and_keep_known_hosts_strict(tmp_path: Path) -> None:
    options = clush.ssh_options(tmp_path / "cfg", FleetOptions(known_hosts=tmp_path / "kh"))
    assert "-oKexAlgorithms=curve25519-sha256," in options
    assert f"-oUserKnownHostsFile={tmp_path / 'kh'}" in options
    assert "-oStrictHostKeyChecking=yes" in options
    relaxed = clush.ssh_options(tmp_path / "cfg", FleetOptions(accept_new_host_keys=True))
    assert "-oStrictHostKeyChecking=accept-new" in relaxed
