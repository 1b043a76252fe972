"""Slurm as real clusters run it (issue 39), each case quoting the Slurm text it follows.

Sources read (SchedMD/slurm, tags slurm-22-05-8-1 .. slurm-26-05-3-1): src/interfaces/gres.c
`_check_core_range_matches_sock`, src/slurmd/slurmd/slurmd.c `run_script_health_check`, src/common/
read_config.c `_establish_config_source`, src/slurmctld/node_mgr.c, doc/html/gres.shtml "Socket Affinity",
doc/html/configless_slurm.shtml, doc/man/man5/{gres,slurm,cgroup}.conf.5.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.facts import Facts, SlurmNode
from mgpu_provision.node.host import machine
from mgpu_provision.plan.host import plan_host
from mgpu_provision.plan.resources import slurm
from mgpu_provision.rig import LoadedRig, load_rig
from mgpu_provision.rig.models import Slurm

RIG = """
hosts:
  - {name: gpu-a, address: 10.0.0.11, rig: pair}
rigs:
  pair:
    gpus: {model: NVIDIA A100-SXM4-80GB, count: 2}
    slurm:
      restart_command: [/usr/local/bin/restart-slurmd]
      health_check: /usr/local/bin/mgpu-provision-check
node_check: {interval: null, deadline_s: 45}
"""


@pytest.fixture
def loaded(tmp_path: Path) -> LoadedRig:
    (tmp_path / "rig.yaml").write_text(RIG)
    return load_rig(tmp_path / "rig.yaml")


def nps4_facts(slurm_node: dict[str, Any] | None = None, hostname: str = "gpu-a") -> Facts:
    """A DGX A100-like box: 2 sockets x 64 cores, SMT off, NPS4 (4 NUMA nodes per socket); GPU 0 near NUMA
    node 3 (OS CPUs 48-63), GPU 1 near NUMA node 7 (112-127): the DGX A100 fixture's affinities."""
    threads = [{"cpu": c, "socket": c // 64, "core": c % 64, "numa": c // 16} for c in range(128)]
    gpus = [
        {"index": i, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{i}", "pci_bus_id": f"00000000:{b}:00.0",
         "minor_number": i, "cpu_affinity": aff, "memory_mib": 81920}
        for i, (b, aff) in enumerate((("07", "48-63"), ("87", "112-127")))
    ]  # fmt: skip
    return Facts.model_validate(
        {
            "agent_version": "t",
            "host": {"hostname": hostname, "os": "x", "kernel": "k", "arch": "x86_64", "boot_id": "b",
                     "python": "3", "user": "root"},
            "driver": {"nvml": "ok"},
            "gpus": gpus,
            "machine": {"threads": threads, "memory_mib": 1_000_000},
            "slurm": slurm_node,
        }
    )  # fmt: skip


def node(version: str | None = "24.11.1", **more: Any) -> dict[str, Any]:
    return {"registers": {}, "controller": None, "version": version, **more}


# --- item 1: Cores= and Slurm's sockets ---------------------------------------------------------------------


def test_slurm_s_socket_rule_by_version_as_gres_c_has_it() -> None:
    # 24.05.x: the check of b886b6e82f was reverted (c9c88df9d7) before any 24.05 release kept it.
    assert slurm.socket_rule("24.05.8") == slurm.socket_rule("22.05.8") == "none"
    assert slurm.socket_rule("24.11.0") == slurm.socket_rule("25.05.3") == "whole"
    assert slurm.socket_rule("25.11.0") == slurm.socket_rule("26.05.1") == "one"
    assert slurm.socket_rule(None) == "one"  # unknown: the strictest
    # 24.11.0 gres.c line 3717: "if (set_cnt && (set_cnt != rebuild_topo->cores_per_sock))" -> error
    # "GRES core specification %s doesn't match socket boundaries. (Socket %d is cores %d-%d)".
    assert slurm.refused(set(range(48, 64)), 2, 64, "whole") == (
        "GRES core specification 48-63 doesn't match socket boundaries. (Socket 0 is cores 0-63)"
    )
    assert slurm.refused(set(range(64)), 2, 64, "whole") is None
    assert slurm.refused(set(range(48, 64)), 2, 64, "none") is None
    # Two whole sockets of four: 24.11 takes them, 25.11 ("Cores match 1 socket", 26.05.0 line 3963) not.
    assert slurm.refused(set(range(32)), 4, 16, "whole") is None
    assert slurm.refused(set(range(32)), 4, 16, "one") is not None
    # Every core: "if (total_core_cnt == bit_size(tmp_bitmap)) return SLURM_SUCCESS" (f0f6916b28).
    assert slurm.refused(set(range(64)), 4, 16, "one") is None


def test_a_gpu_near_one_numa_node_of_a_socket_gets_whole_sockets_or_numa_nodes_as_sockets(
    loaded: LoadedRig,
) -> None:
    host = loaded.host("gpu-a")
    rig = loaded.rig_of(host)
    assert rig.slurm is not None
    # The old code wrote Cores=48-63: 24.11+ slurmctld refuses it and the node is INVAL.
    exact = rig.slurm.model_copy(update={"socket_layout": "exact"})
    facts = nps4_facts(node("24.11.1"))
    assert "Cores=48-63 " in slurm.gres_conf(host, rig, exact, facts)
    refused = slurm.cores_refused(exact, facts)
    assert refused and "doesn't match socket boundaries. (Socket 0 is cores 0-63)" in refused[0].summary
    # auto on 24.11: whole sockets; on 22.05: the GPU's own cores, which that version takes.
    text = slurm.gres_conf(host, rig, rig.slurm, facts)
    assert "File=/dev/nvidia0 Cores=0-63 " in text and "File=/dev/nvidia1 Cores=64-127 " in text
    assert not slurm.cores_refused(rig.slurm, facts)
    assert "Cores=48-63 " in slurm.gres_conf(host, rig, rig.slurm, nps4_facts(node("22.05.8")))
    # numa: one Slurm socket per NUMA node (slurm.conf.5 numa_node_as_socket), the GPU's node exactly.
    numa = rig.slurm.model_copy(update={"socket_layout": "numa"})
    numa_rig = rig.model_copy(update={"slurm": numa})
    text = slurm.gres_conf(host, numa_rig, numa, nps4_facts(node("26.05.0")))
    assert "File=/dev/nvidia0 Cores=48-63 " in text and "File=/dev/nvidia1 Cores=112-127 " in text
    line = slurm.node_line(host, numa_rig, nps4_facts(node("26.05.0")))
    assert line is not None and "Sockets=8 CoresPerSocket=16 ThreadsPerCore=1" in line
    notes = slurm.node_notes(host, numa_rig, nps4_facts(node("26.05.0")))
    assert any("SlurmdParameters=numa_node_as_socket" in n for n in notes)
    # The controller still counts 2 sockets and SlurmdParameters lacks the parameter: both said.
    held = nps4_facts(
        node("26.05.0", controller={"State": "IDLE", "Gres": "gpu:nvidia_a100-sxm4-80gb:2(S:3,7)",
                                    "Sockets": "2",
                                    "CoresPerSocket": "64", "ThreadsPerCore": "1"},
             config={"SlurmdParameters": "config_overrides"})
    )  # fmt: skip
    found = [
        c.summary for c in slurm.checks(host, numa_rig, numa, held, True) if c.resource == "slurm:layout"
    ]
    assert any("Sockets=2 (box: 8)" in s for s in found), found
    assert any(
        "SlurmdParameters=numa_node_as_socket, and the cluster's SlurmdParameters=config_overrides lacks" in s
        for s in found
    ), found


# --- item 2: the health script as slurmd runs it ------------------------------------------------------------


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def render_script(
    loaded: LoadedRig, tmp_path: Path, scontrol_body: str, check_exit: int
) -> tuple[Path, Path]:
    """The rendered script with scontrol (a recorder) and logger only in a folder of their own, and a node
    check that exits `check_exit`. Returns the script and the log the fakes write."""
    bin_dir = tmp_path / "opt-slurm-bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    _executable(
        bin_dir / "scontrol",
        f'#!/bin/sh\necho "scontrol $* SLURM_CONF=${{SLURM_CONF:-unset}}" >> {log}\n{scontrol_body}',
    )
    _executable(bin_dir / "logger", f'#!/bin/sh\necho "logger $*" >> {log}\n')
    check = _executable(
        tmp_path / "check", f"#!/bin/sh\necho 'FAIL xid: GPU 1 logged Xid 79'\nexit {check_exit}\n"
    )
    host = loaded.host("gpu-a")
    rig = loaded.rig_of(host)
    assert rig.slurm is not None
    wired = rig.slurm.model_copy(
        update={"health_check": str(check), "gres_conf": str(tmp_path / "etc" / "gres.conf")}
    )
    facts = nps4_facts(node("22.05.8", scontrol=str(bin_dir / "scontrol"), name="gpu-a"))
    path = _executable(tmp_path / "health.sh", slurm.health_script(host, rig, wired, facts, 45.0))
    return path, log


def as_slurmd_runs_it(script: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # run_script_health_check (slurmd.c, 26.05.0 line 3416): env_array_create() plus SLURMD_NODENAME only.
    return subprocess.run(
        ["env", "-i", "SLURMD_NODENAME=gpu-a", "/bin/sh", str(script)], capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def test_the_health_script_finds_scontrol_without_path_and_exports_no_missing_slurm_conf(
    loaded: LoadedRig, tmp_path: Path
) -> None:
    script, log = render_script(loaded, tmp_path, 'echo "NodeName=gpu-a State=IDLE Reason=none"\n', 2)
    done = as_slurmd_runs_it(script)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    # No slurm.conf beside gres.conf: scontrol keeps its own search (configless: /run/slurm/conf).
    assert calls[0] == "scontrol show node -o gpu-a SLURM_CONF=unset"
    assert (
        calls[1]
        == "scontrol update nodename=gpu-a state=drain reason=mgpu: xid: GPU 1 logged Xid 79 SLURM_CONF=unset"
    )
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "slurm.conf").write_text("")
    log.unlink()
    assert as_slurmd_runs_it(script).returncode == 0
    assert log.read_text().splitlines()[0].endswith(f"SLURM_CONF={tmp_path / 'etc' / 'slurm.conf'}")


def test_a_failing_or_hanging_scontrol_is_logged_and_the_node_left_alone(
    loaded: LoadedRig, tmp_path: Path
) -> None:
    script, log = render_script(loaded, tmp_path, "sleep 100\n", 2)
    started = time.monotonic()
    done = as_slurmd_runs_it(script)
    took = time.monotonic() - started
    assert done.returncode == 1 and "no answer within" in done.stderr, done.stderr
    # Within slurmd's 60 s: the scontrol call's own bound, not slurmd's kill.
    assert took < slurm.HEALTH_TIMEOUT_S - 45 + 2, took
    calls = log.read_text()
    assert "update" not in calls
    assert (
        "logger -t mgpu-provision-slurm-health -p daemon.err -- node gpu-a: scontrol show node gpu-a failed"
        in calls
    )

    (tmp_path / "opt-slurm-bin" / "scontrol").write_text(
        f'#!/bin/sh\necho "scontrol $*" >> {log}\n'
        "echo 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    log.unlink()
    done = as_slurmd_runs_it(script)
    assert done.returncode == 1 and "Unable to contact slurm controller" in done.stderr
    assert "logger -t mgpu-provision-slurm-health" in log.read_text()


def test_health_check_timeout_of_26_05_bounds_the_script(loaded: LoadedRig) -> None:
    # slurm.conf.5 (26.05.0) "HealthCheckTimeout: Time in seconds that HealthCheckProgram is allowed to run.
    # The default value is 60."
    host = loaded.host("gpu-a")
    rig = loaded.rig_of(host)
    assert rig.slurm is not None
    assert slurm.health_timeout_s(SlurmNode(config={"HealthCheckTimeout": "30 sec"})) == 30
    assert slurm.health_timeout_s(SlurmNode()) == 60
    short = nps4_facts(node("26.05.0", controller={"State": "IDLE"}, config={"HealthCheckTimeout": "30 sec",
                       "HealthCheckProgram": "(null)"}))  # fmt: skip
    found = [
        c.summary
        for c in slurm.checks(host, rig, rig.slurm, short, True, 45.0)
        if c.resource == "slurm:health"
    ]
    assert any("sets no HealthCheckProgram" in s for s in found), found
    assert any("after 30 s (HealthCheckTimeout)" in s for s in found), found


# --- items 4, 5: configless, NodeName=, a Cores= change -----------------------------------------------------


def test_configless_is_read_from_slurmd_s_command_line_or_its_run_dir(tmp_path: Path) -> None:
    # configless_slurm.shtml: "slurmd --conf-server slurmctl-primary:6817"; the cache "in /run/slurm/conf".
    assert machine.configless(["/usr/sbin/slurmd", "--conf-server", "ctl:6817"], str(tmp_path / "no")) == (
        "slurmd --conf-server ctl:6817"
    )
    assert (
        machine.configless(["slurmd", "--conf-server=ctl"], str(tmp_path / "no"))
        == "slurmd --conf-server ctl"
    )
    assert machine.configless(["slurmd"], str(tmp_path / "no")) is None
    assert "keeps the controller's files" in (machine.configless(["slurmd"], str(tmp_path)) or "")
    assert machine.option_of(["slurmd", "-N", "node7"], "-N") == "node7"


def test_a_configless_node_gets_the_lines_for_the_controller_not_a_local_file(loaded: LoadedRig) -> None:
    host = loaded.host("gpu-a")
    facts = nps4_facts(node("24.11.1", configless="slurmd --conf-server ctl:6817", name="gpu-a"))
    changes = {c.resource: c for c in plan_host(loaded, host, facts)}
    assert "file:/etc/slurm/gres.conf" not in changes and "slurmd" not in changes
    step = changes["slurm:configless"]
    assert step.action == "manual" and "controller's gres.conf" in step.summary
    assert step.desired is not None and step.desired.splitlines()[0].startswith(
        "NodeName=gpu-a AutoDetect=off Name=gpu Type=nvidia_a100-sxm4-80gb File=/dev/nvidia0 Cores=0-63"
    )


def test_every_gres_line_names_its_node_and_a_cores_change_asks_for_slurmctld(loaded: LoadedRig) -> None:
    host = loaded.host("gpu-a")
    rig = loaded.rig_of(host)
    assert rig.slurm is not None
    facts = nps4_facts(node("24.11.1", name="gpu-a"))
    text = slurm.gres_conf(host, rig, rig.slurm, facts)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines and all(line.startswith("NodeName=gpu-a AutoDetect=off Name=gpu ") for line in lines)
    old = text.replace("Cores=0-63", "Cores=48-63")
    there = {"path": "/etc/slurm/gres.conf", "exists": True, "mode": "0644", "content": old}
    moved = Facts.model_validate(dict(facts.model_dump(), files=[there]))
    changes = {c.resource: c for c in plan_host(loaded, host, moved)}
    # gres.conf.5: "A restart of the slurmctld is needed for changes to the Cores option to take effect."
    assert changes["slurmctld"].action == "manual" and "restart slurmctld" in changes["slurmctld"].summary
    assert changes["slurmd"].agent_step is not None
    same = Facts.model_validate(
        dict(facts.model_dump(), files=[dict(there, content=text.replace("AutoDetect=off ", ""))])
    )
    assert "slurmctld" not in {c.resource for c in plan_host(loaded, host, same)}


def test_a_node_name_that_differs_is_said_with_both_names(loaded: LoadedRig) -> None:
    host = loaded.host("gpu-a")
    rig = loaded.rig_of(host)
    assert rig.slurm is not None
    facts = nps4_facts(node("22.05.8", name="node07", error="scontrol show node node07: Invalid node name"))
    found = {c.resource: c.summary for c in slurm.checks(host, rig, rig.slurm, facts, True)}
    assert "(Slurm's NodeName node07, the rig's host gpu-a)" in found["slurm:node"]
    assert slurm.gres_conf(host, rig, rig.slurm, facts).count("NodeName=node07 ") == 2


# --- items 6, 7: RealMemory, AutoDetect=nvidia --------------------------------------------------------------


def test_real_memory_keeps_headroom_and_a_low_registration_is_named(loaded: LoadedRig) -> None:
    host = loaded.host("gpu-a")
    rig = loaded.rig_of(host)
    assert rig.slurm is not None
    facts = nps4_facts(node("22.05.8", registers={"RealMemory": "999000"}))
    line = slurm.node_line(host, rig, facts)
    assert line is not None and "RealMemory=970000 " in line
    spec = rig.model_copy(
        update={
            "slurm": rig.slurm.model_copy(update={"memory_headroom_percent": 0, "mem_spec_limit_mib": 8192})
        }
    )
    assert "RealMemory=1000000 MemSpecLimit=8192 " in (slurm.node_line(host, spec, facts) or "")
    assert any("slurmd -C says RealMemory=999000" in n for n in slurm.node_notes(host, rig, facts))
    # node_mgr.c: "Low RealMemory (reported:%lu < %.2f%% of configured:%lu)" -> the node is INVAL.
    low = nps4_facts(node("22.05.8", registers={"RealMemory": "999000"},
                          controller={"State": "IDLE", "RealMemory": "1000000"}))  # fmt: skip
    found = {c.resource: c for c in slurm.checks(host, rig, rig.slurm, low, True)}
    assert "Low RealMemory" in found["slurm:memory"].summary and found["slurm:memory"].desired == "999000"


def test_autodetect_nvidia_only_where_slurmd_has_it(loaded: LoadedRig) -> None:
    # gres.conf.5 (24.11.0): "nvidia: Automatically detect NVIDIA GPUs. No library required, but doesn't
    # detect MIGs or NVlinks. Added in Slurm 24.11."
    host = loaded.host("gpu-a")
    rig = loaded.rig_of(host)
    assert rig.slurm is not None
    auto = rig.slurm.model_copy(update={"autodetect": "nvidia"})
    text = slurm.gres_conf(host, rig, auto, nps4_facts(node("24.11.1")))
    assert "AutoDetect=nvidia Name=gpu" in text and "Links=" not in text
    old = [c.resource for c in slurm.checks(host, rig, auto, nps4_facts(node("22.05.8")), True)]
    assert "slurm:autodetect" in old
    assert "slurm:autodetect" not in [
        c.resource for c in slurm.checks(host, rig, auto, nps4_facts(node("24.11.1")), True)
    ]


# --- item 3: what a step asks for ---------------------------------------------------------------------------


def test_a_step_asks_for_the_gpus_cpus_and_the_rig_s_partition_account_reservation() -> None:
    # cgroup.conf.5 ConstrainDevices: "constrain the job's allowed devices based on GRES allocated
    # resources": a step that asks for no GPU sees none.
    assert slurm.srun_options(Slurm(), 8) == ["--gres=gpu:8", "--cpus-per-task=8", "--exclusive"]
    given = Slurm.model_validate(
        {
            "srun": {
                "partition": "gpu",
                "account": "ml",
                "reservation": "burnin",
                "exclusive": False,
                "cpus_per_rank": 6,
            }
        }
    )
    assert slurm.srun_options(given, 4) == [
        "--gres=gpu:4", "--cpus-per-task=24", "--partition=gpu", "--account=ml", "--reservation=burnin",
    ]  # fmt: skip


def test_the_registered_name_is_a_running_slurmd_s_n_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "running_slurmd", lambda proc="/proc": ["/usr/sbin/slurmd", "-N", "node07"])
    assert machine.registered_name(None, "gpu-a") == (None, "node07")
    monkeypatch.setattr(machine, "running_slurmd", lambda proc="/proc": None)
    assert machine.registered_name(None, "gpu-a") == (None, "gpu-a")
    assert os.path.isabs(machine.CONFIGLESS_DIR)


# --- build: GPUs mapped to jobs ---------------------------------------------------------------------------


def test_a_process_s_job_is_read_from_its_environment_or_its_slurm_cgroup(tmp_path: Path) -> None:
    for pid, environ, cgroup in (
        (10, b"HOME=/root\0SLURM_JOB_ID=4242\0", "0::/system.slice/slurmstepd.scope/job_1/step_0\n"),
        # cgroup/v1 "%s/job_%u" (xcgroup.c), a task that cleared its environment
        (11, b"", "5:devices:/slurm/uid_1000/job_77/step_0/task_0\n0::/\n"),
        (12, b"PATH=/bin\0", "0::/user.slice/session-3.scope\n"),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(environ)
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)
    assert machine.slurm_job_of(10, str(tmp_path)) == "4242"
    assert machine.slurm_job_of(11, str(tmp_path)) == "77"
    assert machine.slurm_job_of(12, str(tmp_path)) is None
    assert machine.slurm_job_of(13, str(tmp_path)) is None


def test_the_node_check_s_gpu_series_carry_the_job_and_user_of_the_processes_on_it() -> None:
    from mgpu_provision.node.verbs import check_metrics

    facts = {
        "gpus": [
            {"index": 0, "uuid": "GPU-0", "pci_bus_id": "0:1"},
            {"index": 1, "uuid": "GPU-1", "pci_bus_id": "0:2"},
        ],
        "processes": [
            {"pid": 1, "gpu": 0, "slurm_job": "42", "owner": "alice"},
            {"pid": 2, "gpu": 0, "slurm_job": "42", "owner": "alice"},
            {"pid": 3, "gpu": 1, "slurm_job": None, "owner": "bob"},
        ],
    }
    assert check_metrics.job_labels(facts) == {0: (("slurm_job", "42"), ("slurm_user", "alice"))}
    text = check_metrics.render("v", 0, 0.0, 1.0, [("health", [])], [], facts)
    assert 'check="health",gpu="0",UUID="GPU-0",pci_bus_id="0:1",slurm_job="42",slurm_user="alice"} 1' in text
    assert 'check="health",gpu="1",UUID="GPU-1",pci_bus_id="0:2"} 1' in text


def test_a_socket_layout_without_cores_is_refused_with_its_field(tmp_path: Path) -> None:
    from mgpu_provision.errors import ProvisionError

    (tmp_path / "rig.yaml").write_text(
        RIG.replace("slurm:\n", "slurm:\n      cores: false\n      socket_layout: numa\n")
    )
    with pytest.raises(ProvisionError, match=r"rigs\.pair\.slurm\.socket_layout.*cores: false"):
        load_rig(tmp_path / "rig.yaml")


def test_facts_end_a_hanging_scontrol_and_report_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurmd = _executable(
        tmp_path / "slurmd",
        '#!/bin/sh\n[ "$1" = -V ] && echo "slurm 24.11.1" && exit 0\n'
        'echo "NodeName=gpu-a CPUs=8 RealMemory=900"\n',
    )
    scontrol = _executable(tmp_path / "scontrol", "#!/bin/sh\nexec sleep 30\n")
    tools = {"slurmd": str(slurmd), "scontrol": str(scontrol)}
    monkeypatch.setattr(machine, "find_tool", tools.get)
    monkeypatch.setattr(machine, "_SLURM_TIMEOUT_S", 1)
    monkeypatch.setattr(machine, "running_slurmd", lambda proc="/proc": None)
    started = time.monotonic()
    found = machine.slurm("gpu-a", [], str(tmp_path))
    assert time.monotonic() - started < 5
    assert found is not None and found["controller"] is None and "timed out after 1 seconds" in found["error"]
    assert found["version"] == "24.11.1" and found["name"] == "gpu-a"
    assert found["registers"] == {"NodeName": "gpu-a", "CPUs": "8", "RealMemory": "900"}


def test_l3_caches_as_sockets_count_one_slurm_socket_per_ccx(loaded: LoadedRig) -> None:
    # slurm.conf.5 l3cache_as_socket: "Use the hwloc l3cache as the socket count ... along CCX boundaries".
    host = loaded.host("gpu-a")
    rig = loaded.rig_of(host)
    assert rig.slurm is not None
    ccx = rig.slurm.model_copy(update={"socket_layout": "l3cache"})
    plain = nps4_facts(node("25.11.0"))
    assert plain.machine is not None
    threads = [dict(t.model_dump(), l3=t.cpu // 8) for t in plain.machine.threads]  # 8 cores per CCX
    facts = Facts.model_validate(dict(plain.model_dump(), machine={"threads": threads, "memory_mib": 1000}))
    ccx_rig = rig.model_copy(update={"slurm": ccx})
    line = slurm.node_line(host, ccx_rig, facts)
    assert line is not None and "Sockets=16 CoresPerSocket=8 ThreadsPerCore=1" in line
    # GPU 0 near OS CPUs 48-63: two CCXs, which 25.11 ("exactly one socket") refuses: every core instead.
    text = slurm.gres_conf(host, ccx_rig, ccx, facts)
    assert "File=/dev/nvidia0 Cores=0-127 " in text
    assert any("l3cache_as_socket" in n for n in slurm.node_notes(host, ccx_rig, facts))
