"""Start-up figures (issue 20): what a command costs before it does any work, on this machine alone.

`fleet.py` times whole runs against OpenSSH; at one to eight hosts those are mostly Python start-up. This
script isolates it:

- `import commands.plan`: the cumulative `-X importtime` of `mgpu_provision.commands.plan` (the issue's
  figure), and the sum of every top-level import of a whole `plan --json` run on a local simulated box
  (what the run really loads, jinja2 at its first render included);
- wall and CPU of `validate` on an example and of that local `plan --json` (the demo's rig; its smoke
  python is a venv whose torch is a stand-in, so the torch probe answers from its cache as on a box that
  did not change, and torch's own import is not measured);
- the agent's `facts` on that simulated box: CPU (user+sys from wait4, the torch probe child included) of
  the node python running the unpacked agent, plain and with `-S -I`, next to that python doing nothing;
- which of rich, fabric, paramiko, jinja2, pydantic the plan run loaded.

`--code DIR ...` measures copies of the package (e.g. an old commit from `git archive`) through PYTHONPATH,
alternating between them in every round so that the load of a shared machine hits all alike; each figure
is the median (and the minimum) of `--repeat` rounds. Bytecode caches are allowed (PYTHONDONTWRITEBYTECODE
is dropped), as on a user's machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hotspots import import_lines

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("rich", "fabric", "paramiko", "jinja2", "pydantic", "yaml")
# The benchmarks' stand-in for torch (also the fleet's, testbed.py): answers the agent's probe without the
# real import. Its version is new enough for the rig's DDP launcher, which plan checks.
STAND_IN_TORCH = '''"""Benchmark stand-in for torch: answers the agent's probe without the real import."""
__version__ = "2.13.0+mgpubench"


class cuda:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0
'''
_SETUP = """\
import json, sys; from pathlib import Path
from mgpu_provision.commands.demo import write_demo
from mgpu_provision.fleet.bundle import build_agent
from mgpu_provision.plan.host import facts_request
from mgpu_provision.rig import load_rig
w = Path(sys.argv[1]); rig = write_demo(w / 'demo', sys.argv[2]); loaded = load_rig(rig)
(w / 'agent.pyz').write_bytes(build_agent(w / 'bundles').data)
host = loaded.spec.hosts[0]
request = {'args': facts_request(loaded, host), 'simulate': str(loaded.resolve(host.simulate))}
(w / 'request.json').write_text(json.dumps(request))
"""


def importtime(stderr: str) -> tuple[dict[str, float], float]:
    """Cumulative ms per module, and the sum over the top-level imports (what the process loaded)."""
    cumulative: dict[str, float] = {}
    total = 0.0
    for indent, module, micros in import_lines(stderr):
        cumulative[module] = micros / 1000
        if indent == 1:
            total += micros / 1000
    return cumulative, total


def cpu_run(
    argv: list[str], env: dict[str, str], stdin: bytes = b"", cwd: Path | None = None
) -> tuple[float, float]:
    """(wall s, user+sys CPU s of the process and its children) of one run; fails loudly on a crash."""
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd
    )
    assert process.stdin is not None and process.stderr is not None
    process.stdin.write(stdin)
    process.stdin.close()
    err = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 2):
        raise SystemExit(f"{' '.join(argv)} exited {code}: {err.decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def stand_in_torch_python(folder: Path, node_python: str) -> str:
    """A venv of the node python whose `torch` answers the probe without the real import."""
    subprocess.run([node_python, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "torch").mkdir()
    (Path(site) / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
    return str(python)


def cases(
    code: Path, work: Path, node: str, example: str
) -> tuple[dict[str, Callable[[], float]], list[str]]:
    """Set up one copy of the package in `work`; its measurements by figure name, and which of HEAVY its
    `plan --json` run loads."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "XDG_CACHE_HOME")}
    env["PYTHONPATH"] = str(code)
    # Each copy has a HOME of its own: its caches (rigs, templates, agent uploads, the torch probe's answer)
    # are its own, as on a user's machine, instead of two versions overwriting each other's every round.
    # `python3` on PATH is the node python, as on a node (not a wrapper such as a pyenv shim).
    env["HOME"] = str(work / "home")
    env["PATH"] = os.pathsep.join([str(Path(node).parent), env.get("PATH", os.defpath)])
    py = sys.executable
    # Every python of a copy runs in `work`: started in the checkout, `-c` and `-m` would import the
    # checkout's package ahead of PYTHONPATH (the folder a python starts in comes first on its path).
    subprocess.run(
        [py, "-c", _SETUP, str(work), stand_in_torch_python(work / "venv", node)],
        env=env,
        check=True,
        cwd=work,
    )
    rig, agent = work / "demo" / "demo-rig.yaml", str(work / "agent")
    request = (work / "request.json").read_bytes()
    cpu_run([node, str(work / "agent.pyz"), "facts"], env, request, cwd=work)  # unpacks agent/ beside it
    validate = [py, "-m", "mgpu_provision", "validate", str(REPO / example)]  # run in `work`, as the others
    plan = [py, "-m", "mgpu_provision", "plan", str(rig), "--json"]
    cpu_run(plan, env, cwd=work)  # uploads the agent to ~/.cache once, fills the torch probe's cache

    def imports(argv: list[str]) -> tuple[dict[str, float], float]:
        done = subprocess.run(
            [py, "-X", "importtime", *argv], env=env, capture_output=True, text=True, cwd=work
        )
        return importtime(done.stderr)

    loads = [name for name in HEAVY if name in imports(plan[1:])[0]]

    (work / "cold").mkdir()  # not in `work` itself: the agent runs there, and the probe stats it

    def cold() -> dict[str, str]:
        return {**env, "XDG_CACHE_HOME": tempfile.mkdtemp(dir=work / "cold")}

    return {
        "import_commands_plan_ms": lambda: imports(["-c", "import mgpu_provision.commands.plan"])[0][
            "mgpu_provision.commands.plan"
        ],
        "plan_json_run_imports_ms": lambda: imports(plan[1:])[1],
        "validate_wall_s": lambda: cpu_run(validate, env, cwd=work)[0],
        # a rig file never seen before (or just edited): an empty control-side cache every time
        "validate_cold_wall_s": lambda: cpu_run(validate, cold(), cwd=work)[0],
        "validate_cpu_s": lambda: cpu_run(validate, env, cwd=work)[1],
        "plan_local_wall_s": lambda: cpu_run(plan, env, cwd=work)[0],
        "plan_local_cpu_s": lambda: cpu_run(plan, env, cwd=work)[1],
        "node_python_pass_cpu_ms": lambda: 1000 * cpu_run([node, "-c", "pass"], env)[1],
        "node_python_S_I_pass_cpu_ms": lambda: 1000 * cpu_run([node, "-S", "-I", "-c", "pass"], env)[1],
        "agent_facts_cpu_ms": lambda: 1000 * cpu_run([node, agent, "facts"], env, request, work)[1],
        "agent_facts_S_I_cpu_ms": lambda: (
            1000 * cpu_run([node, "-S", "-I", agent, "facts"], env, request, work)[1]
        ),
    }, loads


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--code", type=Path, nargs="+", default=[REPO], help="folders holding mgpu_provision")
    parser.add_argument("--node-python", default="/usr/bin/python3", help="the python that runs the agent")
    parser.add_argument("--example", default="examples/mixed-fleet.yaml")
    args = parser.parse_args()
    report: dict[str, object] = {"load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="mgpu-startup-") as tmp:
        measured = {
            str(code): cases(code.resolve(), Path(tmp) / str(i), args.node_python, args.example)
            for i, code in enumerate(args.code)
        }
        samples: dict[str, dict[str, list[float]]] = {code: {} for code in measured}
        for _ in range(args.repeat):
            for code, (figures, _) in measured.items():  # alternating: load drifts hit every copy alike
                for name, measure in figures.items():
                    samples[code].setdefault(name, []).append(measure())
    for code, values in samples.items():
        summary: dict[str, object] = {
            name: {"median": round(statistics.median(v), 3), "min": round(min(v), 3)}
            for name, v in values.items()
        }
        summary["plan_json_run_loads"] = measured[code][1]
        report[code] = summary
    report["load_after"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
