"""The node check's verdict as Prometheus text for node_exporter's textfile collector (pure: no I/O).

Conventions that decide whether a series reaches Prometheus at all: no sample timestamps (node_exporter
refuses a textfile that has them), base units (seconds, bytes per second), versions as labels of an
`_info` gauge whose value is 1, and labels that join dcgm-exporter's GPU series: `gpu` (the NVML index),
`UUID` and `pci_bus_id`, spelled as dcgm-exporter spells them. Every series is written on every run (a
check that passed is a 1, not a missing series), so an alert on `== 0` never mistakes a gap for health.
"""

from __future__ import annotations

from ...judge.records import FAIL, SEVERITY_NAMES, Finding
from ...typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

PREFIX = "mgpu_provision_check_"
if TYPE_CHECKING:
    Labels = Sequence[Tuple[str, str]]
# The judges whose findings may name a GPU; the others (driver, files, ...) get no per-GPU series.
GPU_JUDGES = ("inventory", "topology", "pcie", "health")


class Metrics:
    """Metric families in the order they are added, each with its HELP and TYPE lines once."""

    def __init__(self) -> None:
        self._families: List[Tuple[str, str, List[str]]] = []

    def add(self, name: str, help_text: str, samples: Sequence[Tuple[Labels, float]]) -> None:
        lines = [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]
        self._families.append((name, help_text, lines))

    def text(self) -> str:
        out: List[str] = []
        for name, help_text, lines in self._families:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *lines]
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def gpu_labels(facts: Optional[Dict[str, Any]]) -> List[Tuple[int, Labels]]:
    """(index, dcgm-exporter's labels) of every GPU the facts name, the lost ones too (their UUID unknown)."""
    found: Dict[int, Labels] = {}
    for gpu in (facts or {}).get("gpus") or ():
        found[gpu["index"]] = (
            ("gpu", str(gpu["index"])),
            ("UUID", gpu.get("uuid") or ""),
            ("pci_bus_id", gpu.get("pci_bus_id") or ""),
        )
    for gpu in (facts or {}).get("lost_gpus") or ():
        found.setdefault(
            gpu["index"],
            (("gpu", str(gpu["index"])), ("UUID", ""), ("pci_bus_id", gpu.get("pci_bus_id") or "")),
        )
    return sorted(found.items())


def job_labels(facts: Optional[Dict[str, Any]]) -> Dict[int, Labels]:
    """GPU index -> the Slurm jobs of the processes on it and their users (`slurm_job`, `slurm_user`, each
    a sorted comma list), so a dashboard joins a failed GPU to the job it hurt; GPUs without one: none."""
    jobs: Dict[int, Dict[str, Set[str]]] = {}
    for process in (facts or {}).get("processes") or ():
        if process.get("slurm_job"):
            held = jobs.setdefault(process["gpu"], {"slurm_job": set(), "slurm_user": set()})
            held["slurm_job"].add(str(process["slurm_job"]))
            if process.get("owner"):
                held["slurm_user"].add(str(process["owner"]))
    return {
        gpu: tuple((key, ",".join(sorted(values))) for key, values in held.items() if values)
        for gpu, held in jobs.items()
    }


def render(
    version: str,
    exit_code: int,
    started_s: float,
    duration_s: float,
    judged: Optional[List[Tuple[str, List[Finding]]]],
    extra: List[Finding],
    facts: Optional[Dict[str, Any]],
) -> str:
    """The .prom file of one run. `judged` is None when the run could not judge (exit 1); `extra` are the
    findings of the run itself (facts that did not come in time)."""
    m = Metrics()
    m.add(PREFIX + "info", "the node check's version", [((("version", version),), 1)])
    m.add(
        PREFIX + "up",
        "1 when the last run could check the node, 0 when it could not (exit 1)",
        [((), 0 if judged is None else 1)],
    )
    m.add(
        PREFIX + "exit_code",
        "the last run's exit code: 0 healthy, 2 a finding, 1 could not check",
        [((), exit_code)],
    )
    m.add(PREFIX + "last_run_timestamp_seconds", "when the last run started (Unix time)", [((), started_s)])
    m.add(PREFIX + "duration_seconds", "how long the last run took", [((), round(duration_s, 3))])
    if judged is not None:
        findings = [f for _, found in judged for f in found] + extra
        m.add(
            PREFIX + "findings",
            "findings of the last run (0: healthy and as the rig says)",
            [((), len(findings))],
        )
        drifted = {f.check for name, found in judged if name == "files" for f in found}
        m.add(
            PREFIX + "drifted_resources",
            "managed files that are missing or not what apply wrote",
            [((), len(drifted))],
        )
        m.add(
            PREFIX + "passed",
            "1 when the check found no failure (a warning passes), 0 otherwise",
            [((("check", name),), 0 if _fails(found) else 1) for name, found in judged]
            + [((("check", f.check),), 0) for f in extra],
        )
        jobs = job_labels(facts)
        gpus = [(index, (*labels, *jobs.get(index, ()))) for index, labels in gpu_labels(facts)]
        failed = {
            (name, f.gpu) for name, found in judged for f in found if f.gpu is not None and f.severity == FAIL
        }
        m.add(
            PREFIX + "gpu_passed",
            "1 when the check found no failure on this GPU (a warning passes), 0 otherwise",
            [
                ((("check", name), *labels), 0 if (name, index) in failed else 1)
                for name in GPU_JUDGES
                for index, labels in gpus
            ],
        )
        _severities(m, findings, dict(gpus))
    _versions(m, facts)
    return m.text()


def _fails(found: List[Finding]) -> bool:
    return any(f.severity == FAIL for f in found)


def _severities(m: Metrics, findings: List[Finding], gpus: Dict[int, Labels]) -> None:
    """The findings by check, severity, reason and GPU (severity and reason as labels), the count per
    severity as a state set (every severity written, 0 included, so `> 0` never reads a gap as health), and
    what `recover` would do."""
    # Two findings alike (two links of one GPU) are one series, counted: node_exporter refuses a textfile
    # that repeats a series.
    alike: Dict[Labels, int] = {}
    for f in findings:
        where = tuple(gpus.get(f.gpu, (("gpu", str(f.gpu)),))) if f.gpu is not None else ()
        key = (("check", f.check), ("severity", f.severity), ("reason", f.reason), *where)
        alike[key] = alike.get(key, 0) + 1
    m.add(
        PREFIX + "finding",
        "findings of the last run by check, severity (fail, warn, drift), reason and GPU",
        list(alike.items()),
    )
    m.add(
        PREFIX + "findings_by_severity",
        "findings of the last run per severity: fail drains the node, warn and drift do not",
        [((("severity", name),), sum(1 for f in findings if f.severity == name)) for name in SEVERITY_NAMES],
    )
    wanted = {f.recovery for f in findings if f.recovery}
    m.add(
        PREFIX + "recovery_recommended",
        "1 when a finding asks for this recovery (`mgpu-provision recover` from the control machine)",
        [((("action", action),), 1 if action in wanted else 0) for action in ("reset", "reboot")],
    )


def _versions(m: Metrics, facts: Optional[Dict[str, Any]]) -> None:
    if facts is None:
        return
    driver = facts.get("driver") or {}
    m.add(
        PREFIX + "driver_info",
        "the NVIDIA driver: installed and loaded versions, NVML's state",
        [
            (
                (
                    ("installed", driver.get("installed") or ""),
                    ("loaded", driver.get("loaded") or ""),
                    ("nvml", driver.get("nvml") or ""),
                ),
                1,
            )
        ],
    )
    fm = facts.get("fabricmanager")
    if fm is not None:
        m.add(
            PREFIX + "fabricmanager_info",
            "Fabric Manager: its version and its service's state",
            [((("version", fm.get("version") or ""), ("service", fm.get("service") or "")), 1)],
        )


def smoke_baseline(record: Optional[Dict[str, Any]], problem: Optional[str], now_s: float) -> str:
    """The box's last passing smoke (`smoke_baseline.py`'s record): each group's busbw and age, and whether
    the record can be trusted (0: the file is corrupt, the figures are left out)."""
    m = Metrics()
    m.add(
        PREFIX + "smoke_baseline_trusted",
        "0 when the smoke baseline file is corrupt and not used, 1 otherwise (none yet counts as 1)",
        [((), 0 if problem else 1)],
    )
    groups = sorted(((record or {}).get("groups") or {}).items())
    m.add(
        PREFIX + "smoke_busbw_bytes_per_second",
        "all_reduce busbw of the last passing smoke of each DDP group this box ran in",
        [((("group", key),), entry["busbw_gbps"] * 1e9) for key, entry in groups],
    )
    m.add(
        PREFIX + "smoke_age_seconds",
        "how long ago that smoke ran",
        [((("group", key),), round(max(0.0, now_s - entry["recorded_at"]), 1)) for key, entry in groups],
    )
    return m.text()
