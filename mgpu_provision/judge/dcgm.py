"""DCGM's active diagnostic as findings: what `dcgmi diag -r 1|2 -j` printed, judged per test and GPU.

The node check runs the diag where the rig asks (`health.dcgm_diag`) and DCGM is installed, within a budget
(node/verbs/dcgm_diag.py); this judges what came back, pure. The JSON is dcgmi's own
(NVIDIA/DCGM `dcgmi/Diag.cpp` HelperJsonBuildOutput, key names in `nvvs/include/NvvsJsonStrings.h`), in
either shape it has had:
- DCGM 4: `{"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results":
  [{"entity_group", "entity_id", "status", "warnings": [{"warning", "error_id", "error_severity"}]}],
  "test_summary": {"status"}}]}]}, "entity_groups", "metadata"}` (testing/python3/dcgm_diag_schema.json);
- DCGM 3: `{"DCGM GPU Diagnostic": {"test_categories": [... "results": [{"gpu_id": "0", "status",
  "warnings"}]]}, "version", "Driver Version Detected", ...}` (the 3.3 schema at that path);
- either: `{"DCGM [GPU] Diagnostic": {"version", "runtime_error": "..."}}` when the diag could not run.

A result's `status` is "Pass", "Skip", "Fail" or, from a printer that shows it, "Warn"; "Not Run" results
are left out by dcgmi. Pass and Skip are no finding. dcgmi's JSON prints a WARN result as "Fail"
(`Diag.h`: HelperDisplayDiagResult defaults to DDR_NO_DISPLAY_WARN; DCGM 3 printed only Pass, Skip, Fail),
so a "Fail" whose every error is of severity DCGM_ERROR_MONITOR ("Can perform workload, but needs to be
monitored", `dcgmlib/dcgm_errors.h`) is a warning, as a "Warn" is; any other "Fail" fails. An error of
severity DCGM_ERROR_RESET ("Drain and reset GPU") says so in the advice; it is no `recovery` for
`recover`, which judges the facts and never runs the diag again after its reset. A diag that timed out,
could not run or printed something else is a warning that says so: the gate gave no verdict, and a box is
not taken out of service for what DCGM could not say.
"""

from __future__ import annotations

import json

from ..typing_lite import TYPE_CHECKING
from .records import Finding

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

CHECK = "dcgm-diag"
ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # NVVS_NAME in DCGM 4, and in DCGM 3
DCGM_ERROR_MONITOR, DCGM_ERROR_RESET = 1, 6  # dcgmErrorSeverity_t (dcgmlib/dcgm_errors.h)
FAILING = ("fail", "warn")
NOT_INSTALLED = "dcgm-diag: DCGM is not installed (no dcgmi on PATH), diag skipped"
ADVICE = "run `dcgmi diag -r {level}` on the node for the whole report (nvvs.log beside it)"
QUOTED = 300  # the most characters of dcgmi's own words a finding quotes


def judge_diag(outcome: Dict[str, Any]) -> Tuple[List[Finding], List[str]]:
    """(findings, notes) of one diag run as the node reported it: `installed`, `timed_out`, `level`,
    `budget_s`, `exit_code`, `stdout`, `stderr`."""
    level = outcome["level"]
    if not outcome.get("installed"):
        return [], [NOT_INSTALLED]
    advice = ADVICE.format(level=level)
    if outcome.get("timed_out"):
        message = f"dcgmi diag -r {level} did not finish within its budget of {outcome['budget_s']:g} s"
        advice = "raise health.dcgm_diag.budget_s, or look for a hung GPU (" + advice + ")"
        return [Finding(CHECK, message, "timed out", "a verdict", kind="timeout", advice=advice)], []
    root = _root(outcome.get("stdout") or "")
    if root is None:
        said = _said(outcome.get("stdout") or "", outcome.get("stderr") or "")
        message = f"dcgmi diag -r {level} printed no diag report (exit {outcome.get('exit_code')}): {said}"
        return [Finding(CHECK, message, "unreadable", "a diag report", kind="unreadable", advice=advice)], []
    error = root.get("runtime_error")
    if isinstance(error, str) and error:
        message = f"dcgmi diag -r {level} could not run: {error[:QUOTED]}"
        return [Finding(CHECK, message, "not run", "a verdict", kind="error", advice=advice)], []
    return [f for test in _tests(root) for f in _judge_test(test, advice)], []


def _root(text: str) -> Optional[Dict[str, Any]]:
    """The report's root object; a line logged before or after the JSON (dcgmi, its libraries) is skipped."""
    start = text.find("{")
    try:
        data, _ = json.JSONDecoder().raw_decode(text, max(start, 0))
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    found = next((data[name] for name in ROOTS if isinstance(data.get(name), dict)), None)
    return found


def _said(stdout: str, stderr: str) -> str:
    lines = [line.strip() for line in (stderr + "\n" + stdout).splitlines() if line.strip()]
    return lines[0][:QUOTED] if lines else "nothing"


def _tests(root: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    return [
        (str(category.get("category") or "?"), test)
        for category in _dicts(root.get("test_categories"))
        for test in _dicts(category.get("tests"))
    ]


def _dicts(value: Any) -> List[Dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _judge_test(named: Tuple[str, Dict[str, Any]], advice: str) -> List[Finding]:
    """One finding per entity the test did not pass; the test's summary where no entity says more."""
    category, test = named
    results = [r for r in _dicts(test.get("results")) if _status(r) in FAILING]
    summary = test.get("test_summary")
    if not results and isinstance(summary, dict) and _status(summary) in FAILING:
        results = [summary]  # DCGM 4: errors of no entity
    return [_finding(category, str(test.get("name") or "?"), result, advice) for result in results]


def _status(result: Dict[str, Any]) -> str:
    return str(result.get("status") or "").strip().lower()


def _finding(category: str, name: str, result: Dict[str, Any], advice: str) -> Finding:
    gpu, who = _entity(result)
    errors = _dicts(result.get("warnings"))
    # DCGM 3's deployment tests put the text under "warnings" inside each entry (Diag.cpp 3.3
    # HelperJsonAddBasicTests), its per-GPU tests and DCGM 4 under "warning".
    words = [str(e.get("warning") or e.get("warnings") or "").strip() for e in errors]
    severities = [e.get("error_severity") for e in errors]
    status = _status(result)
    monitor = status == "fail" and bool(severities) and all(s == DCGM_ERROR_MONITOR for s in severities)
    kind = "failed" if status == "fail" and not monitor else "warn"
    said = "; ".join(w for w in words if w)[:QUOTED]
    shown = status + (", DCGM severity MONITOR" if monitor else "")
    message = f"{who}: DCGM diag {category} test {name}: {shown}" + (f" ({said})" if said else "")
    if DCGM_ERROR_RESET in severities:
        advice = "DCGM says: drain and reset the GPU, then run the diag again; " + advice
    return Finding(CHECK, message, status, "pass", gpu, kind, advice=advice)


def _entity(result: Dict[str, Any]) -> Tuple[Optional[int], str]:
    """(the GPU's index, words naming the entity): DCGM 4's entity_group/entity_id, DCGM 3's gpu_id."""
    group, index = result.get("entity_group"), result.get("entity_id")
    if group is not None:
        if group == "GPU" and isinstance(index, int):
            return index, f"GPU {index}"
        return None, f"{group} {index}"
    gpu = result.get("gpu_id")
    if isinstance(gpu, int) or (isinstance(gpu, str) and gpu.isdigit()):
        return int(gpu), f"GPU {int(gpu)}"
    return None, "the node"
