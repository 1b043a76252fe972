"""Records what each reliability test tried and how it ended, for `tools/reliability_report.py`.

RELIABILITY.md must come from a test run, not be written by hand. Each test describes its trial through the
`trial` fixture (what was tried, the figures: examples run, hosts, faults); the figures travel with the test
report (as a user property, so pytest-xdist carries them to the controller), and the controller process
writes every trial with its outcome to `tests/reliability/.results.json` at the end of the session.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.trial import SLOW, Trial

RESULTS = Path(__file__).resolve().parent / ".results.json"
PROPERTY = "reliability"


@pytest.fixture
def trial(request: pytest.FixtureRequest) -> Any:
    """`trial.area`, `trial.tried`, `trial.expect` and `trial.figures` of the running test."""
    record = Trial(area="", tried="")
    yield record
    # Appended at teardown, so the teardown report carries the figures even when the test failed.
    request.node.user_properties.append((PROPERTY, record.__dict__))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="long fuzz/soak run: set MGPU_SLOW=1")
    for item in items:
        if "/reliability/" not in str(item.path):
            continue
        if "slow" in item.keywords and not SLOW:
            item.add_marker(skip)
        if "test_hosts" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)  # `-m "not e2e"` leaves out what needs root and sshd


class _Collector:
    def __init__(self) -> None:
        self.trials: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "reliability/" not in report.nodeid:
            return
        entry = self.trials.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed"})
        for name, value in report.user_properties:
            if name == PROPERTY and isinstance(value, dict):
                entry.update(value)
        if report.when == "call":
            entry["seconds"] = round(report.duration, 2)
        if hasattr(report, "wasxfail"):
            entry["outcome"] = "known bug" if report.skipped else "bug fixed (remove xfail)"
            entry["reason"] = report.wasxfail.removeprefix("reason: ")
        elif report.skipped:
            entry["outcome"] = "skipped"
            entry["reason"] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        elif report.failed:
            entry["outcome"] = "failed"
            entry["reason"] = (report.longreprtext.strip().splitlines() or [""])[-1][:300]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.trials:
            return
        RESULTS.write_text(
            json.dumps(
                {
                    "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "python": platform.python_version(),
                    "slow": SLOW,
                    "workers": session.config.getoption("numprocesses", None) or 1,
                    "trials": sorted(self.trials.values(), key=lambda t: t["nodeid"]),
                },
                indent=1,
            )
            + "\n"
        )


def pytest_configure(config: pytest.Config) -> None:
    # Only the process that sees every report writes the file: the xdist controller, or a plain run.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Collector(), "reliability-results")
