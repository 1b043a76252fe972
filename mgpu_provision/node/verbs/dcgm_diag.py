"""DCGM's active diagnostic on this node, for the node check: `dcgmi diag -r LEVEL -j` within a budget.

dcgmi is found on PATH (DCGM's packages put it in /usr/bin); where it is not, DCGM is not installed and the
check notes that the diag was skipped. The command runs in a session of its own so that at the end of its
budget it is ended with whatever it started. What it printed is judged by `judge/dcgm.py`.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from ...typing_lite import TYPE_CHECKING
from ..core import system

if TYPE_CHECKING:
    from typing import Any, Dict


def run_diag(level: int, budget_s: float) -> Dict[str, Any]:
    """What `judge.dcgm.judge_diag` reads: installed, timed_out, exit_code, stdout, stderr, elapsed_s."""
    outcome: Dict[str, Any] = {"level": level, "budget_s": budget_s, "installed": False}
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        return outcome
    started = time.monotonic()
    try:
        child = subprocess.Popen(
            [dcgmi, "diag", "-r", str(level), "-j"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            text=True,
        )
    except OSError as exc:  # found but not runnable (a broken interpreter line, a file gone meanwhile)
        return dict(outcome, installed=True, timed_out=False, exit_code=None, stdout="", stderr=str(exc))
    try:
        out, err = child.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        system.end_group(child)
        out, err, timed_out = "", "", True
    else:
        timed_out = False
    outcome.update(
        installed=True,
        timed_out=timed_out,
        exit_code=child.returncode,
        stdout=out,
        stderr=err,
        elapsed_s=round(time.monotonic() - started, 3),
    )
    return outcome
