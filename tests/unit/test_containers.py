"""Containers as data: the CDI reader on nvidia-ctk's own spec, the judge's stale/missing/invalid/foreign/
conflict findings, runtimes, the plan's Changes and phase, and the simulated nvidia-ctk's refusals.

The recorded spec is NVIDIA/nvidia-container-toolkit's own test answer (tests/fixtures/cdi/); the simulated
nvidia-ctk's spec is read back by the same reader, so writer and reader agree on one format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import protocol
from mgpu_provision.facts import Facts
from mgpu_provision.judge.containers import containers, stale
from mgpu_provision.judge.records import Expectation, expectation_from_json, expectation_to_json
from mgpu_provision.judge.verdict import judge_node
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.nvidia import ctk_sim
from mgpu_provision.node.nvidia.nvml_sim import SimulatedBackend
from mgpu_provision.node.verbs import containers as cdi
from mgpu_provision.plan.host import host_context
from mgpu_provision.plan.resources import containers as resource
from mgpu_provision.rig import load_rig
from tests.support.factories import facts, gpu

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cdi"
SPEC = "/etc/cdi/nvidia.yaml"
LOADED = "550.54.15"
EXPECT = Expectation(
    "NVIDIA GeForce RTX 3090", 2, containers=True, toolkit_version="1.17.8", runtimes=("podman",)
)


def spec_record(
    version: str = LOADED, count: int = 2, path: str = SPEC, exists: bool = True
) -> dict[str, Any]:
    """What the node reports for the spec the simulated nvidia-ctk writes, every path present unless not."""
    gpus = [(g["index"], g["uuid"], g["index"]) for g in (gpu(i) for i in range(count))]
    data = ctk_sim.spec(version, gpus, "/", "/usr/bin/nvidia-cdi-hook")
    text = json.dumps(data) if path.endswith(".json") else ctk_sim.to_yaml(data)
    record = cdi.parse_spec(text, path)
    for entry in record["paths"]:
        entry["exists"] = exists
    return record


def box(*specs: dict[str, Any], toolkit: str | None = "1.17.8", **more: Any) -> dict[str, Any]:
    found = {"toolkit": toolkit, "refresh": False, "specs": list(specs)}
    found["runtimes"] = more.pop("runtimes", {"podman": {"installed": True}})
    document = facts(gpus=[gpu(0), gpu(1)], containers=found, **more).model_dump()
    return document


def test_the_reader_takes_nvidia_ctks_own_spec() -> None:
    path = FIXTURES / "nvidia-ctk-default.yaml"
    record = cdi.parse_spec(path.read_text(), str(path))
    assert record["error"] is None
    assert (record["kind"], record["cdi_version"], record["devices"]) == (
        "example.com/device",
        "0.5.0",
        ["0", "all"],
    )
    assert {(p["role"], p["path"]) for p in record["paths"]} == {
        ("device", "/run/nvidia/driver/dev/nvidiactl"),
        ("device", "/run/nvidia/driver/dev/nvidia0"),
        ("mount", "/run/nvidia/driver/lib/x86_64-linux-gnu/libcuda.so.999.88.77"),
        ("mount", "/run/nvidia/driver/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.999.88.77"),
        ("hook", "/usr/bin/nvidia-cdi-hook"),
    }
    # Judged against a box whose loaded driver is another one, the spec is stale by its libraries.
    assert stale({"driver": {"loaded": "570.86.15"}}, record) == [
        "mounts driver libraries 999.88.77, the loaded driver is 570.86.15"
    ]


def test_a_fresh_spec_passes_and_each_way_of_going_stale_is_named() -> None:
    assert containers(box(spec_record()), EXPECT) == []
    assert containers(box(spec_record(path="/etc/cdi/nvidia.json")), EXPECT)[0].kind == "missing"
    [old] = containers(box(spec_record("535.161.08")), EXPECT)
    assert (old.check, old.kind) == ("cdi", "stale")
    assert "mounts driver libraries 535.161.08, the loaded driver is 550.54.15" in old.message
    hook, gone = containers(box(spec_record(exists=False)), EXPECT)
    assert "7 missing: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools …" in gone.message
    # A missing hook is not fixed by generating again (the spec names the hook path it was given).
    assert (hook.kind, hook.message) == (
        "failed",
        f"CDI spec {SPEC} runs hook /usr/bin/nvidia-cdi-hook, which is missing",
    )
    [fewer] = containers(box(spec_record(count=1)), EXPECT)
    assert "GPU 1 not in its devices" in fewer.message
    [more] = containers(box(spec_record(count=3)), EXPECT)
    assert "names device(s) 2, GPU-00000000-0000-0000-0000-000000000002 NVML does not list" in more.message


def test_bad_specs_are_findings_and_only_the_managed_one_is_regenerated() -> None:
    broken = cdi.parse_spec("kind: nvidia.com/gpu\ndevices: [\n", SPEC)
    assert broken["error"].startswith("not valid YAML: line 2")
    bad_json = cdi.parse_spec('{"kind": "nvidia.com/gpu", ', "/var/run/cdi/x.json")
    assert bad_json["error"].startswith("not valid JSON: ")
    [invalid] = containers(box(broken), EXPECT)
    assert invalid.kind == "invalid"
    # Elsewhere it is not ours: reported, and our own spec is still looked for.
    found = containers(box(bad_json, spec_record()), EXPECT)
    assert [(f.kind, f.message.split(" (")[0]) for f in found] == [
        ("failed", "CDI spec /var/run/cdi/x.json cannot be read")
    ]
    amd = dict(spec_record(), kind="amd.com/gpu")
    [foreign] = containers(box(amd), EXPECT)
    assert foreign.kind == "foreign" and "another vendor's spec (kind amd.com/gpu)" in foreign.message
    [conflict] = containers(box(spec_record(), spec_record(path="/var/run/cdi/nvidia.yaml")), EXPECT)
    assert conflict.kind == "conflict" and conflict.summary.endswith(
        f"remove all but {SPEC} (a runtime picks one by directory order)"
    )


def test_runtimes_not_installed_unconfigured_or_unreadable() -> None:
    expect = EXPECT._replace(runtimes=("podman", "docker", "containerd", "cri-o"))
    runtimes = {
        "podman": {"installed": True, "configured": None},
        "docker": {"installed": False},
        "containerd": {"installed": True, "configured": False},
        "cri-o": {"installed": True, "configured": False, "error": "/etc/crio/crio.conf: Permission denied"},
    }
    found = containers(box(spec_record(), runtimes=runtimes), expect)
    assert [(f.desired, f.kind) for f in found] == [
        ("docker", "not-installed"),
        ("containerd", "unconfigured"),
        ("cri-o", "config-invalid"),
    ]


def test_the_reader_reads_runtime_configs_as_nvidia_ctk_writes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, crio = tmp_path / "daemon.json", tmp_path / "99-nvidia.toml"
    monkeypatch.setitem(cdi.RUNTIMES, "docker", ("sh", (str(daemon),), None))
    monkeypatch.setitem(cdi.RUNTIMES, "cri-o", ("no-such-crio", (str(crio),), "runtimes.nvidia]"))
    assert cdi.read_runtimes(["docker", "cri-o"]) == {
        "docker": {"installed": True, "config": None, "configured": False, "error": None},
        "cri-o": {"installed": False, "config": None, "configured": False, "error": None},
    }
    daemon.write_text('{"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}')
    assert cdi.read_runtimes(["docker"])["docker"]["configured"] is True
    daemon.write_text('{"runtimes": ')
    assert cdi.read_runtimes(["docker"])["docker"]["error"].startswith(f"{daemon} is not valid JSON")


def test_the_simulated_nvidia_ctk_refuses_an_unreadable_docker_config_and_leaves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = tmp_path / "daemon.json"
    monkeypatch.setattr(ctk_sim, "DOCKER_CONFIG", str(daemon))
    daemon.write_text('{"log-driver": ')
    with pytest.raises(AgentFailure, match=r"unable to load config .*; nothing was changed"):
        ctk_sim.configure_runtime("docker")
    assert daemon.read_text() == '{"log-driver": '
    daemon.write_text('{"log-driver": "json-file"}')
    assert ctk_sim.configure_runtime("docker")[0]
    assert json.loads(daemon.read_text()) == {
        "log-driver": "json-file",
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }
    assert ctk_sim.configure_runtime("docker") == (False, f"{daemon} already has the nvidia runtime")


def test_the_simulated_nvidia_ctk_needs_nvml_like_the_real_one(tmp_path: Path) -> None:
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps({
        "driver": {"version": "570.86.15", "loaded": LOADED},  # installed, not yet loaded: NVML mismatch
        "gpus": [{"name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576}],
        "containers": {"toolkit": "1.17.8"},
    }))  # fmt: skip
    output = tmp_path / "cdi" / "nvidia.yaml"
    step = protocol.check_step(0, protocol.cdi_generate_step(str(output), "/", "/usr/bin/nvidia-cdi-hook"))
    with pytest.raises(AgentFailure, match="Driver/library version mismatch"):
        SimulatedBackend(str(twin)).generate_cdi(step)
    assert not output.exists()


def rig(driver: str = LOADED, **containers: Any) -> dict[str, Any]:
    return {
        "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
        "driver": {"version": driver},
        "containers": {"toolkit": "1.17.8", "runtimes": ["podman"], **containers},
    }


@pytest.fixture
def plan(tmp_path: Path) -> Any:
    """The containers diff for gpu-a of a rig file with `the_rig` (default: rig()) over `document`."""

    def diff(document: dict[str, Any], the_rig: dict[str, Any] | None = None) -> list[Any]:
        path = tmp_path / "rig.yaml"
        rig_file = {"hosts": [{"name": "gpu-a", "rig": "pair"}], "rigs": {"pair": the_rig or rig()}}
        path.write_text(json.dumps(rig_file))
        loaded = load_rig(path)
        return resource.diff(host_context(loaded, loaded.host("gpu-a"), Facts.model_validate(document)))

    return diff


def test_plan_regenerates_a_stale_spec_only_once_the_pinned_driver_is_loaded(plan: Any) -> None:
    [change] = plan(box(spec_record("535.161.08")))
    assert (change.resource, change.phase, change.agent_step) == (
        "cdi",
        "containers",
        {"kind": "cdi-generate", "output": SPEC, "driver_root": "/", "hook_path": "/usr/bin/nvidia-cdi-hook"},
    )
    # The rig pins a new driver: the spec follows it after the reboot, so no step now (nvidia-ctk needs NVML).
    upgrade = rig(driver="570.86.15")
    [later] = plan(box(spec_record()), upgrade)
    assert later.agent_step is None and "after its reboot" in later.summary
    assert plan(box(spec_record())) == []


def test_plan_installs_the_toolkit_then_generates_and_reports_what_is_not_its_own(plan: Any) -> None:
    changes = plan(box(toolkit=None))
    assert [(c.resource, c.agent_step["kind"] if c.agent_step else None) for c in changes] == [
        ("container-toolkit", "container-toolkit"),
        ("cdi", "cdi-generate"),
    ]
    step = changes[0].agent_step
    assert step == {"kind": "container-toolkit", "version": "1.17.8", "method": "apt", "hold": True,
                    "packages": ["nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                 "libnvidia-container-tools", "libnvidia-container1"]}  # fmt: skip
    amd = dict(spec_record(), kind="amd.com/gpu")
    [foreign] = plan(box(amd))
    assert (foreign.action, foreign.agent_step) == ("manual", None)
    unconfigured = plan(
        box(spec_record(), runtimes={"docker": {"installed": True, "configured": False}}),
        rig(runtimes=["docker"]),
    )
    assert [c.agent_step for c in unconfigured] == [{"kind": "runtime-configure", "runtime": "docker"}]


def test_the_refresh_service_owns_the_spec_where_it_is_enabled(plan: Any) -> None:
    document = box(spec_record(path="/var/run/cdi/nvidia.yaml"))
    document["containers"]["refresh"] = True
    assert plan(document) == []


def test_the_node_check_judges_containers_from_the_expectation_file() -> None:
    expect = expectation_from_json(json.loads(json.dumps(expectation_to_json(EXPECT))))
    assert expect == EXPECT
    assert [f.check for f in judge_node(box(spec_record("535.161.08")), expect)] == ["cdi"]


def test_the_door_refuses_a_cdi_step_without_its_output() -> None:
    with pytest.raises(protocol.BadRequest, match=r"step 0 \(cdi-generate\): `output` is missing"):
        protocol.check_step(0, {"kind": "cdi-generate"})


def test_read_specs_reads_yaml_and_json_and_marks_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text(
        ctk_sim.to_yaml(ctk_sim.spec(LOADED, [(0, "GPU-x", 0)], str(tmp_path), "/bin/sh"))
    )
    (tmp_path / "other.json").write_text(
        '{"cdiVersion": "0.6.0", "kind": "vendor.com/net", "devices": [{"name": "a"}]}'
    )
    (tmp_path / "README").write_text("not a spec")
    os.symlink("/no/such/file", tmp_path / "dangling.yaml")
    specs = cdi.read_specs((str(tmp_path),))
    assert [(Path(s["path"]).name, s["kind"], s["error"]) for s in specs] == [
        ("nvidia.yaml", "nvidia.com/gpu", None),
        ("other.json", "vendor.com/net", None),
    ]
    assert {p["path"]: p["exists"] for p in specs[0]["paths"]}["/bin/sh"] is True
    assert {p["path"]: p["exists"] for p in specs[0]["paths"]}[f"{tmp_path}/dev/nvidia0"] is False


ZYPPER = ["zypper", "--non-interactive"]


def test_the_toolkit_install_commands_lift_holds_install_at_the_version_and_hold_again() -> None:
    from mgpu_provision.catalog.containers import TOOLKIT_PACKAGES
    from mgpu_provision.node.packages import toolkit

    names = list(TOOLKIT_PACKAGES)
    for method, unlock, install, lock in (
        ("dnf", ["dnf", "versionlock", "delete"], ["dnf", "install", "-y"], ["dnf", "versionlock", "add"]),
        ("zypper", [*ZYPPER, "removelock"], [*ZYPPER, "install", "--oldpackage"], [*ZYPPER, "addlock"]),
    ):
        step = protocol.check_step(0, protocol.container_toolkit_step("1.17.8", method, True, names))
        commands = toolkit.install_commands(step, "1.17.8-1" if method == "zypper" else "1.17.8")
        sep = "=" if method == "zypper" else "-"
        version = "1.17.8-1" if method == "zypper" else "1.17.8"
        assert [c.argv for c in commands] == [
            unlock + names,
            install + [f"{n}{sep}{version}" for n in names],
            lock + names,
        ]
        assert not commands[0].check  # nothing locked yet is not a failure


def test_the_simulated_nvidia_ctk_writes_containerds_and_cri_os_drop_ins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_ins = {
        name: (str(tmp_path / name / "99-nvidia.toml"), text) for name, (_, text) in ctk_sim.DROP_INS.items()
    }
    monkeypatch.setattr(ctk_sim, "DROP_INS", drop_ins)
    monkeypatch.setitem(cdi.RUNTIMES, "containerd", ("sh", (drop_ins["containerd"][0],), ".runtimes.nvidia]"))
    monkeypatch.setitem(cdi.RUNTIMES, "cri-o", ("sh", (drop_ins["cri-o"][0],), "runtimes.nvidia]"))
    assert [cdi.read_runtimes([n])[n]["configured"] for n in ("containerd", "cri-o")] == [False, False]
    for name in ("containerd", "cri-o"):
        assert ctk_sim.configure_runtime(name)[0]
        assert not ctk_sim.configure_runtime(name)[0]  # a second run changes nothing
    assert [cdi.read_runtimes([n])[n]["configured"] for n in ("containerd", "cri-o")] == [True, True]
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in Path(drop_ins["containerd"][0]).read_text()


def test_a_mig_change_makes_the_spec_stale_both_ways() -> None:
    """nvidia-ctk gives a GPU in MIG mode no whole-GPU device, only MIG ones (pkg/nvcdi/lib-nvml.go)."""
    in_mig = box(spec_record(), health={"gpus": [{"index": 0, "mig": True}, {"index": 1, "mig": False}]})
    [whole] = containers(in_mig, EXPECT)
    assert "names GPU 0 whole, which is in MIG mode" in whole.message
    record = spec_record()
    record["devices"] = ["1", "0:0", "0:1", "all"]
    assert containers(box(record, health=in_mig["health"]), EXPECT) == []
    [stray] = containers(box(record), EXPECT)  # MIG switched off again
    assert "GPU 0 not in its devices; names MIG device(s) 0:0, 0:1 of a GPU not in MIG mode" in stray.message


def test_a_broken_spec_elsewhere_does_not_keep_the_new_toolkit_from_writing_ours(plan: Any) -> None:
    bad = cdi.parse_spec("{", "/var/run/cdi/x.json")
    changes = plan(box(bad, spec_record(), toolkit="1.16.2"))
    assert [(c.resource, c.action, c.agent_step is not None) for c in changes] == [
        ("container-toolkit", "update", True),
        ("cdi", "verify-failed", False),
        ("cdi", "update", True),
    ]


def test_the_hook_is_the_toolkits_own_unless_the_rig_names_one(plan: Any) -> None:
    """Before 1.16.0 the hooks are nvidia-ctk's `hook` command (CHANGELOG.md v1.16.0-rc.1)."""
    [old] = plan(box(spec_record("535.161.08"), toolkit="1.15.0"), rig(toolkit="1.15.0"))
    assert old.agent_step["hook_path"] == "/usr/bin/nvidia-ctk"
    [named] = plan(box(spec_record("535.161.08")), rig(cdi={"hook_path": "/opt/hook"}))
    assert named.agent_step["hook_path"] == "/opt/hook"
