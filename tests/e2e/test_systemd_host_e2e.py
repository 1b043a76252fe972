"""The real-systemd test host itself: it boots to `running` with no getty on any tty, and a reboot keeps
what the host wrote (its overlay's upper layer) while starting every enabled unit again."""

from __future__ import annotations

from tests.support.systemd_host import SystemdHost

UNIT = """\
[Unit]
Description=a oneshot the test enables, to see it run again after the reboot

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'date +%%s%%N >> /var/lib/boot-marks'

[Install]
WantedBy=multi-user.target
"""


def test_boots_to_running_without_gettys_and_a_reboot_keeps_state(booted_host: SystemdHost) -> None:
    host = booted_host
    assert host.systemctl("is-system-running") == "running", host.systemctl("--failed", "--no-legend")
    assert host.systemctl("list-units", "--no-legend", "--plain", "*getty*.service") == ""
    assert host.run("cat /proc/1/comm").stdout.strip() == "systemd"
    # Its /dev is its own: no disk, and no tty but /dev/tty (the machine's ttys would get gettys).
    assert host.run("find /dev -type b").stdout == ""
    assert [n for n in host.run("ls /dev").stdout.split() if n.startswith("tty")] == ["tty"]

    host.run(f"cat > /etc/systemd/system/mark.service <<'END'\n{UNIT}END")
    assert host.run("systemctl enable mark.service").returncode == 0
    first_pid1 = host.pid1()
    assert host.reboot() == "running"
    assert host.pid1() != first_pid1
    assert host.systemctl("is-enabled", "mark.service") == "enabled"
    assert host.systemctl("is-active", "mark.service") == "active"  # started by the new boot
    assert len(host.run("cat /var/lib/boot-marks").stdout.split()) == 1
    assert (host.upper / "etc" / "systemd" / "system" / "mark.service").exists()
