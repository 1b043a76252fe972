"""gres.conf from facts, slurm.conf's node line and the checks against the controller."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.facts import Facts, SlurmNode
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.host import machine
from mgpu_provision.node.verbs.apply import run_step
from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.host import facts_request, plan_host
from mgpu_provision.plan.resources import slurm
from mgpu_provision.rig import LoadedRig, load_rig
from tests.support.factories import facts_from_twin, write_twin

# A box with SMT on: 2 sockets x 4 cores x 2 threads; topo -m prints OS CPU ids, siblings included, as
# DeepOps copied them into gres.conf (NVIDIA/deepops#1195).
SMT_TOPOLOGY = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\t0-3,8-11\t0
GPU1\tNV4\t X \t4-7,12-15\t1
"""
SMT_MACHINE = {"sockets": 2, "cores_per_socket": 4, "threads_per_core": 2, "memory_mib": 128000}
RIG = """
hosts:
  - {name: gpu-a, address: 10.0.0.11, rig: pair}
rigs:
  pair:
    gpus: {model: NVIDIA GeForce RTX 3090, count: 2}
    slurm: {restart_command: [/usr/local/bin/restart-slurmd]}
"""


@pytest.fixture
def loaded(tmp_path: Path) -> LoadedRig:
    (tmp_path / "rig.yaml").write_text(RIG)
    return load_rig(tmp_path / "rig.yaml")


def smt_facts(tmp_path: Path, **gpu_fields: list[dict[str, object]]) -> Facts:
    twin = write_twin(tmp_path, SMT_TOPOLOGY, 2, machine=SMT_MACHINE)
    if gpu_fields:
        data = json.loads(twin.read_text())
        for gpu, extra in zip(data["gpus"], gpu_fields["gpus"], strict=True):
            gpu.update(extra)
        twin.write_text(json.dumps(data))
    return facts_from_twin(twin, slurm=True)


@pytest.fixture(autouse=True)
def no_slurmd_of_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts of a Slurm rig read the CPU layout; what this machine's own slurmd says is not asked."""
    monkeypatch.setattr(machine, "slurm", lambda *args: None)


def test_cores_are_slurm_logical_core_indices_not_the_os_cpus_of_topo(tmp_path: Path) -> None:
    lines = slurm.gres_lines(smt_facts(tmp_path), "rtx_3090", with_cores=True, with_links=True)
    assert lines == [
        "Name=gpu Type=rtx_3090 File=/dev/nvidia0 Cores=0-3 Links=-1,4",
        "Name=gpu Type=rtx_3090 File=/dev/nvidia1 Cores=4-7 Links=4,-1",
    ]


def test_core_ids_that_skip_still_number_densely_socket_by_socket() -> None:
    facts = Facts.model_validate(
        {
            "agent_version": "t",
            "host": {"hostname": "n", "os": "x", "kernel": "k", "arch": "x86_64", "boot_id": "b",
                     "python": "3", "user": "root"},
            "driver": {"nvml": "ok"},
            "machine": {"threads": [{"cpu": c, "socket": c // 2, "core": (c % 2) * 8} for c in range(4)]},
        }
    )  # fmt: skip
    assert facts.machine is not None
    assert slurm.slurm_cores(facts.machine) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert slurm.layout(facts.machine) == (2, 2, 1)


def test_lines_follow_pci_bus_order_and_minor_numbers(tmp_path: Path) -> None:
    facts = smt_facts(
        tmp_path,
        gpus=[{"pci_bus_id": "00000000:81:00.0", "minor": 1}, {"pci_bus_id": "00000000:01:00.0", "minor": 0}],
    )
    lines = slurm.gres_lines(facts, "t", with_cores=True, with_links=False)
    assert lines == [
        "Name=gpu Type=t File=/dev/nvidia0 Cores=4-7",
        "Name=gpu Type=t File=/dev/nvidia1 Cores=0-3",
    ]


def test_cores_and_links_can_be_left_out(tmp_path: Path) -> None:
    lines = slurm.gres_lines(smt_facts(tmp_path), "t", with_cores=False, with_links=False)
    assert lines == ["Name=gpu Type=t File=/dev/nvidia0", "Name=gpu Type=t File=/dev/nvidia1"]


def test_node_line_for_slurm_conf(loaded: LoadedRig, tmp_path: Path) -> None:
    host = loaded.host("gpu-a")
    line = slurm.node_line(host, loaded.rig_of(host), smt_facts(tmp_path))
    assert (
        line is not None
        and line.endswith(
            # RealMemory: 128000 MiB less 3% headroom
            "Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=124160 Gres=gpu:nvidia_geforce_rtx_3090:2"
        )
    )


def test_plan_writes_gres_conf_and_restarts_slurmd_once(loaded: LoadedRig, tmp_path: Path) -> None:
    host = loaded.host("gpu-a")
    request = facts_request(loaded, host)
    assert "/etc/slurm/gres.conf" in request["files"] and request["slurm"] is True
    facts = smt_facts(tmp_path)
    changes = {c.resource: c for c in plan_host(loaded, host, facts)}
    written = changes["file:/etc/slurm/gres.conf"]
    assert written.agent_step is not None
    assert (
        "Name=gpu Type=nvidia_geforce_rtx_3090 File=/dev/nvidia0 Cores=0-3 Links=-1,4\n"
        in written.agent_step["content"]
    )
    assert changes["slurmd"].agent_step == {"kind": "restart", "command": ["/usr/local/bin/restart-slurmd"]}
    protocol.check_step(0, changes["slurmd"].agent_step)
    there = {
        "path": "/etc/slurm/gres.conf",
        "exists": True,
        "mode": "0644",
        "content": written.agent_step["content"],
    }
    settled = Facts.model_validate(dict(facts.model_dump(), files=[there]))
    resources = {c.resource for c in plan_host(loaded, host, settled)}
    assert "file:/etc/slurm/gres.conf" not in resources and "slurmd" not in resources


def test_the_health_script_is_managed_only_with_a_health_check(loaded: LoadedRig, tmp_path: Path) -> None:
    host = loaded.host("gpu-a")
    facts = smt_facts(tmp_path)
    assert [f.path for f in slurm.desired(HostContext(loaded, host, facts))] == ["/etc/slurm/gres.conf"]
    with_check = RIG.replace("slurm: {", "slurm: {health_check: /usr/local/bin/c, ") + "node_check: {}\n"
    (tmp_path / "rig.yaml").write_text(with_check)
    checked = load_rig(tmp_path / "rig.yaml")
    files = {f.path: f for f in slurm.desired(HostContext(checked, checked.host("gpu-a"), facts))}
    script = files["/usr/local/bin/mgpu-provision-slurm-health"]
    assert script.mode == "0755"
    assert "    SLURM_CONF=/etc/slurm/slurm.conf\n" in script.content
    # DCGM's diag takes minutes: the timer runs it, never slurmd's HealthCheckProgram (60 s).
    assert "out=$(/usr/local/bin/c --no-dcgm-diag 2>&1)\n" in script.content


def _with_controller(facts: Facts, **line: str) -> Facts:
    return facts.model_copy(update={"slurm": SlurmNode(registers={}, controller=line)})


def test_a_box_with_a_gpu_missing_is_reported_before_slurmd_makes_the_node_inval(
    loaded: LoadedRig, tmp_path: Path
) -> None:
    twin = write_twin(tmp_path, None, 1, machine=SMT_MACHINE)
    gres = "gpu:nvidia_geforce_rtx_3090:2(S:0-1)"
    facts = _with_controller(facts_from_twin(twin, slurm=True), State="IDLE", Gres=gres)
    rig = loaded.rig_of(loaded.host("gpu-a"))
    assert rig.slurm is not None
    found = slurm.checks(loaded.host("gpu-a"), rig, rig.slurm, facts, gres_conf_current=False)
    gres = [c for c in found if c.resource == "slurm:gres"]
    assert gres and "INVAL" in gres[0].summary and gres[0].action == "verify-failed"
    assert (
        gres[0].current == "gpu:nvidia_geforce_rtx_3090:2"
        and gres[0].desired == "gpu:nvidia_geforce_rtx_3090:1"
    )


@pytest.mark.parametrize(
    "state, reason, ours",
    [
        ("IDLE+DRAIN", "mgpu: GPU 1 lost", True),
        ("IDLE+DRAIN", "disk swap [admin]", False),
        ("INVAL", "", True),
    ],
)
def test_node_state_of_ours_is_a_failed_check_an_admins_drain_is_not(
    loaded: LoadedRig, tmp_path: Path, state: str, reason: str, ours: bool
) -> None:
    facts = _with_controller(
        smt_facts(tmp_path), State=state, Reason=reason, Gres="gpu:nvidia_geforce_rtx_3090:2(S:0-1)"
    )
    rig = loaded.rig_of(loaded.host("gpu-a"))
    assert rig.slurm is not None
    found = [
        c.resource for c in slurm.checks(loaded.host("gpu-a"), rig, rig.slurm, facts, gres_conf_current=True)
    ]
    assert ("slurm:state" in found) is ours


def test_lost_affinity_and_a_layout_mismatch_are_named(loaded: LoadedRig, tmp_path: Path) -> None:
    facts = _with_controller(
        smt_facts(tmp_path),
        State="IDLE",
        Gres="gpu:nvidia_geforce_rtx_3090:2",
        Sockets="2",
        ThreadsPerCore="1",
    )
    rig = loaded.rig_of(loaded.host("gpu-a"))
    assert rig.slurm is not None
    found = {
        c.resource: c.summary
        for c in slurm.checks(loaded.host("gpu-a"), rig, rig.slurm, facts, gres_conf_current=True)
    }
    assert "without (S:...)" in found["slurm:affinity"]
    assert "ThreadsPerCore=1 (box: 2)" in found["slurm:layout"]


def test_the_restart_step_runs_the_command_and_fails_with_its_words() -> None:
    assert run_step({"kind": "restart", "command": ["true"]}, None) == (True, "ran true")  # type: ignore[arg-type]
    with pytest.raises(AgentFailure, match="sh -c echo nope >&2; exit 3 exited 3: nope"):
        run_step({"kind": "restart", "command": ["sh", "-c", "echo nope >&2; exit 3"]}, None)  # type: ignore[arg-type]
