"""The node check's severity series, rendered from findings (pure): every severity and recovery action is
always written (0 included), two findings alike are one series counted (node_exporter refuses a textfile
that repeats a series), and severity and reason are labels of their own series, not inside an `_info`."""

from __future__ import annotations

import re

from mgpu_provision.judge.records import Finding
from mgpu_provision.node.verbs import check_metrics

FACTS = {"gpus": [{"index": 0, "uuid": "GPU-a", "pci_bus_id": "00000000:01:00.0"}]}


def series(text: str, name: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        match = re.match(rf"mgpu_provision_check_{name}(\{{.*\}})? (\S+)$", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


def test_findings_by_severity_reason_and_recovery_are_series_with_labels() -> None:
    links = [Finding("nvlink-errors", f"GPU 0 link {n}: replay +1", gpu=0) for n in (1, 2)]
    hot = Finding("throttle", "GPU 0 had its clocks held down", gpu=0, kind="violation")
    xid = Finding("xid", "GPU 0 logged Xid 119", gpu=0, kind="reset_gpu", recovery="reset")
    text = check_metrics.render("0.1.0", 2, 0.0, 1.0, [("health", [*links, hot, xid])], [], FACTS)
    assert series(text, "findings_by_severity") == {
        '{severity="fail"}': 3,
        '{severity="warn"}': 1,
        '{severity="drift"}': 0,
    }
    found = series(text, "finding")
    gpu = 'gpu="0",UUID="GPU-a",pci_bus_id="00000000:01:00.0"'
    assert found[f'{{check="nvlink-errors",severity="fail",reason="nvlink-errors",{gpu}}}'] == 2
    assert found[f'{{check="throttle",severity="warn",reason="throttle:violation",{gpu}}}'] == 1
    assert found[f'{{check="xid",severity="fail",reason="xid:reset_gpu",{gpu}}}'] == 1
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(lines) == len({line.rsplit(" ", 1)[0] for line in lines})  # no series twice
    assert series(text, "recovery_recommended") == {'{action="reset"}': 1, '{action="reboot"}': 0}


def test_a_warning_alone_passes_its_check() -> None:
    hot = Finding("throttle", "GPU 0 is in HW slowdown", gpu=0, kind="slowdown")
    text = check_metrics.render("0.1.0", 0, 0.0, 1.0, [("health", [hot])], [], FACTS)
    assert series(text, "passed") == {'{check="health"}': 1}
    assert (
        series(text, "gpu_passed")['{check="health",gpu="0",UUID="GPU-a",pci_bus_id="00000000:01:00.0"}'] == 1
    )
