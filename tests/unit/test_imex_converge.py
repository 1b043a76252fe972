"""GB200 compute trays with `driver.imex`: nvidia-imex is installed at the driver's version and its unit
enabled and started by one apply, nodes_config.cfg lists the domain's peers (issue 37 item 10), a changed
list restarts the daemon, and the next plan is clean; no Fabric Manager is asked for (issue 26 defect 2).
A domain that is not UP is a failed check in plan and a failure in the node check's judgement."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mgpu_provision.judge import verdict
from mgpu_provision.judge.driver import imex as judge_imex
from mgpu_provision.judge.records import FAIL, Expectation
from mgpu_provision.node.packages.imex import imex_domain
from mgpu_provision.plan.host import expectation_of
from mgpu_provision.rig import load_rig
from tests.support.converge import apply_steps, changes_of
from tests.support.factories import facts_from_twin, twin_state_dir

TWINS = Path(__file__).resolve().parents[2] / "examples" / "twins"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "imex"
RIG = """\
version: 1
hosts:
  - {{name: tray1, address: 10.0.0.11, rig: tray}}
  - {{name: tray2, address: 10.0.0.12, rig: tray}}
  - {{name: other, address: 10.9.9.9, rig: pcie}}
rigs:
  tray:
    gpus: {{model: "NVIDIA GB200", count: 4}}
    bridge: {{kind: nvswitch, links: 18}}
    driver: {{version: "580.95.05", source: cuda, imex: {imex}}}
  pcie:
    gpus: {{model: "NVIDIA L4", count: 1}}
files: {{profile_d: null, environment_file: null, launcher: null}}
"""


def _tray(tmp_path: Path, imex: str) -> tuple[Path, Path, Path]:
    twin = tmp_path / "tray.yaml"
    shutil.copy(TWINS / "gb200-tray.yaml", twin)
    config = tmp_path / "nodes_config.cfg"
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG.format(imex=imex.replace("CONFIG", str(config))))
    return rig, twin, config


def test_imex_converges_on_a_gb200_tray_with_its_domain(tmp_path: Path) -> None:
    rig, twin, config = _tray(tmp_path, "{nodes_config: CONFIG}")
    resources = ("imex", "fabricmanager", f"file:{config}")
    # Another driver first: neither nvidia-imex nor its file before it (its package brings the file).
    rig.write_text(rig.read_text().replace('"580.95.05"', '"580.105.08"'))
    assert changes_of(rig, "tray1", twin, resources) == []
    rig.write_text(rig.read_text().replace('"580.105.08"', '"580.95.05"'))

    install, written, first_restart = changes_of(rig, "tray1", twin, resources)
    assert (install.resource, install.action, install.desired) == ("imex", "create", "580.95.05")
    assert install.agent_step["packages"] == ["nvidia-imex"] and install.agent_step["unit"] == "nvidia-imex"
    # peers: fleet (the default): every host of the rig type, one IP address a line, in the rig's order.
    assert (written.resource, written.action) == (f"file:{config}", "create")
    assert written.agent_step["content"] == "10.0.0.11\n10.0.0.12\n"
    # The install starts the daemon with the package's file: it is started again once the list is written.
    assert first_restart.agent_step is not None and first_restart.agent_step["restart"] is True
    results = apply_steps(twin, tmp_path / "apply.lock", [install, written, first_restart])
    assert all(r["changed"] for r in results), results
    assert config.read_text() == "10.0.0.11\n10.0.0.12\n"
    imex = facts_from_twin(twin).imex
    assert imex is not None and (imex.version, imex.service, imex.enabled) == ("580.95.05", "active", True)
    assert imex.domain is not None and imex.domain.status == "UP"
    assert changes_of(rig, "tray1", twin, resources) == []

    # Another list while the daemon runs: the file, then the daemon's restart (it reads it only at start).
    rig.write_text(rig.read_text().replace("{nodes_config:", "{peers: [10.0.0.11, 10.0.0.13], nodes_config:"))
    update, restart = changes_of(rig, "tray1", twin, resources)
    assert (update.action, update.agent_step["content"]) == ("update", "10.0.0.11\n10.0.0.13\n")
    assert restart.agent_step == {
        "kind": "service", "unit": "nvidia-imex", "enable": True, "start": True, "restart": True
    }  # fmt: skip
    apply_steps(twin, tmp_path / "apply.lock", [update, restart])
    state = json.loads(Path(twin_state_dir(twin), "twin-state").joinpath(_state_name(twin)).read_text())
    assert state["restarts"] == {"nvidia-imex": 2}
    assert changes_of(rig, "tray1", twin, resources) == []


def _state_name(twin: Path) -> str:
    (found,) = [
        p.name for p in Path(twin_state_dir(twin), "twin-state").iterdir() if p.name.startswith("tray-")
    ]
    return found


def test_per_job_writes_no_peers_and_judges_no_domain(tmp_path: Path) -> None:
    rig, twin, config = _tray(tmp_path, "{peers: per_job, nodes_config: CONFIG}")
    twin.write_text(twin.read_text() + 'imex: "580.95.05"\nimex_domain: {status: DOWN}\n')
    twin.write_text(
        twin.read_text().replace("nvidia-imex: {enabled: false, running: false}", "nvidia-imex: {}")
    )
    apply_steps(twin, tmp_path / "apply.lock", [*changes_of(rig, "tray1", twin, ("imex",))])
    assert changes_of(rig, "tray1", twin, ("imex", f"file:{config}")) == []
    loaded = load_rig(rig)
    host = loaded.host("tray1")
    assert not expectation_of(loaded, host, facts_from_twin(twin)).imex_domain


def test_a_domain_not_up_fails_plan_and_the_node_check(tmp_path: Path) -> None:
    rig, twin, config = _tray(tmp_path, "{nodes_config: CONFIG}")
    config.write_text("10.0.0.11\n10.0.0.12\n")
    degraded = json.loads((FIXTURES / "nvidia-imex-ctl-N-j-degraded.json").read_text())
    twin.write_text(
        twin.read_text().replace(
            "nvidia-imex: {enabled: false, running: false}", "nvidia-imex: {enabled: true, running: true}"
        )
        + 'imex: "580.95.05"\n'
        + f"imex_domain: {json.dumps(degraded)}\n"
    )
    (check,) = changes_of(rig, "tray1", twin, ("imex",))
    assert (check.action, check.current, check.desired) == ("verify-failed", "DEGRADED", "UP")
    assert check.summary.startswith("the IMEX domain is DEGRADED")

    loaded = load_rig(rig)
    host = loaded.host("tray1")
    facts = facts_from_twin(twin)
    findings = verdict.judge_node(facts.model_dump(mode="json"), expectation_of(loaded, host, facts))
    (imex,) = [f for f in findings if f.check == "imex"]
    assert (imex.kind, imex.severity) == ("domain-degraded", FAIL)


def test_the_domain_as_nvidia_imex_ctl_says_it() -> None:
    degraded = imex_domain((FIXTURES / "nvidia-imex-ctl-N-j-degraded.json").read_text())
    assert degraded["status"] == "DEGRADED" and degraded["error"] is None
    assert [(n["index"], n["host"], n["status"]) for n in degraded["nodes"]] == [
        (1, "10.76.183.30", "READY"), (3, "10.76.186.255", "READY")
    ]  # fmt: skip
    down = imex_domain((FIXTURES / "nvidia-imex-ctl-N-j-down.json").read_text())
    expect = Expectation(gpu_model="NVIDIA GB200", gpu_count=4, imex_domain=True)
    (finding,) = judge_imex({"imex": {"domain": down}}, expect)
    assert finding.kind == "domain-down" and finding.severity == FAIL
    assert "not ready: 10.0.0.11 WAITING_FOR_PEERS, 10.0.0.12 UNAVAILABLE" in finding.message
    unconfigured = imex_domain((FIXTURES / "nvidia-imex-ctl-N-j-not-configured.txt").read_text())
    assert unconfigured["status"] == "NOT_CONFIGURED"
    assert judge_imex({"imex": {"domain": unconfigured}}, expect)[0].kind == "domain-unknown"
    assert imex_domain("<html>")["status"] == "UNAVAILABLE"
    assert judge_imex({"imex": {"domain": down}}, expect._replace(imex_domain=False)) == []
