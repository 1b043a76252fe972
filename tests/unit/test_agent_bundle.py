"""The agent zipapp: deterministic bytes, the right files, and the protocol as the node's python3 runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu_provision import protocol
from mgpu_provision.facts import Facts
from mgpu_provision.fleet.bundle import build_agent
from mgpu_provision.node.__main__ import unpack_beside
from tests.support.agent import NODE_PYTHON, ROOT, TWINS, run_agent


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    bundle = build_agent()
    path = tmp_path_factory.mktemp("cache") / bundle.name
    path.write_bytes(bundle.data)
    yield path


def test_bundle_is_deterministic_and_named_by_its_hash() -> None:
    first, second = build_agent(), build_agent()
    assert first.data == second.data
    assert first.name == f"agent-{first.digest[:16]}.pyz"
    import hashlib

    assert first.digest == hashlib.sha256(first.data).hexdigest()


def test_bundle_holds_the_node_modules_and_pynvml_only(pyz: Path) -> None:
    names = zipfile.ZipFile(pyz).namelist()
    assert names == sorted(names)
    for required in (
        "__main__.py",
        "pynvml.py",
        "mgpu_provision/__init__.py",
        "mgpu_provision/protocol.py",
        "mgpu_provision/node/__main__.py",
        "mgpu_provision/node/nvidia/miniyaml.py",
        "mgpu_provision/catalog/topology.py",
        "mgpu_provision/node/verbs/smoke_program.py",
    ):
        assert required in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    extra = {
        n
        for n in names
        if n.startswith("mgpu_provision/")
        and not n.startswith(("mgpu_provision/node/", "mgpu_provision/judge/", "mgpu_provision/catalog/"))
    }
    assert extra == {f"mgpu_provision/{name}" for name in ("__init__.py", "protocol.py", "typing_lite.py")}
    assert "mgpu_provision/judge/verdict.py" in names
    assert "mgpu_provision/catalog/names.py" in names
    assert {i.date_time for i in zipfile.ZipFile(pyz).infolist()} == {(1980, 1, 1, 0, 0, 0)}


@pytest.mark.parametrize("name", ["rtx3090-nvlink.yaml", "h100-hgx.yaml", "rtx4090-pcie.yaml"])
def test_node_python_answers_facts_for_each_twin(pyz: Path, name: str) -> None:
    reply = run_agent(pyz, "facts", {"args": {}, "simulate": str(TWINS / name)})
    assert reply["ok"] and reply["agent_version"]
    facts = Facts.model_validate(reply["result"])
    assert facts.host.simulated and facts.driver.nvml == "ok" and facts.gpus


def test_simulation_from_the_environment_and_request_wins(pyz: Path) -> None:
    env = {"MGPU_PROVISION_SIMULATE": str(TWINS / "rtx4090-pcie.yaml")}
    from_env = run_agent(pyz, "facts", {"args": {}}, env)
    assert len(from_env["result"]["gpus"]) == 5
    from_request = run_agent(pyz, "facts", {"args": {}, "simulate": str(TWINS / "rtx3090-nvlink.yaml")}, env)
    assert len(from_request["result"]["gpus"]) == 2


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this machine has an NVIDIA driver")
def test_real_nvml_through_the_bundled_pynvml_reports_no_driver(pyz: Path) -> None:
    reply = run_agent(
        pyz, "facts", {"args": {"python": NODE_PYTHON}, "simulate": None}, {"MGPU_PROVISION_SIMULATE": ""}
    )
    facts = Facts.model_validate(reply["result"])
    assert not facts.host.simulated
    assert facts.driver.nvml == "no-driver" and facts.driver.message is not None
    assert facts.torch is not None and facts.torch.python == NODE_PYTHON


def test_apply_over_the_protocol(pyz: Path, tmp_path: Path) -> None:
    target = tmp_path / "etc" / "mgpu.env"
    request = {
        "args": {
            "lock": str(tmp_path / "lock"),
            "lock_wait_s": 1,
            "steps": [{"kind": "file", "path": str(target), "content": "A=1\n", "mode": "0600"}],
        }
    }
    reply = run_agent(pyz, "apply", request)
    assert reply["result"]["results"][0]["changed"] is True
    assert target.read_text() == "A=1\n" and target.stat().st_mode & 0o777 == 0o600
    assert run_agent(pyz, "apply", request)["result"]["results"][0]["changed"] is False


@pytest.mark.parametrize(
    "verb, request_text, kind, message",
    [
        (
            "teleport",
            "{}",
            "bad-request",
            "unknown verb 'teleport'; verbs are facts, apply, reboot, reclaim, smoke",
        ),
        ("facts", "{not json", "bad-request", "the request on stdin is not JSON"),
        ("facts", '{"args": [1]}', "bad-request", "the request must be"),
        ("facts", '{"args": {}, "simulate": "/nonexistent/twin.yaml"}', "twin", "cannot read twin file"),
    ],
)
def test_errors_are_envelopes_not_tracebacks(
    pyz: Path, verb: str, request_text: str, kind: str, message: str
) -> None:
    reply = run_agent(pyz, verb, request_text)
    assert reply["ok"] is False
    assert reply["error"]["kind"] == kind and message in reply["error"]["message"]


def test_facts_imports_only_what_it_needs() -> None:
    script = (
        "import json, sys;"
        "from mgpu_provision.node.__main__ import handle;"
        f"reply, _ = handle('facts', json.dumps({{'simulate': {str(TWINS / 'rtx3090-nvlink.yaml')!r}}}));"
        "assert reply['ok'], reply;"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('mgpu_provision'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = set(json.loads(done.stdout))
    assert "mgpu_provision.node.verbs.facts" in loaded
    assert not loaded & {
        "mgpu_provision.node.verbs.apply",
        "mgpu_provision.node.nvidia.nvml_real",
        "mgpu_provision.node.verbs.smoke",
        "mgpu_provision.fleet.bundle",
    }


@pytest.mark.parametrize("form", ["zipapp", "unpacked"])
def test_apply_then_facts_reads_the_changed_node_in_a_new_agent(pyz: Path, tmp_path: Path, form: str) -> None:
    """apply's `then_facts`: the reply carries the facts of the node after its steps, read by a new agent
    process (the zipapp or the folder it unpacks to, whichever ran), so a plan needs no call of its own."""
    twin = tmp_path / "twin.yaml"
    shutil.copy(TWINS / "h100-hgx.yaml", twin)
    agent = pyz if form == "zipapp" else Path(unpack_beside(str(shutil.copy(pyz, tmp_path / pyz.name))) or "")
    state = tmp_path / "lock"
    facts_args = protocol.facts_request(state_dir=str(state))
    apply_args = protocol.apply_request(
        str(state / "apply.lock"),
        1,
        [{"kind": "persistence", "gpus": [0, 2], "enabled": True}],
        True,
        facts_args,
        30,
    )
    reply = run_agent(agent, "apply", {"args": apply_args, "simulate": str(twin)})
    assert reply["ok"] and reply["result"]["results"][0]["changed"], reply
    after = reply["result"]["facts"]
    assert after["ok"] is True, after
    gpus = Facts.model_validate(after["result"]).gpus
    assert [g.persistence_mode for g in gpus][:3] == [True, False, True]
    # The same as a facts call of its own reads.
    alone = run_agent(agent, "facts", {"args": facts_args, "simulate": str(twin)})
    assert [g["persistence_mode"] for g in alone["result"]["gpus"]] == [
        g["persistence_mode"] for g in after["result"]["gpus"]
    ]


def test_facts_after_apply_that_overrun_their_time_are_an_error_envelope_the_steps_stand(
    pyz: Path, tmp_path: Path
) -> None:
    target = tmp_path / "etc" / "mgpu.env"
    steps = [{"kind": "file", "path": str(target), "content": "A=1\n", "mode": "0600"}]
    args = protocol.apply_request(str(tmp_path / "lock"), 1, steps, False, protocol.facts_request(), 0.001)
    reply = run_agent(pyz, "apply", {"args": args})
    assert reply["ok"] and reply["result"]["results"][0]["changed"] and target.read_text() == "A=1\n"
    assert reply["result"]["facts"] == {
        "ok": False,
        "agent_version": reply["agent_version"],
        "error": {"kind": "internal", "message": "facts after apply took longer than 0.001 s"},
    }


def test_then_facts_with_facts_arguments_of_the_wrong_kind_is_a_bad_request(
    pyz: Path, tmp_path: Path
) -> None:
    args = protocol.apply_request(str(tmp_path / "lock"), 1, [], False, {"files": "not a list"}, 30)
    reply = run_agent(pyz, "apply", {"args": args})
    assert reply["error"] == {
        "kind": "bad-request",
        "message": "apply: `then_facts`: facts: `files` must be a list of strings, got 'not a list'",
    }
    args["then_facts"] = {"args": {}}  # no timeout
    reply = run_agent(pyz, "apply", {"args": args})
    assert reply["error"]["kind"] == "bad-request" and "then_facts" in reply["error"]["message"], reply
