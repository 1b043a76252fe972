"""Plain records (issue 41): the facts reply read without pydantic, and a valid rig file kept as plain values.

The reader must take what pydantic took and refuse what it refused, in its words; a rig record must answer
every field and method its model does, and come back from the rig cache's pickle unchanged.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import yaml

from mgpu_provision.facts import Facts, GpuHealth, GpuProcess
from mgpu_provision.records import RecordError
from mgpu_provision.rig.loader import load_rig
from mgpu_provision.rig.models import RigFile
from mgpu_provision.rig.plain import Plain, PlainHost, PlainRig
from tests.support import factories

ROOT = Path(__file__).resolve().parents[2]


def test_a_reply_outside_the_contract_names_every_field_in_pydantics_words() -> None:
    reply = factories.facts().model_dump(mode="json")
    reply["gpus"] = [{"index": "0", "name": "x", "uuid": "GPU-1", "pci_bus_id": "0:1:0.0"}]
    reply["driver"]["nvml"] = "maybe"
    with pytest.raises(RecordError) as raised:
        Facts.model_validate(reply)
    assert [(".".join(map(str, e["loc"])), e["msg"]) for e in raised.value.errors()] == [
        ("driver.nvml", "Input should be 'ok', 'no-driver', 'driver-not-loaded', 'version-mismatch', "
         "'no-permission' or 'error'"),
        ("gpus.0.index", "Input should be a valid integer"),
        ("gpus.0.memory_mib", "Field required"),
    ]  # fmt: skip


def test_unknown_keys_are_ignored_and_an_int_is_a_float_where_the_contract_says_so() -> None:
    process = GpuProcess.model_validate({"pid": 7, "gpu": 0, "start_time": 5, "newer_agent_field": [1]})
    assert process.start_time == 5.0 and isinstance(process.start_time, float)
    assert json.loads(process.model_dump_json())["start_time"] == 5.0
    assert "newer_agent_field" not in process.model_dump()
    health = GpuHealth.model_validate({"index": 0, "power_limit_range_w": [100, 350]})
    assert health.power_limit_range_w == (100, 350)
    assert health.model_dump(mode="json")["power_limit_range_w"] == [100, 350]


def test_records_are_frozen_values() -> None:
    facts = factories.facts()
    with pytest.raises(TypeError, match="frozen"):
        facts.agent_version = "9"  # type: ignore[misc]
    assert Facts.model_validate(facts.model_dump()) == facts
    changed = facts.model_copy(update={"agent_version": "9"})
    assert changed.agent_version == "9" and changed != facts and "agent_version" in changed.model_fields_set


def test_a_loaded_rig_is_plain_records_with_the_models_values_and_methods() -> None:
    loaded = load_rig(ROOT / "examples" / "mixed-fleet.yaml")
    spec = loaded.spec
    assert isinstance(spec, Plain) and isinstance(spec.hosts[0], PlainHost)
    assert all(isinstance(rig, PlainRig) for rig in spec.rigs.values())
    validated = RigFile.model_validate(spec.model_dump())  # the same values pydantic accepts
    assert validated.model_dump() == spec.model_dump()
    written = yaml.safe_load((ROOT / "examples" / "mixed-fleet.yaml").read_text())["hosts"]
    for host, model, keys in zip(spec.hosts, validated.hosts, written, strict=True):
        assert host.target == model.target
        assert host.model_fields_set == set(keys)  # what the file gave, as pydantic records it
    for name, rig in spec.rigs.items():
        model_rig = validated.rigs[name]
        assert (rig.visible_count, rig.nproc_per_node) == (model_rig.visible_count, model_rig.nproc_per_node)
        assert rig.health.checks("xid") == model_rig.health.checks("xid")
    assert pickle.loads(pickle.dumps(loaded)).spec == spec
