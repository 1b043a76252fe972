"""Persistence that lasts, on real systemd: Debian's nvidia-persistenced unit runs the daemon without
`--persistence-mode`; the agent's drop-in makes it the unit's effective ExecStart, and it still is after a
reboot. What systemd holds is tested, not what the daemon does: there is no GPU here, so it may fail to start.
"""

from __future__ import annotations

from pathlib import Path

from tests.systemd_host import SystemdHost

REPO = Path(__file__).resolve().parents[2]
AGENT = "PYTHONPATH=/opt/mgpu python3 -c"


def agent(host: SystemdHost, code: str) -> str:
    done = host.run(f"{AGENT} {code!r}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_drop_in_is_the_effective_exec_start_and_survives_a_reboot(booted_host: SystemdHost) -> None:
    host = booted_host
    install = host.run("apt-get install -y -q --no-install-recommends nvidia-persistenced 2>&1", timeout=300)
    assert install.returncode == 0, install.stdout
    host.copy_in(REPO / "mgpu_provision", "/opt/mgpu")
    read = "from mgpu_provision.node.packages import persistenced as p; print(p.effective_exec_start())"
    before = agent(host, read)
    assert before == "/usr/bin/nvidia-persistenced --user nvpd"  # Debian's unit: no persistence mode asked

    ensure = "from mgpu_provision.node.packages import persistenced as p; print(p.ensure_persistence_mode())"
    assert "drop-in" in agent(host, ensure)
    assert "--persistence-mode" in host.systemctl("show", "-p", "ExecStart", "--value", "nvidia-persistenced")
    assert agent(host, ensure).startswith("(False, ")  # a second apply writes nothing

    host.systemctl("enable", "nvidia-persistenced")
    assert host.reboot() in ("running", "degraded")  # degraded: the daemon finds no GPU here
    after = agent(host, read)
    assert after == "/usr/bin/nvidia-persistenced --user nvpd --persistence-mode"
    assert host.systemctl("is-enabled", "nvidia-persistenced") == "enabled"
