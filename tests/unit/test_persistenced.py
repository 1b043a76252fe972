"""nvidia-persistenced's effective command line from its unit and drop-ins (read by catalog/persistenced.py,
found by node/packages/persistenced.py), and the override that turns persistence mode on (the real-systemd
proof is tests/e2e/test_persistenced_systemd_e2e.py)."""

from __future__ import annotations

from pathlib import Path

from mgpu_provision.catalog import persistenced
from mgpu_provision.node.packages.persistenced import unit_texts

# Ubuntu's unit (nvidia-graphics-drivers, debian/nvidia-persistenced.service): persistence mode off.
UBUNTU = """\
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""


def test_ubuntus_unit_is_not_persistence_and_the_drop_in_turns_it_on() -> None:
    command = persistenced.exec_start_of([UBUNTU])
    daemon = "/usr/bin/nvidia-persistenced --user nvidia-persistenced"
    assert command == f"{daemon} --no-persistence-mode --verbose"
    assert not persistenced.persistence_on(command)
    override = persistenced.drop_in(command)
    effective = persistenced.exec_start_of([UBUNTU, override])
    assert effective == f"{daemon} --persistence-mode --verbose"
    assert persistenced.persistence_on(effective)
    assert persistenced.drop_in("/usr/bin/nvidia-persistenced --user nvpd").endswith(
        "ExecStart=/usr/bin/nvidia-persistenced --user nvpd --persistence-mode\n"
    )


def test_drop_ins_are_read_in_systemds_order(tmp_path: Path) -> None:
    etc, lib = tmp_path / "etc", tmp_path / "lib"
    (lib / "nvidia-persistenced.service.d").mkdir(parents=True)
    (etc / "nvidia-persistenced.service.d").mkdir(parents=True)
    (lib / "nvidia-persistenced.service").write_text(UBUNTU)
    (lib / "nvidia-persistenced.service.d" / "10-x.conf").write_text("[Service]\nExecStart=\nExecStart=/a\n")
    (etc / "nvidia-persistenced.service.d" / "10-x.conf").write_text("[Service]\nExecStart=\nExecStart=/b\n")
    (lib / "nvidia-persistenced.service.d" / "20-y.conf").write_text("[Unit]\nExecStart=/not-a-service-key\n")
    texts = unit_texts(dirs=(str(etc), str(lib)))
    assert persistenced.exec_start_of(texts) == "/b"  # /etc's 10-x.conf hides /lib's; [Unit] keys ignored
