"""apply orchestration against fake boxes: the real rig loader, plan, fleet pool and session `call`, with
the injected session fake (tests/support/factories.py) answering as an in-memory agent that keeps files, a
driver (installed vs loaded) and a boot id, and counts every verb. What is checked: convergence, the reboot
rule, idempotence, playbooks, batches and the recap."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mgpu_provision import cli
from mgpu_provision.commands import options as command_options
from mgpu_provision.errors import AgentError, ConnectionFailed
from mgpu_provision.facts import Facts
from mgpu_provision.fleet import pool
from mgpu_provision.fleet import session as fleet
from mgpu_provision.fleet.here import Here, control_machine
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.targets import HostTarget, targets_for
from mgpu_provision.jobs import apply, steps
from mgpu_provision.jobs.apply import (
    ApplySettings,
    HostRecap,
    finish,
    fleet_plan,
    rollout,
    unconfirmed,
)
from mgpu_provision.jobs.drain import DrainSettings
from mgpu_provision.jobs.playbooks import STEPS
from mgpu_provision.jobs.rollout import Serial
from mgpu_provision.plan.change import Change
from mgpu_provision.rig import LoadedRig, load_rig, nodesets
from tests.support import factories

RIG = """\
version: 1
hosts:
  - {name: gpu-a, address: 10.0.0.11, rig: pair}
  - {name: gpu-b, address: 10.0.0.12, rig: pair}
  - {name: gpu-c, address: 10.0.0.13, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2, persistence_mode: true}
    driver: {version: "550.54.15", reboot: allowed}
    ddp: {master: gpu-a, backend: gloo}
"""
ALL = tuple(s for s in STEPS)
_boot_ids = itertools.count(1)


@dataclass
class Box:
    """An in-memory node: what the agent verbs read and change."""

    installed: str | None = "550.54.15"
    loaded: str | None = "550.54.15"
    persistence: bool = True
    gpus: int = 2
    files: dict[str, tuple[str, str]] = field(default_factory=dict)
    boot_id: str = field(default_factory=lambda: f"boot-{next(_boot_ids)}")
    machine_id: str | None = None
    reboot_changes_boot_id: bool = True
    fail_kind: str | None = None  # an apply step of this kind fails
    locked_by: int | None = None
    unreachable: bool = False
    down_after_reboot: int = 0  # facts calls that find the box down after a reboot
    calls: list[str] = field(default_factory=list)
    timeouts: dict[str, float | None] = field(default_factory=dict)  # the last timeout given per verb
    writes: int = 0
    steps_seen: list[list[str]] = field(default_factory=list)
    # apply's `then_facts`: answered as the agent does, ignored (an older agent), or failed (facts that
    # overran their time)
    facts_after: str = "answers"

    def facts(self, args: dict[str, Any]) -> dict[str, Any]:
        mismatch = self.installed != self.loaded
        files = []
        for path in args["files"]:
            if path in self.files:
                content, mode = self.files[path]
                sha = hashlib.sha256(content.encode()).hexdigest()
                files.append({"path": path, "exists": True, "content": content, "mode": mode, "sha256": sha})
            else:
                files.append({"path": path, "exists": False})
        gpus = [
            {
                "index": i,
                "name": "NVIDIA GeForce RTX 3090",
                "uuid": f"GPU-0000000{i}-aaaa",
                "pci_bus_id": f"00000000:{i + 1:02X}:00.0",
                "memory_mib": 24576,
                "persistence_mode": self.persistence,
            }
            for i in range(self.gpus)
        ]
        host = {"hostname": "box", "os": "Ubuntu 24.04", "os_id": "ubuntu", "os_version_id": "24.04"}
        host.update(kernel="6", arch="x86_64", boot_id=self.boot_id)
        host["machine_id"] = self.machine_id
        return {
            "agent_version": "test",
            "host": {**host, "python": "3.10", "user": "root"},
            "driver": {
                "nvml": "version-mismatch" if mismatch else "ok",
                "version": None if mismatch else self.installed,
                "installed": self.installed,
                "loaded": self.loaded,
                "reboot_required": mismatch,
            },
            "gpus": [] if mismatch else gpus,
            "files": files,
        }

    def apply(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.locked_by is not None:
            raise AgentError(f"another apply holds {args['lock']} (pid {self.locked_by}); waited 60s")
        self.steps_seen.append([s["kind"] for s in args["steps"]])
        results: list[dict[str, Any]] = []
        for index, step in enumerate(args["steps"]):
            entry = {"index": index, "kind": step["kind"], "changed": False, "message": "", "error": None}
            if any(r["error"] for r in results):
                entry["message"] = "skipped"
            elif step["kind"] == self.fail_kind:
                entry["error"] = f"{step['kind']} broke"
            elif step["kind"] == "file":
                if self.files.get(step["path"]) != (step["content"], step["mode"]):
                    self.files[step["path"]] = (step["content"], step["mode"])
                    self.writes += 1
                    entry.update(changed=True, message=f"wrote {step['path']}")
            elif step["kind"] == "driver":
                self.installed = step["version"]
                entry.update(changed=True, message=f"installed {step['version']}")
            elif step["kind"] == "persistence":
                self.persistence = step["enabled"]
                entry.update(changed=True, message="persistence on")
            results.append(entry)
        then = args.get("then_facts")
        if then is None or self.facts_after == "ignores":
            return {"results": results}
        if self.facts_after == "fails":
            error = {"kind": "internal", "message": "facts after apply took longer than 60 s"}
            return {"results": results, "facts": {"ok": False, "error": error}}
        return {"results": results, "facts": {"ok": True, "result": self.facts(then["args"])}}

    def answer(self, verb: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One agent call, as the box's session carries it."""
        if self.unreachable:  # the connection died with the reboot; only a new session gets through
            self.down_after_reboot -= 1
            self.unreachable = self.down_after_reboot > 0
            raise ConnectionFailed(f"lost the connection to {self.boot_id}")
        self.calls.append(verb)
        self.timeouts[verb] = timeout
        result: dict[str, Any] = getattr(self, verb)(args)
        return result

    def reboot(self, _args: dict[str, Any]) -> dict[str, Any]:
        self.unreachable = self.down_after_reboot > 0
        old = self.boot_id
        self.loaded = self.installed
        if self.reboot_changes_boot_id:
            self.boot_id = f"boot-{next(_boot_ids)}"
        return {"boot_id": old}


class Boxes(dict[str, Box]):
    """The fleet's boxes by host name, and the FleetOptions whose sessions reach them."""

    def __init__(self) -> None:
        super().__init__()
        self.options = factories.fake_fleet(self.node)

    def node(self, target: HostTarget) -> factories.Answer:
        box = self[target.name]
        if box.unreachable:
            raise ConnectionFailed(f"cannot connect to {target.name}: timed out")
        return box.answer


@pytest.fixture
def boxes() -> Boxes:
    return Boxes()


@pytest.fixture
def cli_boxes(boxes: Boxes, monkeypatch: pytest.MonkeyPatch) -> Boxes:
    """The boxes behind the command line, which builds its own FleetOptions: there alone the opener is
    patched in (the jobs' tests pass `boxes.options`)."""
    opener = boxes.options.sessions
    assert opener is not None
    monkeypatch.setattr(fleet, "open_session", opener)
    monkeypatch.setattr(pool, "_default_agent", factories.FakeAgent)
    return boxes


def load(tmp_path: Path, text: str = RIG) -> LoadedRig:
    (tmp_path / "rig.yaml").write_text(text)
    return load_rig(tmp_path / "rig.yaml")


def run(
    boxes: Boxes,
    loaded: LoadedRig,
    steps: tuple[str, ...] = ALL,
    serial: Serial | None = None,
    max_fail: float | None = None,
    progress: apply.Progress = lambda _: None,
    **settings: Any,
) -> apply.ApplyResult:
    targets = targets_for(loaded, loaded.spec.hosts)
    plan = fleet_plan(loaded, targets, steps, boxes.options)
    config = ApplySettings(steps, poll_interval_s=0.0, **settings)
    return rollout(
        loaded, targets, plan, config, boxes.options, serial=serial, max_fail_percent=max_fail,
        progress=progress,
    )  # fmt: skip


def drifted() -> Box:
    return Box(installed="535.161.08", loaded="535.161.08", persistence=False)


def by_host(result: apply.ApplyResult) -> dict[str, HostRecap]:
    return {r.host: r for r in result.recaps}


def test_a_box_with_no_reboot_to_wait_for_has_its_facts_read_in_the_apply_call(
    tmp_path: Path, boxes: Boxes
) -> None:
    """The facts after the steps come back in the `apply` call itself (`then_facts`, read by a new agent
    process): one call fewer a host than facts of their own, one login fewer under --via clush."""
    boxes.update({"gpu-a": Box(), "gpu-b": Box(), "gpu-c": Box(persistence=False)})
    result = run(boxes, load(tmp_path))
    assert result.exit_code == 0, result
    assert by_host(result)["gpu-c"].status == "changed"
    assert boxes["gpu-c"].calls == ["facts", "facts", "apply"]  # the plan's, the rollout's, apply's


@pytest.mark.parametrize("facts_after", ["ignores", "fails"])
def test_an_apply_reply_without_readable_facts_gets_a_facts_call_of_its_own(
    tmp_path: Path, boxes: Boxes, facts_after: str
) -> None:
    boxes.update({"gpu-a": Box(), "gpu-b": Box(), "gpu-c": Box(persistence=False, facts_after=facts_after)})
    result = run(boxes, load(tmp_path))
    assert result.exit_code == 0, result
    assert by_host(result)["gpu-c"].status == "changed"
    assert boxes["gpu-c"].calls == ["facts", "facts", "apply", "facts"]


def test_drifted_boxes_converge_with_one_apply_call_and_one_reboot(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box(persistence=False)})
    result = run(boxes, load(tmp_path))
    recaps = by_host(result)
    assert result.exit_code == 0, result
    assert [recaps[h].status for h in ("gpu-a", "gpu-b", "gpu-c")] == ["changed"] * 3
    assert recaps["gpu-a"].rebooted and not recaps["gpu-b"].rebooted
    assert boxes["gpu-a"].calls == ["facts", "facts", "apply", "reboot", "facts", "facts"]
    # One apply call holds the lock for every step; persistence goes before the driver it needs.
    assert boxes["gpu-a"].steps_seen == [["file", "file", "file", "persistence", "driver"]]
    assert (boxes["gpu-a"].installed, boxes["gpu-a"].loaded) == ("550.54.15", "550.54.15")
    assert "persistence: persistence on" in recaps["gpu-c"].done
    # A driver install (a DKMS build) gets its own bound; a persistence change only the ordinary one, and
    # the facts its call brings back a facts call's (gpu-a's reboot comes between its steps and its facts).
    driver_timeout, plain_timeout = boxes["gpu-a"].timeouts["apply"], boxes["gpu-c"].timeouts["apply"]
    facts_timeout = boxes["gpu-c"].timeouts["facts"]
    assert driver_timeout is not None and plain_timeout is not None and facts_timeout is not None
    assert driver_timeout - apply.DRIVER_INSTALL_BOUND_S == plain_timeout - facts_timeout


def test_a_second_apply_changes_and_writes_nothing(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    run(boxes, load(tmp_path))
    writes = {name: box.writes for name, box in boxes.items()}
    for box in boxes.values():
        box.calls.clear()
    result = run(boxes, load(tmp_path))
    assert [r.status for r in result.recaps] == ["ok", "ok", "ok"]
    assert {name: box.writes for name, box in boxes.items()} == writes
    assert all(box.calls == ["facts"] for box in boxes.values())  # the plan alone: nothing to do


def test_reboot_never_ends_as_reboot_required(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    result = run(boxes, load(tmp_path, RIG.replace("reboot: allowed", "reboot: never")))
    recap = by_host(result)["gpu-a"]
    assert (recap.status, recap.reboot_required, recap.rebooted) == ("changed", True, False)
    assert "reboot" not in boxes["gpu-a"].calls
    assert result.exit_code == 2
    # NVML refuses to answer until the reboot, so the GPU check waits too; it does not fail the host.
    assert [(c.resource, c.action) for c in recap.remaining] == [
        ("gpus", "verify-failed"),
        ("reboot", "manual"),
    ]


def test_skipping_the_reboot_step_leaves_the_reboot_required(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    recap = by_host(run(boxes, load(tmp_path), steps=tuple(s for s in ALL if s != "reboot")))["gpu-a"]
    assert recap.reboot_required and "reboot" not in boxes["gpu-a"].calls
    assert recap.status == "changed"


def test_the_wait_for_a_reboot_reconnects(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    boxes["gpu-a"].down_after_reboot = 3
    progress: list[str] = []
    recap = by_host(run(boxes, load(tmp_path), progress=progress.append))["gpu-a"]
    assert (recap.status, recap.rebooted) == ("changed", True), recap
    assert "gpu-a: rebooting, waiting up to 900s for it to come back" in progress
    assert progress[-1].startswith("gpu-a: back after")
    assert sum(line.startswith("gpu-a: still rebooting") for line in progress) >= 1


def test_a_box_that_never_comes_back_fails_after_the_timeout(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    boxes["gpu-a"].reboot_changes_boot_id = False
    recap = by_host(run(boxes, load(tmp_path), reboot_timeout_s=0.05))["gpu-a"]
    assert recap.status == "failed"
    assert recap.error == "gpu-a did not come back with a new boot id within 0.05s"


def test_serial_with_zero_failures_allowed_stops_later_batches(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": Box(persistence=False), "gpu-b": Box(persistence=False), "gpu-c": Box()})
    boxes["gpu-a"].fail_kind = "persistence"
    result = run(boxes, load(tmp_path), serial=Serial(1, False), max_fail=0)
    recaps = by_host(result)
    assert recaps["gpu-a"].status == "failed"
    assert recaps["gpu-a"].error == "step 4 (persistence) failed: persistence broke"
    assert [recaps[h].status for h in ("gpu-b", "gpu-c")] == ["skipped", "skipped"]
    assert recaps["gpu-b"].error == "not touched: 1 of 1 host(s) of batch 1 failed (--max-fail-percent 0)"
    assert boxes["gpu-b"].calls == ["facts"] and boxes["gpu-b"].writes == 0
    assert result.exit_code == 2


def test_without_max_fail_percent_every_batch_runs(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": Box(), "gpu-b": Box(), "gpu-c": Box()})
    boxes["gpu-a"].fail_kind = "file"
    statuses = [r.status for r in run(boxes, load(tmp_path), serial=Serial(1, False)).recaps]
    assert statuses == ["failed", "changed", "changed"]


def test_unreachable_host_counts_as_failed_in_its_batch(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": Box(unreachable=True), "gpu-b": Box(), "gpu-c": Box()})
    recaps = by_host(run(boxes, load(tmp_path), serial=Serial(2, False), max_fail=49))
    assert recaps["gpu-a"].status == "unreachable"
    assert recaps["gpu-a"].error == "cannot connect to gpu-a: timed out"
    assert (recaps["gpu-b"].status, recaps["gpu-c"].status) == ("changed", "skipped")


def test_a_locked_host_fails_with_the_agents_message(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": Box(locked_by=4242), "gpu-b": Box(), "gpu-c": Box()})
    recap = by_host(run(boxes, load(tmp_path)))["gpu-a"]
    assert recap.status == "failed"
    assert recap.error is not None and "(pid 4242)" in recap.error


def test_audit_changes_nothing_and_reports_checks(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": Box(gpus=1), "gpu-b": Box(), "gpu-c": drifted()})
    recaps = by_host(run(boxes, load(tmp_path), steps=("checks",)))
    assert all("apply" not in box.calls for box in boxes.values())
    assert recaps["gpu-a"].status == "failed"
    assert recaps["gpu-a"].remaining[0].summary == "1 GPUs found, the rig expects 2"
    assert (recaps["gpu-b"].status, recaps["gpu-c"].status) == ("ok", "ok")


def test_env_playbook_writes_only_env_files(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    recaps = by_host(run(boxes, load(tmp_path), steps=("env",)))
    assert boxes["gpu-a"].steps_seen == [["file", "file", "file"]]
    assert boxes["gpu-a"].installed == "535.161.08"
    assert (recaps["gpu-a"].status, recaps["gpu-a"].reboot_required) == ("changed", False)


def test_a_box_that_changed_since_the_confirmed_plan_is_not_touched(tmp_path: Path, boxes: Boxes) -> None:
    loaded = load(tmp_path)
    boxes["gpu-a"] = Box(persistence=False)
    session = factories.FakeSession(targets_for(loaded, [loaded.host("gpu-a")])[0], boxes["gpu-a"].answer)
    converge = apply.converge_steps(
        session.target, loaded, loaded.host("gpu-a"), ApplySettings(ALL), [], lambda _: None
    )
    recap = steps.on_session(session, converge)
    assert recap.status == "failed"
    assert recap.error is not None and recap.error.startswith("the box changed since the plan was confirmed")
    assert "apply" not in boxes["gpu-a"].calls


def change(resource: str, action: str = "update", desired: str | None = "x") -> Change:
    return Change(resource, action, f"{resource} {action}", None, desired)  # type: ignore[arg-type]


def test_finish_judges_what_is_left() -> None:
    assert finish("h", [], []).status == "ok"
    assert finish("h", [], ["file: wrote"]).status == "changed"
    reboot_only = finish("h", [change("reboot", "manual")], ["driver: installed"])
    assert (reboot_only.status, reboot_only.reboot_required) == ("changed", True)
    left = finish("h", [change("gpus", "verify-failed")], [])
    assert (left.status, left.error) == ("failed", "1 check failed: gpus")
    both = finish("h", [change("topology", "verify-failed"), change("driver"), change("file:/a")], [])
    assert both.error == "1 check failed: topology; 2 changes left: driver, file:/a"
    assert finish("h", [], [], error="boom", unreachable=True).status == "unreachable"


def test_unconfirmed_compares_resource_action_and_desired_state() -> None:
    seen = [change("file:/a"), change("driver", desired="550")]
    assert unconfirmed([change("file:/a"), change("driver", desired="550")], seen) == []
    assert unconfirmed([change("driver", desired="555")], seen) == [change("driver", desired="555")]


def facts(boot_id: str = "b1", simulated: bool = False, machine_id: str | None = None) -> Facts:
    box = Box(boot_id=boot_id, machine_id=machine_id).facts({"files": []})
    box["host"]["simulated"] = simulated
    return Facts.model_validate(box)


def target(connection: str = "ssh", address: str = "10.0.0.11") -> HostTarget:
    return HostTarget("gpu-a", address, 22, None, None, None, True, "python3", connection, None, 5.0, 60.0)  # type: ignore[arg-type]


def test_the_machine_running_the_tool_is_known_by_its_own_word() -> None:
    here = Here(machine_id="m-here", boot_id="b-here")
    local, elsewhere = (lambda _t: True), (lambda _t: False)
    assert control_machine(target("local"), facts(), here, elsewhere) == (
        "it is this machine (connection: local)"
    )
    assert control_machine(target(), facts("b-here", machine_id="m-here"), here, elsewhere) == (
        "it reports the machine id and boot id of the machine running mgpu-provision"
    )
    # A box on loopback in its own namespaces or chroot shares the kernel and the address, not the machine id.
    box = facts("b-here", machine_id="m-box")
    assert control_machine(target(address="127.0.0.9"), box, here, local) is None
    # Without a machine id on the node, the boot id and then the address decide.
    assert control_machine(target(), facts("b-here"), here, elsewhere) == (
        "it reports the boot id of the machine running mgpu-provision"
    )
    assert control_machine(target(address="127.0.0.1"), facts(), here, local) == (
        "its address 127.0.0.1 is this machine"
    )
    assert control_machine(target(), facts(), here, elsewhere) is None
    # A simulated host's driver and reboot change only its twin's overlay.
    twin = facts("b-here", simulated=True, machine_id="m-here")
    assert control_machine(target("local"), twin, here, local) is None


def test_the_control_machine_gets_no_driver_install_and_no_reboot_unless_allowed(
    tmp_path: Path, boxes: Boxes, monkeypatch: pytest.MonkeyPatch
) -> None:
    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    monkeypatch.setattr(Here, "read", classmethod(lambda cls: cls(None, boxes["gpu-a"].boot_id)))
    recap = by_host(run(boxes, load(tmp_path)))["gpu-a"]
    assert recap.notes == [
        "not done (driver, reboot): it reports the boot id of the machine running mgpu-provision; "
        "--allow-control-machine allows it"
    ]
    assert all("driver" not in steps for steps in boxes["gpu-a"].steps_seen)
    assert boxes["gpu-a"].installed == "535.161.08" and "reboot" not in boxes["gpu-a"].calls
    assert recap.status == "failed" and [c.resource for c in recap.remaining] == ["driver", "reboot"]

    boxes["gpu-a"] = drifted()
    monkeypatch.setattr(Here, "read", classmethod(lambda cls: cls(None, boxes["gpu-a"].boot_id)))
    recap = by_host(run(boxes, load(tmp_path), allow_control_machine=True))["gpu-a"]
    assert recap.notes == [] and recap.rebooted and boxes["gpu-a"].installed == "550.54.15"


def test_plan_marks_each_host_simulated_or_real_and_the_control_machine(
    tmp_path: Path, boxes: Boxes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_provision.commands.plan_view import plan_json, render_plan

    boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    monkeypatch.setattr(Here, "read", classmethod(lambda cls: cls(None, boxes["gpu-a"].boot_id)))
    loaded = load(tmp_path)
    plan = fleet_plan(loaded, targets_for(loaded, loaded.spec.hosts), ALL, boxes.options)
    hosts = plan_json(plan)["hosts"]
    assert [hosts[h]["simulated"] for h in ("gpu-a", "gpu-b", "gpu-c")] == [False] * 3
    assert hosts["gpu-a"]["control_machine"] == "it reports the boot id of the machine running mgpu-provision"
    assert hosts["gpu-b"]["control_machine"] is None
    console = Console(width=200, record=True)
    render_plan(plan, console)
    text = console.export_text()
    assert "real: gpu-a, gpu-b, gpu-c" in text
    assert (
        "! gpu-a is the machine running mgpu-provision (it reports the boot id of the machine running "
        "mgpu-provision): apply will not carry out driver, reboot there without --allow-control-machine"
    ) in text


def test_cli_refuses_without_a_terminal_or_yes(
    tmp_path: Path, cli_boxes: Boxes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    load(tmp_path)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert cli.main(["apply", str(tmp_path / "rig.yaml")]) == 1
    err = capsys.readouterr().err
    assert (
        "error: apply would change 3 host(s) and needs confirmation: pass --yes, or run it in a terminal"
        in err
    )
    assert all("apply" not in box.calls for box in cli_boxes.values())


def test_cli_json_recap(
    tmp_path: Path, cli_boxes: Boxes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box(unreachable=True)})
    load(tmp_path, RIG.replace("reboot: allowed", "reboot: never"))
    code = cli.main(["apply", str(tmp_path / "rig.yaml"), "--yes", "--json", "--limit", "gpu-a,gpu-c"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2
    assert out["recap"] == {
        "ok": 0,
        "changed": 1,
        "failed": 0,
        "unreachable": 1,
        "skipped": 0,
        "reboot_required": 1,
    }
    assert (
        out["hosts"]["gpu-a"]["remaining"][-1]["summary"]
        == "reboot required to load driver 550.54.15 (policy: never)"
    )
    assert sorted(out["hosts"]) == ["gpu-a", "gpu-c"] and out["converged"] is False
    # Per host: real or simulated (null: never read) and whether it is the machine running the tool.
    assert [out["hosts"][h]["simulated"] for h in ("gpu-a", "gpu-c")] == [False, None]
    assert out["hosts"]["gpu-a"]["control_machine"] is None


def test_declining_the_prompt_changes_nothing(
    tmp_path: Path, cli_boxes: Boxes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_boxes.update({"gpu-a": drifted(), "gpu-b": Box(), "gpu-c": Box()})
    load(tmp_path)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr(Console, "input", lambda self, prompt: "y")
    assert cli.main(["apply", str(tmp_path / "rig.yaml")]) == 1
    assert "error: apply cancelled: nothing was changed" in capsys.readouterr().err
    assert all("apply" not in box.calls for box in cli_boxes.values())


@pytest.mark.parametrize("option", ["--lock-wait", "--reboot-timeout"])
@pytest.mark.parametrize("value", ["-1", "soon", "7200"])
def test_wait_options_are_checked(option: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["apply", "rig.yaml", option, value])
    assert f"argument {option}: give a number of seconds from 0 to 3600" in capsys.readouterr().err


def test_a_malformed_apply_or_reboot_reply_fails_the_host_with_a_plain_error(
    tmp_path: Path, boxes: Boxes
) -> None:
    """Checked on arrival like facts (fleet/replies.py): before, a `changed` of the wrong type passed and a
    missing `boot_id` was a KeyError traceback from deep inside the reboot wait."""
    boxes.update({"gpu-a": Box(persistence=False), "gpu-b": drifted(), "gpu-c": Box()})
    boxes["gpu-a"].apply = lambda args: {"results": [{"index": 0, "kind": "persistence", "changed": "yes"}]}
    boxes["gpu-b"].reboot = lambda args: {"boot": "b-1"}
    recaps = by_host(run(boxes, load(tmp_path)))
    assert recaps["gpu-a"].status == "failed" and recaps["gpu-a"].error == (
        "agent apply on gpu-a (10.0.0.11:22) answered a reply this version cannot read: "
        "results.0.changed: Input should be a valid boolean; results.0.message: Field required"
    )
    assert recaps["gpu-b"].status == "failed" and recaps["gpu-b"].error == (
        "agent reboot on gpu-b (10.0.0.12:22) answered a reply this version cannot read: "
        "boot_id: Field required"
    )
    assert recaps["gpu-c"].status == "changed"  # the other hosts go on


def test_the_recap_names_a_stop_once_and_never_wraps_in_a_log(
    tmp_path: Path, cli_boxes: Boxes, capsys: pytest.CaptureFixture[str]
) -> None:
    boxes = cli_boxes
    boxes.update({"gpu-a": Box(persistence=False), "gpu-b": Box(persistence=False), "gpu-c": Box()})
    boxes["gpu-a"].fail_kind = "persistence"
    load(tmp_path)
    argv = ["apply", str(tmp_path / "rig.yaml"), "--yes", "--serial", "1", "--max-fail-percent", "0"]
    assert cli.main(argv) == 2
    out = capsys.readouterr().out  # not a terminal, as a log or a pipe
    lines = out.splitlines()
    stop = "stopped after batch 1 (1 of 1 host(s) failed, --max-fail-percent 0); not touched: gpu-b, gpu-c"
    assert stop in lines
    rows = [line for line in lines if "│" in line]  # the table's rows
    assert len(rows) == 1 and rows[0].rstrip().endswith("step 4 (persistence) failed: persistence broke"), out


def test_a_failed_check_reads_as_a_check_not_as_a_change(tmp_path: Path, boxes: Boxes) -> None:
    boxes.update({"gpu-a": Box(gpus=1), "gpu-b": Box(), "gpu-c": Box()})
    recap = by_host(run(boxes, load(tmp_path)))["gpu-a"]
    assert recap.status == "failed" and recap.error == "1 check failed: gpus"


def test_a_rollout_that_reboots_goes_one_host_at_a_time_by_default(
    tmp_path: Path, cli_boxes: Boxes, capsys: pytest.CaptureFixture[str]
) -> None:
    boxes = cli_boxes
    boxes.update({"gpu-a": drifted(), "gpu-b": drifted(), "gpu-c": Box()})
    load(tmp_path)
    assert cli.main(["apply", str(tmp_path / "rig.yaml"), "--yes"]) == 0
    err = capsys.readouterr().err
    assert "note: a reboot is planned, so one host at a time (--serial 1; --serial N chooses)" in err
    assert "batch 1: applying on gpu-a" in err and "batch 2: applying on gpu-b" in err
    # Without a reboot, all at once as before.
    boxes.update({"gpu-a": Box(persistence=False), "gpu-b": Box(persistence=False)})
    assert cli.main(["apply", str(tmp_path / "rig.yaml"), "--yes"]) == 0
    assert "batch 1: applying on gpu-a, gpu-b" in capsys.readouterr().err


@pytest.mark.parametrize("via", ["fabric", "clush"])
def test_an_interrupted_apply_says_what_finished_what_was_under_way_and_what_was_not_started(
    tmp_path: Path, via: str
) -> None:
    """Issue 40 item 8: Ctrl-C said only `interrupted`; say it as --max-fail-percent does (and the same
    under --via clush, where the batch is under way in lockstep)."""
    boxes = Boxes() if via == "fabric" else Lockstep()
    boxes.update(
        {"gpu-a": Box(persistence=False), "gpu-b": Box(persistence=False), "gpu-c": Box(persistence=False)}
    )

    def ctrl_c(_args: dict[str, Any]) -> dict[str, Any]:
        raise KeyboardInterrupt

    boxes["gpu-b"].apply = ctrl_c  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt) as stopped:
        run(boxes, load(tmp_path), serial=Serial(1, False))
    assert str(stopped.value) == (
        "changed: gpu-a; under way (stopped where they were; the next apply finishes them): gpu-b; "
        "not started: gpu-c"
    )
    assert boxes["gpu-c"].writes == 0


def test_a_long_error_is_cut_in_its_recap_cell_and_printed_whole_below(
    tmp_path: Path, cli_boxes: Boxes, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40 item 10: a recap cell never carries a 400-character error; the error goes below the table."""
    boxes = cli_boxes
    boxes.update({"gpu-a": Box(persistence=False), "gpu-b": Box(), "gpu-c": Box()})
    boxes["gpu-a"].fail_kind = "persistence"
    long = "nvidia-persistenced: " + "the daemon said something long " * 12
    original = boxes["gpu-a"].apply

    def failing(args: dict[str, Any]) -> dict[str, Any]:
        reply = original(args)
        for entry in reply["results"]:
            if entry["error"]:
                entry["error"] = long
        return reply

    boxes["gpu-a"].apply = failing  # type: ignore[method-assign]
    load(tmp_path)
    assert cli.main(["apply", str(tmp_path / "rig.yaml"), "--yes"]) == 2
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if "│" in line]
    assert all(len(row.rstrip()) < 130 for row in rows), rows
    assert f"gpu-a: step 4 (persistence) failed: {long}".rstrip() in [line.rstrip() for line in lines]


# ------------------------------------------------------------------------------------------- --via clush


class Lockstep(Boxes):
    """The boxes under `--via clush`: an injected session keeps the batch seam on the pool, so each agent
    call is a session of its own, as each is an OpenSSH connection under ClusterShell. A rebooting box
    refuses that many connections (the Fabric path's old session dies with the reboot instead)."""

    def __init__(self) -> None:
        super().__init__()
        self.options = factories.fake_fleet(self.node, via="clush")
        self.rounds: list[tuple[str, list[str], list[str], list[float | None]]] = []

    def node(self, target: HostTarget) -> factories.Answer:
        box = self[target.name]
        if box.unreachable and box.down_after_reboot > 0:
            box.down_after_reboot -= 1
            box.unreachable = box.down_after_reboot > 0
            raise ConnectionFailed(f"cannot connect to {target.name}: timed out")
        return super().node(target)

    def spy(self, monkeypatch: pytest.MonkeyPatch) -> Lockstep:
        """Record every call of the batch seam apply makes: (verb, hosts, each request, each timeout)."""
        real = steps.call_many

        def spy(
            chosen: list[HostTarget],
            verb: str,
            requests: dict[str, dict[str, Any]],
            options: FleetOptions,
            timeout: Any = None,
        ) -> dict[str, pool.HostOutcome[dict[str, Any]]]:
            names = [t.name for t in chosen]
            wire = [json.dumps(requests[n], sort_keys=True) for n in names]
            self.rounds.append((verb, names, wire, [timeout[n] for n in names]))
            return real(chosen, verb, requests, options, timeout)

        monkeypatch.setattr(steps, "call_many", spy)
        return self


def fates(result: apply.ApplyResult) -> list[tuple[Any, ...]]:
    """Each recap but its time."""
    return [
        (r.host, r.status, r.done, r.remaining, r.reboot_required, r.rebooted,
         r.error, r.notes)
        for r in result.recaps
    ]  # fmt: skip


def lose_the_connection(_args: dict[str, Any]) -> dict[str, Any]:
    raise ConnectionFailed("the connection to gpu-c was lost during agent apply")


def four_boxes(boxes: Boxes) -> Boxes:
    """gpu-a converges, gpu-b's persistence step fails, gpu-c goes away during its apply call, gpu-d has
    nothing to do (its files already written by a first apply, as gpu-a's and gpu-b's)."""
    boxes.update({n: Box() for n in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")})
    return boxes


RIG4 = RIG.replace(
    "  - {name: gpu-c, address: 10.0.0.13, rig: pair}\n",
    "  - {name: gpu-c, address: 10.0.0.13, rig: pair}\n  - {name: gpu-d, address: 10.0.0.14, rig: pair}\n",
)


def test_apply_via_clush_is_one_call_many_a_phase_and_ends_as_the_fabric_apply(
    tmp_path: Path, boxes: Boxes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41 item 1, apply: the batch's hosts in lockstep through the seam, one call_many per phase,
    hosts whose steps are the same sending the same request (one ClusterShell worker: fleet/clush.py
    groups byte-identical requests); a host that fails or goes away mid-way ends with the Fabric path's
    recap, word for word, while the others go on."""
    lockstep = Lockstep().spy(monkeypatch)
    results = []
    for each in (boxes, lockstep):
        loaded = load(tmp_path, RIG4)
        four_boxes(each)
        run(each, loaded)  # every box's files in place: what is left is the same persistence step
        lockstep.rounds.clear()
        for name in ("gpu-a", "gpu-b", "gpu-c"):
            each[name].persistence = False
        each["gpu-b"].fail_kind = "persistence"
        each["gpu-c"].apply = lose_the_connection  # type: ignore[method-assign]
        results.append(run(each, loaded))
    fabric, clush = results
    assert fates(clush) == fates(fabric)
    assert [r.status for r in clush.recaps] == ["changed", "failed", "unreachable", "ok"]
    recaps = by_host(clush)
    assert recaps["gpu-b"].error == "step 1 (persistence) failed: persistence broke"
    assert recaps["gpu-c"].error == "the connection to gpu-c was lost during agent apply"
    assert [(verb, names) for verb, names, _, _ in lockstep.rounds] == [  # gpu-d: the plan's facts only
        ("facts", ["gpu-a", "gpu-b", "gpu-c"]),
        ("apply", ["gpu-a", "gpu-b", "gpu-c"]),  # with the facts after (a failed step's host's too)
    ]
    _, _, wire, timeouts = lockstep.rounds[1]
    assert len(set(wire)) == 1, wire  # the same steps: one request for all three
    # Each host's own: its command_timeout_s and the lock wait, and its command_timeout_s for the facts.
    assert timeouts == [300.0 + 60.0 + 300.0] * 3


def test_hosts_with_other_steps_send_other_requests_and_each_its_own_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lockstep = Lockstep().spy(monkeypatch)
    lockstep.update({"gpu-a": drifted(), "gpu-b": Box(persistence=False), "gpu-c": Box(persistence=False)})
    result = run(lockstep, load(tmp_path, RIG.replace("reboot: allowed", "reboot: never")))
    assert [r.status for r in result.recaps] == ["changed"] * 3
    verb, names, wire, timeouts = lockstep.rounds[1]
    assert (verb, names) == ("apply", ["gpu-a", "gpu-b", "gpu-c"])
    assert len(set(wire)) == 3  # each host's env files name it: three requests, three workers
    assert timeouts[0] == timeouts[1] + apply.DRIVER_INSTALL_BOUND_S  # the driver install's own bound


def test_a_reboot_over_the_batch_seam_waits_for_the_new_boot_id_while_the_others_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lockstep = Lockstep().spy(monkeypatch)
    lockstep.update({"gpu-a": drifted(), "gpu-b": Box(persistence=False), "gpu-c": Box()})
    lockstep["gpu-a"].down_after_reboot = 2
    progress: list[str] = []
    result = run(lockstep, load(tmp_path), progress=progress.append)
    recaps = by_host(result)
    assert (recaps["gpu-a"].status, recaps["gpu-a"].rebooted) == ("changed", True), recaps["gpu-a"]
    assert (lockstep["gpu-a"].installed, lockstep["gpu-a"].loaded) == ("550.54.15", "550.54.15")
    assert recaps["gpu-b"].status == "changed" and result.exit_code == 0
    assert [(verb, names) for verb, names, _, _ in lockstep.rounds] == [
        ("facts", ["gpu-a", "gpu-b", "gpu-c"]),
        ("apply", ["gpu-a", "gpu-b", "gpu-c"]),
        ("reboot", ["gpu-a"]),  # the others are done: their facts came with apply's reply
        ("facts", ["gpu-a"]),  # down: refused
        ("facts", ["gpu-a"]),  # down: refused
        ("facts", ["gpu-a"]),  # back, with a new boot id
        ("facts", ["gpu-a"]),  # the plan after the reboot: nothing left
    ]
    assert "gpu-a: rebooting, waiting up to 900s for it to come back" in progress
    assert sum(line.startswith("gpu-a: still rebooting") for line in progress) == 2
    assert progress[-1].startswith("gpu-a: back after")


def test_serial_batches_over_the_batch_seam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lockstep = Lockstep().spy(monkeypatch)
    lockstep.update({n: Box(persistence=False) for n in ("gpu-a", "gpu-b", "gpu-c")})
    lockstep["gpu-a"].fail_kind = "file"
    result = run(lockstep, load(tmp_path), serial=Serial(2, False), max_fail=0)
    assert [r.status for r in result.recaps] == ["failed", "changed", "skipped"]
    assert [names for _, names, _, _ in lockstep.rounds] == [["gpu-a", "gpu-b"]] * 2  # facts, apply
    assert lockstep["gpu-c"].calls == ["facts"]  # the plan alone


def test_apply_takes_via_clush_and_a_topology(
    tmp_path: Path, boxes: Boxes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodesets, "clustershell", lambda: True)
    monkeypatch.setattr(nodesets, "too_old", lambda: None)
    parsed = command_options.fleet_options
    # The command line's own options, with the boxes' sessions (which keep the batch seam on the pool).
    injected = {"sessions": boxes.options.sessions, "agent": boxes.options.agent}
    monkeypatch.setattr(
        command_options, "fleet_options", lambda args: dataclasses.replace(parsed(args), **injected)
    )
    taken: list[FleetOptions] = []
    real = steps.per_host

    def per_host(targets: list[HostTarget], options: FleetOptions, start: Any) -> Any:
        taken.append(options)
        return real(targets, options, start)

    monkeypatch.setattr(apply, "per_host", per_host)
    boxes.update({"gpu-a": Box(persistence=False), "gpu-b": Box(), "gpu-c": Box()})
    load(tmp_path)
    topology = tmp_path / "topology.conf"
    topology.write_text("[routes]\nhead: gw1\ngw1: gpu-a,gpu-b,gpu-c\n")
    rig = str(tmp_path / "rig.yaml")
    assert cli.main(["apply", rig, "--yes", "--via", "clush", "--topology", str(topology)]) == 0
    assert [(o.via, o.topology) for o in taken] == [("clush", topology)]


def slurm_node(name: str, busy_shows: int) -> Any:
    """A node's `slurm-node` verb: drained by this rollout, DRAINED after `busy_shows` looks, resumed."""
    state = {"shows": 0, "line": {"State": "MIXED", "Reason": ""}}

    def answer(args: dict[str, Any]) -> dict[str, Any]:
        if args["action"] == "drain":
            state["line"] = {"State": "MIXED+DRAIN", "Reason": args["reason"]}
        elif args["action"] == "show":
            state["shows"] += 1
            if state["shows"] >= busy_shows:
                state["line"] = {"State": "IDLE+DRAIN", "Reason": args["reason"]}
        else:
            state["line"] = {"State": "IDLE", "Reason": ""}
        return {"node": name, "line": dict(state["line"]), "changed": args["action"] != "show"}

    return answer


def test_drain_slurm_over_the_batch_seam_is_the_fabric_drain(
    tmp_path: Path, boxes: Boxes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--drain slurm's calls are agent calls (`slurm-node`) too: drain, the wait for DRAINED, the change
    and the resume go through the seam in lockstep, with the Fabric path's recaps and notes."""
    lockstep = Lockstep().spy(monkeypatch)
    results = []
    for each in (boxes, lockstep):
        each.update({n: Box(persistence=False) for n in ("gpu-a", "gpu-b", "gpu-c")})
        for number, name in enumerate(("gpu-a", "gpu-b", "gpu-c"), start=1):
            setattr(each[name], "slurm-node", slurm_node(name, busy_shows=number))
        loaded = load(tmp_path)
        targets = targets_for(loaded, loaded.spec.hosts)
        plan = fleet_plan(loaded, targets, ALL, each.options)
        settings = ApplySettings(ALL, poll_interval_s=0.0)
        drain = DrainSettings(timeout_s=30, poll_s=0.0)
        results.append(rollout(loaded, targets, plan, settings, each.options, drain=drain))
    fabric, clush = results
    assert fates(clush) == fates(fabric)
    assert [r.status for r in clush.recaps] == ["changed"] * 3
    assert by_host(clush)["gpu-c"].notes[-1].startswith("resumed in Slurm (gpu-c) after")
    verbs = [(verb, names) for verb, names, _, _ in lockstep.rounds]
    assert verbs == [
        ("slurm-node", ["gpu-a", "gpu-b", "gpu-c"]),  # drain
        ("slurm-node", ["gpu-a", "gpu-b", "gpu-c"]),  # show: gpu-a DRAINED
        ("slurm-node", ["gpu-b", "gpu-c"]),  # show: gpu-b DRAINED
        ("slurm-node", ["gpu-c"]),  # show: gpu-c DRAINED
        ("facts", ["gpu-a", "gpu-b", "gpu-c"]),
        ("apply", ["gpu-a", "gpu-b", "gpu-c"]),  # and the facts after
        ("slurm-node", ["gpu-a", "gpu-b", "gpu-c"]),  # resume
        ("facts", ["gpu-a", "gpu-b", "gpu-c"]),
    ]
