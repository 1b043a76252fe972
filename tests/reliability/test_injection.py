"""Hostile values in every string field of a rig file: rejected with a message, or carried as plain data.

Each payload tries to run `touch CANARY` through a shell (`$(...)`, backticks, `;`, `&&`, quotes, a newline)
or to escape a folder (`../`). Phase one feeds each field x payload to the loader alone: a refusal must name
the field. Phase two takes every value the loader accepted onto real test hosts through validate, plan,
apply and smoke: no canary may appear (on the control machine or inside any host's namespace), sourcing the
written profile script must not run it either, and no file may land outside the managed folders.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from mgpu_provision.errors import SpecError
from mgpu_provision.rig import load_rig
from mgpu_provision.rig.models import RigFile
from tests.support.factories import pair_rig_file as rig_file
from tests.support.factories import rtx3090_twin as twin
from tests.support.hosts import HostFactory, TestHost
from tests.support.nodes import node_files, run_in_process
from tests.support.trial import Trial

MARK = f"mgpu-canary-{uuid.uuid4().hex[:8]}"


def payloads(canary: Path) -> dict[str, str]:
    """Name -> a value that would touch the canary if any shell ever evaluated it."""
    return {
        "command substitution": f"$(touch {canary})",
        "backticks": f"`touch {canary}`",
        "semicolon": f"x; touch {canary}",
        "and-list": f"x && touch {canary}",
        "single quote": f"x' ; touch {canary} ; '",
        "double quote": f'x" ; touch {canary} ; "',
        "newline": f"x\ntouch {canary}",
        "dot-dot": f"../../../../../tmp/{MARK}",
    }


# Every string field of the rig file, as a path into a document built by `base_document`: str = mapping
# key, int = list index, "{key}" = the mapping's key itself rather than its value.
FIELDS: dict[str, tuple[Any, ...]] = {
    "hosts[].name": ("hosts", 2, "name"),
    "hosts[].address": ("hosts", 2, "address"),
    "hosts[].user": ("hosts", 2, "user"),
    "hosts[].identity_file": ("hosts", 2, "identity_file"),
    "hosts[].jump": ("hosts", 2, "jump"),
    "hosts[].python": ("hosts", 2, "python"),
    "hosts[].rig": ("hosts", 2, "rig"),
    "hosts[].groups[]": ("hosts", 2, "groups", 0),
    "hosts[].simulate": ("hosts", 2, "simulate"),
    "defaults.user": ("defaults", "user"),
    "defaults.identity_file": ("defaults", "identity_file"),
    "defaults.jump": ("defaults", "jump"),
    "defaults.python": ("defaults", "python"),
    "groups{}": ("groups", "{key}"),
    "groups{}[]": ("groups", "all", 0),
    "rigs{}": ("rigs", "{key}"),
    "rigs{}.gpus.model": ("rigs", "pair", "gpus", "model"),
    "rigs{}.bridge.topology_file": ("rigs", "pair", "bridge", "topology_file"),
    "rigs{}.driver.version": ("rigs", "pair", "driver", "version"),
    "rigs{}.driver.branch": ("rigs", "pair", "driver", "branch"),
    "rigs{}.driver.runfile_url": ("rigs", "pair", "driver", "runfile_url"),
    "rigs{}.driver.runfile_sha256": ("rigs", "pair", "driver", "runfile_sha256"),
    "rigs{}.driver.packages[]": ("rigs", "pair", "driver", "packages", 0),
    "rigs{}.sli.mode": ("rigs", "pair", "sli", "mode"),
    "rigs{}.visible_devices[]": ("rigs", "pair", "visible_devices", 0),
    "rigs{}.ddp.master": ("rigs", "pair", "ddp", "master"),
    "rigs{}.ddp.rdzv_id": ("rigs", "pair", "ddp", "rdzv_id"),
    "rigs{}.ddp.ifname": ("rigs", "pair", "ddp", "ifname"),
    "rigs{}.env{}": ("rigs", "pair", "env", "{key}"),
    "rigs{}.env{}.value": ("rigs", "pair", "env", "MGPU_RIG"),
    "env{}": ("env", "{key}"),
    "env{}.value": ("env", "MGPU_ROUND"),
    "path_prepend{}": ("path_prepend", "{key}"),
    "path_prepend{}[]": ("path_prepend", "LD_LIBRARY_PATH", 0),
    "rigs{}.path_prepend{}": ("rigs", "pair", "path_prepend", "{key}"),
    "rigs{}.path_prepend{}[]": ("rigs", "pair", "path_prepend", "PATH", 0),
    "inventory": ("inventory",),
    "rig_groups{}": ("rig_groups", "{key}"),
    "rig_groups{}.value": ("rig_groups", "gpu"),
    "files.profile_d": ("files", "profile_d"),
    "files.environment_file": ("files", "environment_file"),
    "files.launcher": ("files", "launcher"),
    "files.xorg_conf": ("files", "xorg_conf"),
    "files.state_dir": ("files", "state_dir"),
    "files.systemd_dir": ("files", "systemd_dir"),
    "smoke.python": ("smoke", "python"),
    "reclaim.patterns[]": ("reclaim", "patterns", 0),
    "rigs{}.driver.repo.url": ("rigs", "pair", "driver", "repo", "url"),
    "rigs{}.driver.repo.key": ("rigs", "pair", "driver", "repo", "key"),
    "rigs{}.driver.repo.suite": ("rigs", "pair", "driver", "repo", "suite"),
    "rigs{}.driver.repo.components": ("rigs", "pair", "driver", "repo", "components"),
    "rigs{}.driver.imex.nodes_config": ("rigs", "pair", "driver", "imex", "nodes_config"),
    "rigs{}.driver.imex.peers[]": ("rigs", "pair", "driver", "imex", "peers", 0),
    "node_check.agent": ("node_check", "agent"),
    "node_check.command": ("node_check", "command"),
    "node_check.expectations": ("node_check", "expectations"),
    "node_check.interval": ("node_check", "interval"),
    "node_check.textfile_dir": ("node_check", "textfile_dir"),
    "rigs{}.slurm.gres_conf": ("rigs", "pair", "slurm", "gres_conf"),
    "rigs{}.slurm.gres_type": ("rigs", "pair", "slurm", "gres_type"),
    "rigs{}.slurm.health_check": ("rigs", "pair", "slurm", "health_check"),
    "rigs{}.slurm.health_script": ("rigs", "pair", "slurm", "health_script"),
    "rigs{}.slurm.restart_command[]": ("rigs", "pair", "slurm", "restart_command", 0),
    "rigs{}.slurm.srun.partition": ("rigs", "pair", "slurm", "srun", "partition"),
    "rigs{}.slurm.srun.account": ("rigs", "pair", "slurm", "srun", "account"),
    "rigs{}.slurm.srun.reservation": ("rigs", "pair", "slurm", "srun", "reservation"),
    "rigs{}.containers.toolkit": ("rigs", "pair", "containers", "toolkit"),
    "rigs{}.containers.cdi.output": ("rigs", "pair", "containers", "cdi", "output"),
    "rigs{}.containers.cdi.driver_root": ("rigs", "pair", "containers", "cdi", "driver_root"),
    "rigs{}.containers.cdi.hook_path": ("rigs", "pair", "containers", "cdi", "hook_path"),
}
# A slurm section a trial adds restarts slurmd when gres.conf changes: never the machine's own (a test host
# shares its /run), so the trials' sections restart with `true` unless the command itself is the field tried.
SLURM = ("rigs", "pair", "slurm")


def string_fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field of the rig-file models that can hold a string, named as in FIELDS."""
    for name, info in model.model_fields.items():
        yield from _strings_in(info.annotation, f"{prefix}{name}")


def _strings_in(annotation: Any, path: str) -> Iterator[str]:
    if annotation is str:
        yield path
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from string_fields(annotation, path + ".")
    else:
        origin = getattr(annotation, "__origin__", None)
        args = get_args(annotation)
        if origin is list:
            yield from _strings_in(args[0], path + "[]")
        elif origin is dict:
            if any(_strings_in(args[0], path)):
                yield path + "{}"
            values = path + "{}"
            yield from (p + ".value" if p == values else p for p in _strings_in(args[1], values))
        else:
            for arg in args:
                yield from _strings_in(arg, path)


def test_every_string_field_of_the_rig_file_is_tried(trial: Trial) -> None:
    trial.area, trial.tried = "injection", "coverage: every string field of the rig-file models is in FIELDS"
    trial.expect = "no field of rig/models.py left out"
    found = set(string_fields(RigFile))
    trial.figures["string fields"] = len(found)
    assert found - set(FIELDS) == set(), "add these rig-file string fields to FIELDS"


def base_document(factory: HostFactory, hosts: list[TestHost], tmp: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(rig_file(factory, tmp / "base.yaml", hosts).read_text())
    b = hosts[1]
    document["hosts"].append(
        {"name": "gpu-x", "address": b.address, "port": b.port, "rig": "pair", "groups": ["extra"]}
    )
    document["groups"] = {"all": [h.name for h in hosts]}
    document["rigs"]["pair"]["env"] = {"MGPU_RIG": "1"}
    document["files"] = {}
    document["reclaim"] = {"policy": "orphans+patterns", "patterns": ["train"]}
    return document


def put(document: dict[str, Any], path: tuple[Any, ...], value: str) -> dict[str, Any]:
    document = copy.deepcopy(document)
    if path[: len(SLURM)] == SLURM:
        document["rigs"]["pair"].setdefault("slurm", {}).setdefault("restart_command", ["true"])
    node: Any = document
    for step, after in itertools.pairwise(path):
        if isinstance(step, str) and step not in node:
            node[step] = [] if isinstance(after, int) else {}
        node = node[step]
    last = path[-1]
    if last == "{key}":
        node[value] = next(iter(node.values()), "1") if node else "1"
    elif isinstance(last, int):
        while len(node) <= last:
            node.append(None)
        node[last] = value
    else:
        node[last] = value
    return document


def field_value(field: str, payload: str) -> str:
    """A path field's hostile value keeps the field's usual folder in front, as a user would write it."""
    folders = {
        "files.profile_d": "/etc/profile.d/",
        "files.environment_file": "/etc/mgpu-provision/",
        "files.launcher": "/usr/local/bin/",
        "files.xorg_conf": "/etc/X11/xorg.conf.d/",
        "files.state_dir": "/var/lib/mgpu-provision/",
        "files.systemd_dir": "/etc/systemd/system/",
        "rigs{}.driver.runfile_url": "/srv/",
        "rigs{}.driver.repo.url": "http://127.0.0.1/",
        "node_check.agent": "/usr/local/lib/mgpu-provision/",
        "node_check.command": "/usr/local/bin/",
        "node_check.expectations": "/etc/mgpu-provision/",
        "node_check.textfile_dir": "/var/lib/mgpu-provision/",
        "rigs{}.slurm.gres_conf": "/etc/slurm/",
        "rigs{}.slurm.health_check": "/usr/local/bin/",
        "rigs{}.slurm.health_script": "/usr/local/bin/",
        "path_prepend{}[]": "/opt/",
        "rigs{}.path_prepend{}[]": "/opt/",
    }
    return folders.get(field, "") + payload


def canaries_absent(canary: Path, hosts: list[TestHost]) -> None:
    assert not canary.exists(), f"a payload ran on the control machine: {canary} exists"
    for host in hosts:
        found = host.run_in_ns(f"test -e {canary} && echo ran || true").stdout.strip()
        assert found != "ran", f"a payload ran inside {host.name}"
        # Where a climbing path would land: /tmp and the parents of the managed folders (a whole-disk
        # search per command would cost minutes).
        roots = "/tmp /etc /usr/local /var/lib /root"
        escaped = host.run_in_ns(
            f"find {roots} -maxdepth 3 -name '{MARK}*' 2>/dev/null || true"
        ).stdout.split()
        assert not escaped, f"a file escaped the managed folders on {host.name}: {escaped}"


def test_hostile_values_are_refused_or_written_literally(
    test_hosts: HostFactory, tmp_path: Path, trial: Trial
) -> None:
    trial.area = "injection"
    trial.tried = f"{len(FIELDS)} string fields x 8 payloads ($(), ``, ;, &&, quotes, newline, ../)"
    trial.expect = "refused naming the field, or carried literally; no canary runs; no file outside managed"
    a = test_hosts.start("gpu-a", twin(persistence=(True, True)), rig="pair")
    b = test_hosts.start("gpu-b", twin(persistence=(True, True)), rig="pair")
    hosts = [a, b]
    canary = tmp_path / f"{MARK}-ran"
    base = base_document(test_hosts, hosts, tmp_path)
    rig = tmp_path / "rig.yaml"
    accepted: dict[str, list[tuple[str, str]]] = {}  # payload name -> accepted (field, value)
    for field, path in FIELDS.items():
        for name, payload in payloads(canary).items():
            value = field_value(field, payload)
            rig.write_text(yaml.safe_dump(put(base, path, value), sort_keys=False))
            try:
                load_rig(rig)
            except SpecError as exc:
                trial.count("refused by the loader")
                assert exc.problems and all(p.message for p in exc.problems)
            else:
                trial.count("accepted as data")
                accepted.setdefault(name, []).append((field, value))
    canaries_absent(canary, hosts)
    trial.figures["accepted fields"] = sorted({f for pairs in accepted.values() for f, _ in pairs})
    common = ["--known-hosts", str(test_hosts.known_hosts)]
    for name, pairs in accepted.items():
        document = base
        for field, value in pairs:
            # A hostile default would cut off every host; on gpu-x alone it reaches the same code.
            where = ("hosts", 2, field.split(".")[1]) if field.startswith("defaults.") else FIELDS[field]
            document = put(document, where, value)
        rig.write_text(yaml.safe_dump(document, sort_keys=False))
        for command in (["validate"], ["plan", *common], ["apply", *common, "--yes"], ["smoke", *common]):
            run = run_in_process(command[0], str(rig), *command[1:], "--json")
            trial.count("commands run")
            trial.count(f"{command[0]} exit {run.code}")
            assert "Traceback" not in run.out + run.err, f"{name} {command[0]}: {run.err[-2000:]}"
            assert run.code in (0, 1, 2), run.err
            if command[0] == "apply":  # the values reached the real hosts and were carried out there
                for host in hosts:  # reached (a hostile gpus.model is a failed check: status failed)
                    assert run.host(host.name)["status"] in ("ok", "changed", "failed"), run.host(host.name)
                    assert "step" not in (run.host(host.name)["error"] or ""), run.host(host.name)
            if command[0] == "smoke":
                trial.figures.setdefault("smoke said", str(run.json())[:200])
            canaries_absent(canary, hosts)
        for host in hosts:
            scripts = [p for p in node_files(host) if p.endswith(".sh") and "profile.d" in p]
            for script in scripts:  # a login shell reading the values must not run them either
                host.run_in_ns(f"sh -c '. {script}' >/dev/null 2>&1 || true")
        canaries_absent(canary, hosts)
        literal = dict(pairs).get("env{}.value")
        if literal is not None:  # the shell reads back exactly the value the rig file holds
            shown = a.run_in_ns('. /etc/profile.d/mgpu-provision.sh; printf %s "$MGPU_ROUND"').stdout
            assert shown == literal
            trial.count("env values read back literally")
        trial.count("payload rounds on 2 hosts")
    assert not any(MARK in str(p) for p in Path("/tmp").iterdir() if p != canary.parent)
