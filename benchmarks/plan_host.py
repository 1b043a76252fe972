"""CPU of one host's plan (`plan_host`) over every plan case, for copies of the package side by side.

`plan` runs every resource's diff once per host, and the judge's checks read the facts as plain data (one
`model_dump()` per host), so this is the figure a change to the judge or to a resource moves. Each copy
(`--code DIR ...`, e.g. an old commit from `git archive`) runs in its own process with its folder first on
the path, alternating between copies in every round so that the load of a shared machine hits all alike;
the figure is the best of the rounds (other work only ever adds to CPU time), in microseconds per host,
after one untimed pass (the first plan of a process compiles the templates).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_ROUND = """\
import json, sys, tempfile, time, yaml
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from mgpu_provision.plan.host import plan_host
from mgpu_provision.rig import load_rig
from tests.support.factories import TOPOLOGIES, case_facts
work = []
for path in sorted(Path(sys.argv[2], "tests", "unit", "plan_cases").glob("*.yaml")):
    case = yaml.safe_load(path.read_text()); folder = Path(tempfile.mkdtemp())
    (folder / "rig.yaml").write_text(yaml.safe_dump(case["rig"]))
    (folder / "topologies").symlink_to(TOPOLOGIES)
    loaded = load_rig(folder / "rig.yaml")
    work.append((loaded, loaded.host(case.get("host", loaded.spec.hosts[0].name)), case_facts(case)))
for loaded, host, facts in work:  # untimed: the first plan compiles templates and fills caches
    plan_host(loaded, host, facts)
start = time.process_time()
for _ in range(int(sys.argv[3])):
    for loaded, host, facts in work:
        plan_host(loaded, host, facts)
assert sys.modules["mgpu_provision"].__file__.startswith(sys.argv[1]), "measured another copy"
print(json.dumps((time.process_time() - start) / (int(sys.argv[3]) * len(work)) * 1e6))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, nargs="+", default=[REPO], help="folders holding mgpu_provision")
    parser.add_argument("--repeat", type=int, default=7, help="rounds")
    parser.add_argument("--passes", type=int, default=5, help="plans of every case per round")
    args = parser.parse_args()
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for code in args.code:
            done = subprocess.run(
                [sys.executable, "-c", _ROUND, str(code.resolve()), str(REPO), str(args.passes)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            figure = json.loads(done.stdout)
            best[str(code)] = min(best.get(str(code), figure), figure)
    print(json.dumps({code: {"plan_host_cpu_us": round(us, 1)} for code, us in best.items()}, indent=2))


if __name__ == "__main__":
    main()
