"""Persistence that lasts, on real systemd: Debian's nvidia-persistenced unit runs the daemon without
`--persistence-mode`. The agent's own `apply` verb, given the plan's persistenced step, writes the drop-in
that makes it the unit's effective ExecStart and enables the unit; after a reboot both still hold. What
systemd holds is tested, not what the daemon does: there is no GPU here, so it may fail to start.
"""

from __future__ import annotations

import json
from pathlib import Path

from mgpu_provision import protocol
from mgpu_provision.plan.host import plan_host
from mgpu_provision.rig import load_rig
from tests.support.factories import facts_from_twin
from tests.support.systemd_host import SystemdHost

REPO = Path(__file__).resolve().parents[2]
RIG = """\
version: 1
hosts:
  - {name: hgx, address: 10.0.0.11, rig: hgx}
rigs:
  hgx:
    gpus: {model: "NVIDIA H100 80GB HBM3", count: 8, persistence_mode: true}
    health: {power_limit_w: 500}
files: {profile_d: null, environment_file: null, launcher: null}
"""
READ = "from mgpu_provision.node.packages import persistenced as p; print(p.effective_exec_start())"


def agent(host: SystemdHost, code: str) -> str:
    done = host.run(f"PYTHONPATH=/opt/mgpu python3 -c {code!r}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def apply(host: SystemdHost, step: dict[str, object]) -> dict[str, object]:
    request = json.dumps({"args": {"lock": "/run/mgpu-apply.lock", "lock_wait_s": 5, "steps": [step]}})
    done = host.run(f"PYTHONPATH=/opt/mgpu python3 -m mgpu_provision.node apply <<'END'\n{request}\nEND")
    assert done.returncode == 0, done.stderr
    reply: dict[str, object] = json.loads(done.stdout)
    return reply


def boot_unit_steps(tmp_path: Path) -> list[dict[str, object]]:
    """The plan's steps for the boot unit that sets the power limit (its file, then enabling it)."""
    (tmp_path / "rig.yaml").write_text(RIG)
    loaded = load_rig(tmp_path / "rig.yaml")
    changes = plan_host(loaded, loaded.host("hgx"), facts_from_twin(REPO / "examples/twins/h100-hgx.yaml"))
    unit = protocol.GPU_SETTINGS_UNIT
    steps = [c.agent_step for c in changes if c.agent_step and unit in str(c.agent_step)]
    assert [s["kind"] for s in steps] == ["file", "service"], steps
    return steps


def test_the_drop_in_is_the_effective_exec_start_and_survives_a_reboot(
    booted_host: SystemdHost, tmp_path: Path
) -> None:
    host = booted_host
    install = host.run("apt-get install -y -q --no-install-recommends nvidia-persistenced 2>&1", timeout=300)
    assert install.returncode == 0, install.stdout
    host.copy_in(REPO / "mgpu_provision", "/opt/mgpu")
    assert agent(host, READ) == "/usr/bin/nvidia-persistenced --user nvpd"  # Debian's unit: no mode asked

    step = protocol.persistenced_step(True, False)  # no driver loaded here: enabled, started at boot
    reply = apply(host, step)
    assert reply["ok"], reply
    (result,) = reply["result"]["results"]  # type: ignore[index]
    assert result["changed"] and "drop-in" in result["message"], result
    shown = host.systemctl("show", "-p", "ExecStart", "--value", "nvidia-persistenced")
    assert "--persistence-mode" in shown, shown  # the running manager merged it (daemon-reload)
    assert host.systemctl("is-enabled", "nvidia-persistenced") == "enabled"
    again = apply(host, step)
    assert again["result"]["results"][0]["changed"] is False, again  # type: ignore[index]

    for unit_step in boot_unit_steps(tmp_path):
        assert apply(host, unit_step)["ok"]

    assert host.reboot() in ("running", "degraded")  # degraded: the daemon finds no GPU here
    assert agent(host, READ) == "/usr/bin/nvidia-persistenced --user nvpd --persistence-mode"
    assert host.systemctl("is-enabled", "nvidia-persistenced") == "enabled"
    unit = protocol.GPU_SETTINGS_UNIT
    assert host.systemctl("is-enabled", unit) == "enabled"
    assert "nvidia-persistenced.service" in host.systemctl("show", "-p", "After", "--value", unit)
