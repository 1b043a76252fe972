"""The judge's two records: a finding (one thing wrong with a box) and the expectation it is judged against.

Both are NamedTuples of plain values: the expectation goes to a node as a JSON file, and a node without
pydantic reads it back with `expectation_from_json`. The expectation is flat (no nested records) so that its
JSON is one object whose keys are the fields below.
"""

from __future__ import annotations

from ..typing_lite import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

EXPECTATION_VERSION = 1

FAIL, WARN, DRIFT = "fail", "warn", "drift"
SEVERITY_NAMES = (FAIL, WARN, DRIFT)
# The one table of severities: (check, kind) -> severity, (check, "*") a check's default; everything else
# fails. A failure takes the box out of service (the node check exits 2 and the Slurm health script drains
# it); a warning is said (a WARN line, a metric) and the box keeps working; drift is a managed file that is
# not what apply wrote. Where DCGM judges the same signal its verdict is the one here, from
# NVIDIA/DCGM 4.6 `modules/health/DcgmHealthWatch.cpp`:
SEVERITIES: Dict[Tuple[str, str], str] = {
    # BuildXidMappings: 94 WARN, 63 WARN (memory watch); the Xid catalog's IGNORE / RESTART_APP /
    # informational resolutions (judge/xids.py NOTED) are no failure either.
    ("xid", "noted"): WARN,
    # MonitorGpuRecoveryAction: NVML_GPU_RECOVERY_ACTION_DRAIN_P2P is WARN, the others FAIL.
    ("recovery-action", "manual"): WARN,
    # MonitorMemRetiredPending: WARN; MonitorMemRowRemapUncorrectable (>= 512 rows): WARN;
    # MonitorMemRowRemapFailures, MonitorMemSbeDbeRetiredPages (a full table): FAIL.
    ("memory-repair", "pending"): WARN,
    ("memory-repair", "rows-limit"): WARN,
    # MonitorThermal: any thermal violation time in its window is WARN; a hardware slowdown is only logged
    # by Azure/azurehpc-health-checks `customTests/azure_gpu_clock_throttling.nhc`, and MonitorPower WARNs.
    ("throttle", "*"): WARN,
    # A box that works now and would come up without a driver at its next boot: a risk, not a failure.
    ("kernel", "next-boot"): WARN,
    # MonitorNVLink5Fields (2807-2943): an effective BER above 1e-12 or a symbol BER above its floor
    # (2888-2927) FAILs, as does a rise of any of its counters within the window (2929-2940).
    ("nvlink-errors", "effective-ber"): FAIL,
    ("nvlink-errors", "symbol-ber"): FAIL,
    ("file", "*"): DRIFT,  # judge/files.py: "file:<path>"
    # DCGM's diag (judge/dcgm.py, from dcgmi's JSON): a "Fail" fails; a "Warn", or a "Fail" whose every
    # error is of severity DCGM_ERROR_MONITOR ("can perform workload, but needs to be monitored",
    # dcgmlib/dcgm_errors.h), warns; a diag that timed out, could not run or printed no report gave no
    # verdict: said as a warning, the box stays in service.
    ("dcgm-diag", "warn"): WARN,
    ("dcgm-diag", "timeout"): WARN,
    ("dcgm-diag", "unreadable"): WARN,
    ("dcgm-diag", "error"): WARN,
    # MonitorImex (DCGM 4.7, `DCGM_FR_IMEX_UNHEALTHY`): a domain DOWN or DEGRADED is DCGM_HEALTH_RESULT_FAIL
    # (modules/health/tests/DcgmHealthWatchTests.cpp "Domain DOWN", "Domain DEGRADED"). DCGM passes a
    # status it cannot read; a box whose rig asks for a domain fails it too: no multi-node NVLink job runs.
    ("imex", "domain-down"): FAIL,
    ("imex", "domain-degraded"): FAIL,
    ("imex", "domain-unknown"): FAIL,
}


def severity_of(check: str, kind: str) -> str:
    family = check.split(":", 1)[0]
    return SEVERITIES.get((family, kind)) or SEVERITIES.get((family, "*")) or FAIL


class Finding(NamedTuple):
    """One judgement that did not pass. `check` names it (the plan's resource: "gpus", "topology", "xid",
    ...); `kind` says which of a check's findings it is where a caller acts on the difference (the driver's
    "not-installed" or "not-loaded", an Xid's resolution) and, with `check`, gives its severity
    (`SEVERITIES`); otherwise it is "failed". `recovery` is what brings the GPU back, where the finding says
    ("reset": a GPU reset, "reboot"): what `recover` does."""

    check: str
    message: str  # what is wrong (short enough for a drain reason)
    current: Optional[str] = None
    desired: Optional[str] = None
    gpu: Optional[int] = None  # the GPU's index, where the finding is about one GPU
    kind: str = "failed"
    uuid: Optional[str] = None  # filled in by verdict.judge_node from the facts' GPU list
    advice: Optional[str] = None  # what a person should do; None where the message says all there is
    recovery: Optional[str] = None  # "reset" or "reboot" where that is what brings the GPU back

    @property
    def summary(self) -> str:
        """The message and its advice, as plan prints them."""
        return f"{self.message}: {self.advice}" if self.advice else self.message

    @property
    def severity(self) -> str:
        return severity_of(self.check, self.kind)

    @property
    def reason(self) -> str:
        """A short, stable word for the finding (a metric label): its check, and its kind unless plain."""
        return self.check if self.kind == "failed" else f"{self.check}:{self.kind}"


class Expectation(NamedTuple):
    """What one host must look like, resolved from the rig file for that host (plan/expectation.py)."""

    gpu_model: str
    gpu_count: int
    min_pcie_gen: Optional[int] = None
    min_pcie_width: Optional[int] = None
    bridge_kind: str = "none"  # none, nvlink-bridge, nvlink, nvswitch
    bridge_pairs: Tuple[Tuple[int, int], ...] = ()
    bridge_links: Optional[int] = None
    bridge_p2p: bool = True
    # The captured `nvidia-smi topo -m` between GPUs: topology[i][j] is the cell of GPU i and GPU j ("X" on
    # the diagonal); None when the rig captured none.
    topology: Optional[Tuple[Tuple[str, ...], ...]] = None
    driver_version: Optional[str] = None  # the pin: an exact version, or a branch, or neither (no pin)
    driver_branch: Optional[str] = None
    fabricmanager: bool = False  # Fabric Manager must run (an NVSwitch rig, or the rig installs it)
    imex_domain: bool = False  # a running nvidia-imex must see its domain UP (driver.imex, not per_job)
    health_skip: Tuple[str, ...] = ()
    critical_xids: Tuple[int, ...] = ()
    ecc: Optional[bool] = None
    nvlink_error_max: int = 100
    os: str = "linux"
    files: Dict[str, str] = {}  # noqa: RUF012 - never changed; path -> sha256 of what apply writes
    # The rig's `containers` section (judge/containers.py): off, nothing about containers is judged.
    containers: bool = False
    toolkit_version: Optional[str] = None  # the NVIDIA Container Toolkit pin
    cdi_spec: str = "/etc/cdi/nvidia.yaml"  # the spec apply keeps (the refresh service's, where it runs)
    cdi_kind: str = "nvidia.com/gpu"
    runtimes: Tuple[str, ...] = ()  # docker, containerd, cri-o, podman
    # The rig's `health.dcgm_diag`: the node check runs `dcgmi diag -r LEVEL -j` within the budget.
    dcgm_diag_level: Optional[int] = None
    dcgm_diag_budget_s: float = 120.0

    def checks(self, name: str) -> bool:
        return name not in self.health_skip

    @property
    def driver_pinned(self) -> bool:
        return self.driver_version is not None or self.driver_branch is not None


_TUPLES = ("health_skip", "critical_xids", "runtimes")


def expectation_to_json(expect: Expectation) -> Dict[str, Any]:
    """The record as one JSON object (tuples become lists), with the format version beside its fields."""
    data: Dict[str, Any] = {"version": EXPECTATION_VERSION}
    data.update(expect._asdict())
    data["bridge_pairs"] = [list(pair) for pair in expect.bridge_pairs]
    data["topology"] = None if expect.topology is None else [list(row) for row in expect.topology]
    for name in _TUPLES:
        data[name] = list(data[name])
    data["files"] = dict(expect.files)
    return data


def expectation_from_json(data: Dict[str, Any]) -> Expectation:
    """The record back from `expectation_to_json`'s object; a ValueError names what is wrong with it."""
    if not isinstance(data, dict) or data.get("version") != EXPECTATION_VERSION:
        raise ValueError(f"not an expectation of version {EXPECTATION_VERSION}")
    unknown = sorted(set(data) - set(Expectation._fields) - {"version"})
    if unknown:
        raise ValueError(f"unknown expectation field(s): {', '.join(unknown)}")
    try:
        fields = {name: value for name, value in data.items() if name != "version"}
        fields["bridge_pairs"] = tuple((int(a), int(b)) for a, b in fields.get("bridge_pairs", ()))
        topology = fields.get("topology")
        fields["topology"] = None if topology is None else tuple(tuple(str(c) for c in r) for r in topology)
        for name in _TUPLES:
            fields[name] = tuple(fields.get(name, ()))
        return Expectation(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed expectation: {exc}") from None


def nvml_ok(facts: Dict[str, Any]) -> bool:
    return bool((facts.get("driver") or {}).get("nvml") == "ok")


def gpus(facts: Dict[str, Any]) -> List[Dict[str, Any]]:
    found: List[Dict[str, Any]] = facts.get("gpus") or []
    return found
