"""What a run imports (issue 20): start-up is most of a small fleet's wait, so each command loads only what
its run uses. Not timing tests: each runs a real command in a fresh interpreter and checks which modules it
loaded, so a top-level import that comes back fails here whatever the machine's speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from mgpu_provision.commands.demo import write_demo
from mgpu_provision.fleet import bundle
from mgpu_provision.fleet.bundle import build_agent
from mgpu_provision.fleet.session import agent_command
from mgpu_provision.node.__main__ import unpack_beside
from mgpu_provision.node.host.torch_probe import _TORCH_PROBE
from tests.support.factories import FAKE_TORCH

ROOT = Path(__file__).resolve().parents[2]
TWIN = ROOT / "examples" / "twins" / "rtx3090-nvlink.yaml"
# Runs the real CLI, then writes the names of every module the run loaded (stdout belongs to the command).
_CLI_THEN_MODULES = (
    "import json, sys\n"
    "from mgpu_provision.cli import main\n"
    "code = main(sys.argv[2:])\n"
    "with open(sys.argv[1], 'w') as out:\n"
    "    json.dump({'code': code, 'modules': sorted(sys.modules)}, out)\n"
)
SSH = {"fabric", "paramiko", "invoke"}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One control-side cache for the module's runs: the agent zipapp is compressed once, not per run."""
    return tmp_path_factory.mktemp("xdg-cache")


def cli_modules(tmp_path: Path, cache: Path, *argv: str) -> tuple[int, set[str]]:
    """(exit code, top-level packages loaded) of `mgpu-provision ARGV` in a fresh interpreter, HOME in tmp."""
    code, modules = cli_all_modules(tmp_path, cache, *argv)
    return code, {name.split(".")[0] for name in modules}


def cli_all_modules(tmp_path: Path, cache: Path, *argv: str) -> tuple[int, set[str]]:
    """(exit code, every module loaded) of `mgpu-provision ARGV` in a fresh interpreter, HOME in tmp."""
    report = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", _CLI_THEN_MODULES, str(report), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(cache)},  # agent uploads: HOME
        cwd=tmp_path,
    )
    assert report.exists(), done.stderr
    found = json.loads(report.read_text())
    return found["code"], set(found["modules"])


def cached_plan(tmp_path: Path, cache: Path, rig: Path, code: str) -> str:
    """The stderr of `python -c CODE plan RIG --json` run a second time: it answers from the rig cache, as
    every run but the first does."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(cache)}
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code, "plan", str(rig), "--json"],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )  # fmt: skip
    return done.stderr


@pytest.fixture
def local_rig(tmp_path: Path) -> Path:
    """The demo's rig: one simulated box over a local connection, with a fake torch python for smoke."""
    fake = tmp_path / "torch-python"
    fake.write_text(FAKE_TORCH)
    fake.chmod(0o755)
    return write_demo(tmp_path / "demo", str(fake))


@pytest.mark.parametrize(("command", "code"), [("plan", 2), ("facts", 0), ("reclaim", 0)])
def test_json_runs_on_a_local_rig_load_no_console_and_no_ssh(
    tmp_path: Path, bundles: Path, local_rig: Path, command: str, code: int
) -> None:
    exit_code, loaded = cli_modules(tmp_path, bundles, command, str(local_rig), "--json")
    # plan's 2 is the box's drift: the run really read the facts and rendered the managed files.
    assert exit_code == code
    assert not loaded & {"rich", *SSH, "ansible"}


def test_importing_the_plan_command_loads_no_models_console_templates_or_ssh(tmp_path: Path) -> None:
    """Issue 41: importing `commands.plan` (what every plan pays before it reads a host) loads none of the
    heavy packages: the rig and the facts are plain records, rich draws only on a terminal, jinja2 loads
    at the first file rendered, Fabric at the first SSH host, the pictures' modules for --svg/--report."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import mgpu_provision.commands.plan"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,  # not the checkout, whose package `-c` would put ahead of PYTHONPATH
    )
    loaded = set(re.findall(r"^import time:.*\| +(\S+)$", done.stderr, re.MULTILINE))
    assert "mgpu_provision.commands.plan" in loaded
    heavy = {"pydantic", "pydantic_core", "rich", "jinja2", "yaml", *SSH}
    assert not {name.split(".")[0] for name in loaded} & heavy
    pictures = {"mgpu_provision.commands.fleet_report", "mgpu_provision.commands.box_picture"}
    assert not loaded & (pictures | {"mgpu_provision.rig.models", "mgpu_provision.rig.loader"})


def test_plan_of_a_cached_rig_file_loads_no_pydantic(tmp_path: Path, bundles: Path, local_rig: Path) -> None:
    """Issue 41: pydantic validates the rig file once; a later plan unpickles the rig as plain records and
    reads the facts reply with the records' reader, so the whole run never imports it."""
    first, before = cli_modules(tmp_path, bundles, "plan", str(local_rig), "--json")
    second, after = cli_modules(tmp_path, bundles, "plan", str(local_rig), "--json")
    assert first == second == 2
    assert "pydantic" in before  # the first run validated the file
    assert not after & {"pydantic", "pydantic_core", "yaml", "rich", *SSH}


def test_plan_for_people_on_a_local_rig_loads_rich_but_no_ssh(
    tmp_path: Path, bundles: Path, local_rig: Path
) -> None:
    code, loaded = cli_modules(tmp_path, bundles, "plan", str(local_rig))
    assert code == 2
    assert "rich" in loaded
    assert not loaded & {*SSH, "ansible"}


def test_validate_loads_no_console_templates_or_ssh(tmp_path: Path, bundles: Path) -> None:
    code, loaded = cli_modules(tmp_path, bundles, "validate", str(ROOT / "examples" / "mixed-fleet.yaml"))
    assert code == 0
    assert not loaded & {"rich", "jinja2", *SSH, "ansible"}


def test_validate_of_an_unchanged_rig_file_answers_from_the_cache_without_pydantic(
    tmp_path: Path, bundles: Path
) -> None:
    """Issue 32: the rig cache knows a valid file's counts, so validate needs neither the parser nor the
    models the second time."""
    rig = ROOT / "examples" / "mixed-fleet.yaml"
    first, before = cli_modules(tmp_path, bundles, "validate", str(rig))
    second, after = cli_modules(tmp_path, bundles, "validate", str(rig))
    assert first == second == 0
    assert {"pydantic", "yaml"} <= before
    assert not after & {"pydantic", "pydantic_core", "yaml", "jinja2", "rich", *SSH}


def test_plan_of_an_unchanged_rig_file_loads_no_rig_parser(
    tmp_path: Path, bundles: Path, local_rig: Path
) -> None:
    """Issue 32: the second plan of the same rig file takes the loaded rig from the cache: no YAML parser,
    no loader, no rules."""
    first, before = cli_all_modules(tmp_path, bundles, "plan", str(local_rig), "--json")
    second, after = cli_all_modules(tmp_path, bundles, "plan", str(local_rig), "--json")
    assert first == second == 2
    parsing = {"yaml", "mgpu_provision.rig.loader", "mgpu_provision.rig.rules", "mgpu_provision.rig.source"}
    assert parsing <= before
    assert not after & parsing


# Runs the real CLI with jinja2's template parser counting its calls; prints the count to argv[1].
_CLI_COUNTING_TEMPLATE_PARSES = (
    "import sys, jinja2\n"
    "parses = []\n"
    "parse = jinja2.Environment._parse\n"
    "jinja2.Environment._parse = lambda self, *a: parses.append(a[1]) or parse(self, *a)\n"
    "from mgpu_provision.cli import main\n"
    "code = main(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(f'{code} {len(parses)}')\n"
)


def plans_reported(tmp_path: Path, cache: Path, script: str, rig: Path) -> list[str]:
    """Two `plan RIG --json` runs, each a fresh interpreter running `script` (the CLI with something
    watching it), HOME in tmp; what each wrote to the report file its first argument names."""
    report = tmp_path / "report.txt"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(cache)}
    runs = []
    for _ in range(2):
        argv = [sys.executable, "-c", script, str(report), "plan", str(rig), "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert report.exists(), done.stderr
        runs.append(report.read_text())
        report.unlink()
    return runs


def test_templates_are_compiled_once_not_on_every_run(tmp_path: Path, bundles: Path, local_rig: Path) -> None:
    """Issue 32: jinja2's bytecode cache keeps the compiled templates: a later run parses none."""
    runs = plans_reported(tmp_path, tmp_path / "xdg", _CLI_COUNTING_TEMPLATE_PARSES, local_rig)
    assert runs[0] != "2 0" and runs[0].startswith("2 ")  # the first run parsed every template it rendered
    assert runs[1] == "2 0"


def test_a_plan_of_an_unchanged_box_renders_its_files_from_the_cache_without_jinja2(
    tmp_path: Path, bundles: Path, local_rig: Path
) -> None:
    """Issue 41: the managed files a plan renders are kept with their values and the templates' code, so
    the next plan of the same box imports no jinja2 and shows the same plan, byte for byte."""
    cache = tmp_path / "xdg"
    runs = []
    for _ in range(2):
        report = tmp_path / "modules.json"
        done = subprocess.run(
            [sys.executable, "-c", _CLI_THEN_MODULES, str(report), "plan", str(local_rig), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(cache)},
            cwd=tmp_path,
        )
        assert report.exists(), done.stderr
        plan = json.loads(done.stdout)
        for host in plan["hosts"].values():
            host.pop("elapsed_s", None)
        runs.append((plan, "jinja2" in json.loads(report.read_text())["modules"]))
    (first, first_jinja2), (second, second_jinja2) = runs
    assert first_jinja2 and not second_jinja2
    assert first == second and first["exit_code"] == 2  # the same creates, diffs included


def test_the_agents_facts_verb_loads_only_what_facts_uses(tmp_path: Path) -> None:
    """Every agent call pays for every module it imports; facts is the one every plan makes."""
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(build_agent(tmp_path / "bundles").data)
    folder = unpack_beside(str(pyz))  # what the control side runs once the agent is on a host
    assert folder is not None
    done = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", folder, "facts"],  # -S: only what the agent imports
        input=json.dumps({"args": {}, "simulate": str(TWIN)}),
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    reply = json.loads(done.stdout)
    assert reply["ok"], done.stdout + done.stderr
    # Issue 41: the unpacking recorded the zipapp's digest; a facts call reads it instead of hashing.
    assert reply["result"]["agent_digest"] == hashlib.sha256(pyz.read_bytes()).hexdigest()
    loaded = set(re.findall(r"^import time:.*\| +(\S+)$", done.stderr, re.MULTILINE))
    assert "mgpu_provision.node.verbs.facts" in loaded
    node_only_elsewhere = {
        f"mgpu_provision.node.{name}"
        for name in (
            "verbs.apply",
            "packages.apt",
            "packages.dnf",
            "packages.runfile",
            "core.atomic",
            "verbs.smoke",
            "verbs.smoke_program",
            "verbs.gpu_settings",
        )
    }
    assert all(find_spec(name) for name in node_only_elsewhere)  # real modules: a moved one must move here
    # The rare paths of the agent's own start (unpacking, a bug's traceback), a simulated reboot, and what
    # topology's dataclasses would load (it is NamedTuples for that).
    stdlib_only_elsewhere = {"shutil", "tempfile", "traceback", "zipfile", "uuid", "platform", "socket"}
    stdlib_only_elsewhere |= {"dataclasses", "inspect"}
    # Issue 41: Slurm's tools (no `slurm` asked: no process started).
    stdlib_only_elsewhere |= {"subprocess"}
    # Issue 41: OpenSSL for three SHA-256 digests (node/core/digest.py), getpass for the login's name.
    stdlib_only_elsewhere |= {"_hashlib", "getpass", "termios"}
    # Issue 41: typing (~5 ms of a call's ~50): type names under TYPE_CHECKING, records from typing_lite.
    stdlib_only_elsewhere |= {"typing"}
    assert not loaded & (node_only_elsewhere | stdlib_only_elsewhere)


def test_the_agent_command_caches_bytecode_whatever_the_logins_python_variables(tmp_path: Path) -> None:
    """`-I`: a login with PYTHONDONTWRITEBYTECODE must not make every call compile the agent again."""
    bundle = build_agent(tmp_path / "bundles")
    cache = tmp_path / ".cache" / "mgpu-provision"
    cache.mkdir(parents=True)
    (cache / bundle.name).write_bytes(bundle.data)
    command = agent_command(bundle.name, sys.executable, "facts", sudo=False)
    login = {**os.environ, "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    request = json.dumps({"args": {}, "simulate": str(TWIN)})
    for _ in range(2):  # the first run unpacks the zipapp, the second runs the folder
        done = subprocess.run(
            ["sh", "-c", command], input=request, capture_output=True, text=True, env=login, timeout=60
        )
        assert json.loads(done.stdout)["ok"], done.stdout + done.stderr
    folder = cache / bundle.name.removesuffix(".pyz")
    assert list((folder / "mgpu_provision" / "node" / "verbs" / "__pycache__").glob("facts.*.pyc"))


def test_the_torch_probe_answers_from_its_cache_without_json_or_torch(tmp_path: Path) -> None:
    """The probe is a second interpreter start per facts call; on a box that did not change it only finds
    torch and compares, so its start must stay bare."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        '__version__ = "2.13.0"\n'
        "class cuda:\n"
        "    is_available = staticmethod(lambda: False)\n"
        "    device_count = staticmethod(lambda: 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def probe(key: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-S", "-X", "importtime", "-c", _TORCH_PROBE, key]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=True)

    key = json.loads(probe("").stdout.splitlines()[-1])["key"]
    cached = probe(repr(key))
    assert json.loads(cached.stdout.splitlines()[-1]) == {"cached": True}
    loaded = set(re.findall(r"^import time:.*\| +(\S+)$", cached.stderr, re.MULTILINE))
    assert not loaded & {"json", "torch"}


def test_a_runs_agent_is_read_and_hashed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """apply builds its agent for every --serial batch: each build read and hashed every source file."""
    reads: list[int] = []
    read_sources = bundle.agent_files
    monkeypatch.setattr(bundle, "agent_files", lambda: reads.append(1) or read_sources())
    first, second = build_agent(), build_agent()
    assert first is second and len(reads) <= 1  # 0 when an earlier test of this process built it


# Runs the real CLI; writes the modules loaded when main() returned and those loaded by the end of the
# interpreter's exit handlers (registered first, this one runs last).
_CLI_THEN_MODULES_AT_EXIT = (
    "import atexit, json, sys\n"
    "seen = {}\n"
    "def report():\n"
    "    seen['exit'] = sorted(sys.modules)\n"
    "    with open(sys.argv[1], 'w') as out:\n"
    "        json.dump(seen, out)\n"
    "atexit.register(report)\n"
    "from mgpu_provision.cli import main\n"
    "seen['code'] = main(sys.argv[2:])\n"
    "seen['returned'] = sorted(sys.modules)\n"
)


def test_a_plan_with_nothing_new_to_keep_loads_nothing_on_its_way_out(
    tmp_path: Path, bundles: Path, local_rig: Path
) -> None:
    """The rendered files' cache is written back at exit only when the run rendered something afresh; the
    run that did not must not pay for that writer's imports either (uuid, and the platform module uuid
    loads: ~2 ms of every plan's CPU)."""
    runs = [json.loads(r) for r in plans_reported(tmp_path, bundles, _CLI_THEN_MODULES_AT_EXIT, local_rig)]
    assert [r["code"] for r in runs] == [2, 2]
    assert set(runs[1]["exit"]) - set(runs[1]["returned"]) == set()


def test_the_commands_start_up_runs_no_garbage_collection(
    tmp_path: Path, bundles: Path, local_rig: Path
) -> None:
    """Issue 41: everything a run's imports allocate lives as long as the process, so the collector's passes
    over it free nothing (~10 ms of a one-host plan's CPU at CPython's default threshold). The installed
    command's entry (`entry.py`) raises the threshold: a cached local plan, imports included, runs none."""
    code = (
        "import gc, sys\n"
        "import mgpu_provision.entry\n"
        "passes = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and passes.append(info['generation']))\n"
        "from mgpu_provision.cli import main\n"
        "exit_code = main(sys.argv[1:])\n"
        "print(exit_code, len(passes), file=sys.stderr)\n"
    )
    stderr = cached_plan(tmp_path, bundles, local_rig, code)
    assert stderr.split()[-2:] == ["2", "0"], stderr


# The records a plan keeps as dataclasses (ARCHITECTURE "Records on plan's path"): changed in place, with
# field factories, a cached_property, or a field outside their equality.
PLAN_DATACLASSES = {
    "mgpu_provision.fleet.options.FleetOptions",
    "mgpu_provision.fleet.options.SharedSsh",
    "mgpu_provision.fleet.pool.HostOutcome",
    "mgpu_provision.jobs.plan.FleetPlan",
    "mgpu_provision.jobs.plan.HostPlan",
    "mgpu_provision.plan.change.HostContext",
    "mgpu_provision.rig.rig.LoadedRig",
    "mgpu_provision.rig.rig.SectionDefaults",
}


def test_a_plan_makes_only_the_dataclasses_that_need_to_be(
    tmp_path: Path, bundles: Path, local_rig: Path
) -> None:
    """Issue 41: a frozen dataclass costs ~0.45-0.9 ms to create on Python 3.11, a NamedTuple ~0.1; a plan's
    plain value records are NamedTuples (10 of them were dataclasses: ~5 ms of a one-host plan's CPU)."""
    code = (
        "import dataclasses, sys\n"
        "from mgpu_provision.cli import main\n"
        "main(sys.argv[1:])\n"
        "made = sorted(f'{name}.{key}' for name, module in list(sys.modules.items())\n"
        "    if name.startswith('mgpu_provision') for key, value in vars(module).items()\n"
        "    if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == name)\n"
        "print(' '.join(made), file=sys.stderr)\n"
    )
    stderr = cached_plan(tmp_path, bundles, local_rig, code)
    assert set(stderr.splitlines()[-1].split()) == PLAN_DATACLASSES, stderr[-2000:]
