"""`mgpu-provision-check`: the node judges itself, with no SSH and no control machine.

Slurm's HealthCheckProgram, a systemd timer and a person at the console all run this one command, as root,
often with nothing but PATH set. It reads the expectations apply wrote (`judge.records.Expectation` as
JSON), gathers the node's facts with the agent's own `facts` verb and judges them with the shipped judge
(`judge.verdict`), the same functions `plan` runs on the control side, so both report the same findings.

Its contract (docs: README "Monitoring and scheduled checks"):
- exit 2 only on a failure (a `FAIL` line per failing finding: what takes the box out of service); 0 when
  every finding is a warning or drift (a `WARN` or `DRIFT` line each, the box keeps working) or there is
  none; 1: it could not check (why, on stderr). Each finding's severity is the judge's
  (`judge.records.SEVERITIES`). `--json` prints one object with every finding and its severity.
- It recommends `mgpu-provision recover` where a finding's recovery is a GPU reset or a reboot (a line and
  a metric); it never resets or reboots anything itself.
- It ends within its deadline even when NVML hangs on a GPU that fell off the bus: the facts are gathered
  in a child process that is killed when its share of the deadline is spent, and that timeout is itself a
  finding. Slurm kills the program after 60 s, so the default deadline is well under that.
- Where the rig asks (`health.dcgm_diag`) it then runs DCGM's diagnostic, `dcgmi diag -r LEVEL -j`, ended
  at its budget (`--no-dcgm-diag` leaves it out: the Slurm health script, inside slurmd's 60 s); each test
  a GPU did not pass is a finding (judge/dcgm.py). Without dcgmi it says `NOTE ... diag skipped`.
- Two runs never judge at once (a lock in the state folder; the diag runs after it is released); it
  changes nothing on the node but its own lock and, with `--textfile-dir`, node_exporter's `.prom` file,
  replaced atomically (a temporary file in the same folder, then a rename) so a scrape never reads half
  of it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from ... import __version__, protocol
from ...judge.dcgm import judge_diag
from ...judge.records import FAIL, SEVERITY_NAMES, Expectation, Finding, expectation_from_json
from ...judge.verdict import judge_each
from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.archive import agent_root
from ..core.atomic import HostLock, atomic_write
from ..core.errors import AgentFailure
from . import check_metrics, smoke_baseline
from .dcgm_diag import run_diag

if TYPE_CHECKING:
    from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

EXIT_HEALTHY, EXIT_ERROR, EXIT_FAILED = 0, 1, 2
DEFAULT_DEADLINE_S = 45.0
# Below this no run can finish: starting the child Python and reading a healthy box take about a second.
MIN_DEADLINE_S = 5.0
# What is kept back from the facts' share for judging, writing the metrics file and ending the child.
RESERVE_S = 2.0
# The longest a run waits for another run's lock, as a share of its deadline (the other run ends within
# its own deadline; the rest is the facts').
LOCK_SHARE = 0.25
PROM_FILE = "mgpu-provision-check.prom"
# Names the check's .prom files ever had (or may get): any other one left in the folder would repeat the
# same series, and node_exporter fails the whole textfile scrape on a duplicate.
PROM_PREFIX = "mgpu-provision-check"
DEFAULT_EXPECTATIONS = "/etc/mgpu-provision/expectation.json"
DEFAULT_LOCK = "/var/lib/mgpu-provision/check.lock"
# The child: the agent's door, from the same archive (or folder) this command runs from.
_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); from mgpu_provision.node.__main__ import main; "
    "sys.exit(main(['agent', 'facts'], sys.stdin, sys.stdout))"
)


class CheckError(Exception):
    """The check could not be made (exit 1): the message says why."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's own exit code is 2, which this command's callers read as a failed check.
        raise CheckError(f"{message} (see --help)")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = _Parser(
        prog="mgpu-provision-check",
        description="Judge this node against the expectations apply wrote. Exit 2: a failed check (a "
        "FAIL line each); 0: healthy, or only warnings and drift (a WARN or DRIFT line each); 1: it could "
        "not check.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE_S,
        metavar="S",
        help=f"end within S seconds, even when NVML hangs (default {DEFAULT_DEADLINE_S:g})",
    )
    parser.add_argument("--expectations", default=DEFAULT_EXPECTATIONS, metavar="FILE")
    parser.add_argument(
        "--textfile-dir", metavar="DIR", help="node_exporter textfile folder for the .prom file"
    )
    parser.add_argument("--lock", default=DEFAULT_LOCK, metavar="FILE")
    parser.add_argument(
        "--no-dcgm-diag",
        action="store_true",
        help="leave out the rig's DCGM diag (health.dcgm_diag); Slurm's health script does: slurmd ends "
        "its HealthCheckProgram after 60 s",
    )
    return parser.parse_args(list(argv))


def load_expectation(path: str) -> Expectation:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise CheckError(f"{path} is missing: run `mgpu-provision apply` for this host") from None
    except OSError as exc:
        raise CheckError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise CheckError(f"{path} is not JSON ({exc}): run `mgpu-provision apply` for this host") from None
    try:
        return expectation_from_json(data)
    except ValueError as exc:
        raise CheckError(f"{path}: {exc}: run `mgpu-provision apply` for this host") from None


def gather_facts(
    expect: Expectation, budget_s: float, state_dir: Optional[str] = None
) -> Tuple[Optional[Dict[str, Any]], List[Finding]]:
    """(the facts, []) from the agent's facts verb in a child, or (None, [the timeout]) when the child did
    not answer within `budget_s`; a child that answers with an error is a CheckError. `state_dir` is the
    node's state folder: the previous counter sample (rates over a window) and the GPU reset record (Xids
    judged once) live there."""
    runtimes = list(expect.runtimes) if expect.containers else None  # the containers judge needs them
    args = protocol.facts_request(files=sorted(expect.files), containers=runtimes, state_dir=state_dir)
    request = {"args": args, "simulate": None}
    child = subprocess.Popen(
        [sys.executable, "-S", "-I", "-c", _CHILD, agent_root()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: whatever it started is ended with it
        text=True,
    )
    try:
        out, err = child.communicate(json.dumps(request), timeout=max(budget_s, 0.1))
    except subprocess.TimeoutExpired:
        system.end_group(child)
        message = f"the node's facts did not come within {budget_s:.1f} s: an NVML call hangs"
        advice = "a GPU may have fallen off the bus; look for Xid 79 in the kernel log and drain the node"
        return None, [Finding("nvml", message, "no answer", "facts", kind="timeout", advice=advice)]
    try:
        reply = json.loads(out)
    except ValueError:
        raise CheckError(
            f"the agent's facts verb broke (exit {child.returncode}): {err.strip()[-500:]}"
        ) from None
    if not reply.get("ok"):
        error = reply.get("error") or {}
        raise CheckError(f"facts: {error.get('kind')}: {error.get('message')}")
    facts: Dict[str, Any] = reply["result"]
    return facts, []


def check_textfile_dir(folder: str) -> None:
    if not os.path.isdir(folder):
        raise CheckError(
            f"the textfile folder {folder} does not exist (node_exporter's --collector.textfile.directory)"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CheckError(f"the textfile folder {folder} is not writable")


def write_prom(folder: str, text: str) -> None:
    """Replace the check's .prom file, then remove every other file of the check there (older names)."""
    path = os.path.join(folder, PROM_FILE)
    try:
        atomic_write(path, text.encode("utf-8"), 0o644)
        for name in os.listdir(folder):
            if name.startswith(PROM_PREFIX) and name.endswith(".prom") and name != PROM_FILE:
                os.unlink(os.path.join(folder, name))
    except OSError as exc:
        raise CheckError(f"cannot write {path}: {exc.strerror}") from None


class Run:
    """One run's outcome: what the output and the metrics file are made from."""

    def __init__(self, started_s: float) -> None:
        self.started_s = started_s
        self.clock = time.monotonic()
        self.facts: Optional[Dict[str, Any]] = None
        self.judged: Optional[List[Tuple[str, List[Finding]]]] = None
        self.extra: List[Finding] = []
        self.notes: List[str] = []  # what the run left out, and why (DCGM not installed)
        self.error: Optional[str] = None
        self.prom_dir: Optional[str] = None  # the textfile folder, once known to be writable

    @property
    def findings(self) -> List[Finding]:
        return [f for _, found in self.judged or () for f in found] + self.extra

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return EXIT_ERROR
        return EXIT_FAILED if any(f.severity == FAIL for f in self.findings) else EXIT_HEALTHY

    def elapsed(self) -> float:
        return time.monotonic() - self.clock


def judge(options: argparse.Namespace, run: Run) -> None:
    """Fill `run` with the verdict; a CheckError says why there is none."""
    # A simulated node's GPUs are its twin's (the command apply writes names it): no root needed to read them.
    if os.geteuid() != 0 and not os.environ.get(protocol.SIMULATE_ENV):
        raise CheckError("must run as root (it reads every GPU and the managed files)")
    if not options.deadline >= MIN_DEADLINE_S:
        raise CheckError(f"--deadline {options.deadline:g} is too short: at least {MIN_DEADLINE_S:g} s")
    if options.textfile_dir:
        check_textfile_dir(options.textfile_dir)
        run.prom_dir = options.textfile_dir
    expect = load_expectation(options.expectations)
    try:
        lock = HostLock(options.lock, options.deadline * LOCK_SHARE, holder="node check").__enter__()
    except AgentFailure as exc:
        raise CheckError(exc.message) from None
    try:
        budget = options.deadline - run.elapsed() - RESERVE_S
        # The lock lives in the node's state folder (plan/resources/node_check.py puts it there).
        run.facts, run.extra = gather_facts(expect, budget, os.path.dirname(os.path.abspath(options.lock)))
        run.judged = [] if run.facts is None else judge_each(run.facts, expect)
    finally:
        lock.__exit__(None, None, None)
    # After the lock: a diag takes minutes, and another run (Slurm's, without it) must not wait for it.
    if expect.dcgm_diag_level is not None and run.facts is not None and not options.no_dcgm_diag:
        findings, run.notes = judge_diag(run_diag(expect.dcgm_diag_level, expect.dcgm_diag_budget_s))
        if not run.notes:  # skipped (no DCGM): no `passed` series that would read as a diag that passed
            run.judged.append(("dcgm_diag", findings))


def finding_json(finding: Finding) -> Dict[str, Any]:
    return dict(finding._asdict(), summary=finding.summary, severity=finding.severity)


def finding_lines(findings: List[Finding]) -> List[str]:
    """`FAIL xid: ...`, then `WARN ...`, then `DRIFT ...` (the health script drains on the first FAIL line's
    words), and one line recommending `recover` where a finding's recovery is a reset or a reboot."""
    lines = [
        f"{severity.upper()} {f.check}: {f.summary}\n"
        for severity in SEVERITY_NAMES
        for f in findings
        if f.severity == severity
    ]
    resets = sorted({str(f.gpu) for f in findings if f.recovery == "reset" and f.gpu is not None})
    reboot = any(f.recovery == "reboot" or (f.recovery == "reset" and f.gpu is None) for f in findings)
    if resets or reboot:
        what = "reboot the node" if reboot else f"reset GPU {', '.join(resets)}"
        lines.append(f"RECOVER: `mgpu-provision recover` from the control machine would {what}\n")
    return lines


def report_json(run: Run) -> Dict[str, Any]:
    status = {EXIT_HEALTHY: "healthy", EXIT_FAILED: "failed", EXIT_ERROR: "error"}[run.exit_code]
    if status == "healthy" and run.findings:
        status = "warning"
    return {
        "host": socket.gethostname(),
        "status": status,
        "exit_code": run.exit_code,
        "error": run.error,
        "findings": [finding_json(f) for f in run.findings],
        "recovery": sorted({f.recovery for f in run.findings if f.recovery}),
        "notes": run.notes,
        "checked_at": run.started_s,
        "duration_s": round(run.elapsed(), 3),
        "version": __version__,
    }


def main(argv: Sequence[str], out: Any = None, err: Any = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    run = Run(time.time())
    options: Optional[argparse.Namespace] = None
    try:
        options = parse(argv)
        judge(options, run)
    except CheckError as exc:
        run.error = str(exc)
    if run.prom_dir is not None and options is not None:
        # Written when the run could not check too: `up 0` is what an alert on a silent node needs.
        text = check_metrics.render(
            __version__, run.exit_code, run.started_s, run.elapsed(), None if run.error else run.judged,
            run.extra, run.facts,
        )  # fmt: skip
        # The box's last smoke, from the state folder the lock is in (files.state_dir).
        text += check_metrics.smoke_baseline(*smoke_baseline.read(os.path.dirname(options.lock)), time.time())
        try:
            write_prom(run.prom_dir, text)
        except CheckError as exc:
            run.error = str(exc)
    if options is not None and options.json:
        out.write(json.dumps(report_json(run), indent=2) + "\n")
    elif run.error is not None:
        err.write(f"mgpu-provision-check: cannot check: {run.error}\n")
    else:
        out.writelines(f"NOTE {note}\n" for note in run.notes)
        if run.findings:
            out.writelines(finding_lines(run.findings))
        else:
            out.write(f"OK: {socket.gethostname()} is healthy and as the rig says\n")
    return run.exit_code
