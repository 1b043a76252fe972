"""The fleet report at 2,000 hosts (issue 44): `plan --report`'s rendering must take under 2 s and write
under 2 MB of HTML, so that the picture of a large fleet is as quick to make as the plan itself.

Not a timed test (a shared CI machine's seconds say little): run it, read the figures. The fleet is the
one the picture tests draw (tests/support/pictures.py): 2,000 bridged RTX 3090 pairs, a few odd ones (a
short bridge link, an unreachable host, a Xid), plus 16 NVSwitch boards. What is timed is
`report_html` (folding, the heat map, each row's box picture) and the `--svg` pictures of every host; the
plan is made beforehand.

    PYTHONPATH=. .venv/bin/python benchmarks/pictures.py [--hosts 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mgpu_provision.commands.box_picture import box_svg, wanted_of  # noqa: E402
from mgpu_provision.commands.fleet_report import findings_of, fold, report_html  # noqa: E402
from tests.support.pictures import bridge_facts, fleet_plan, fleet_rig, nvswitch_facts  # noqa: E402


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        loaded = fleet_rig(Path(folder), args.hosts, 16)
        odd = {
            "gpu-0017": bridge_facts(down=[{"gpu": 0, "link": 2}]),
            "gpu-0640": "ssh: connect to host gpu-0640 port 22: No route to host",
            "gpu-1201": bridge_facts(health={"gpus": [], "xid": [{"gpu": 1, "pci_bus_id": "00000000:21:00",
                                                                  "code": 79}], "xid_source": "journal"}),
            "hgx-07": nvswitch_facts(down=[{"gpu": 3, "link": 0}]),
        }
        plan = fleet_plan(loaded, odd, plan_healthy=False)
        report, boxes = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            html = report_html(loaded, plan)
            report.append(time.perf_counter() - start)
            start = time.perf_counter()
            for host in plan.hosts:
                wanted = wanted_of(loaded, loaded.host(host.host))
                box_svg(host.host, host.facts, wanted, findings_of(host), host.error).render()
            boxes.append(time.perf_counter() - start)
        rows = fold(loaded, plan)
    size = len(html.encode())
    print(f"hosts: {len(plan.hosts)} in {len(rows)} rows: " + "; ".join(r.label for r in rows))
    print(f"report_html: median {statistics.median(report):.3f} s, best {min(report):.3f} s "
          f"(target < 2 s); {size / 1e6:.3f} MB of HTML (target < 2 MB)")
    print(f"every host's box SVG (--svg): median {statistics.median(boxes):.3f} s")
    return 0 if statistics.median(report) < 2 and size < 2_000_000 else 1


if __name__ == "__main__":
    sys.exit(main())
