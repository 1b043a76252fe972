"""DCGM for the tests: a stand-in `dcgmi` (part of the simulated NVIDIA layer: DCGM cannot run here) and the
folder of its replies and DCGM's schemas (tests/fixtures/dcgm/README.md names their sources)."""

from __future__ import annotations

from pathlib import Path

from tests.support.hosts import MANAGED_DIRS, REPO, TestHost

FIXTURES = REPO / "tests" / "fixtures" / "dcgm"
ARGV = "dcgmi.argv"  # beside the stand-in: the arguments it was last run with


def stand_in_dcgmi(folder: Path, body: str) -> Path:
    """`folder/dcgmi`, a shell script that records its arguments in `folder/dcgmi.argv`, then runs `body`
    (`cat` a reply, or `exec sleep` for one that hangs)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "dcgmi"
    script.write_text(f'#!/bin/sh\necho "$@" > {folder / ARGV}\n{body}\n')
    script.chmod(0o755)
    return folder


def dcgmi_on_host(host: TestHost, body: str) -> Path:
    """The stand-in in a test host's private /usr/local/bin (on a root login's PATH and the Slurm health
    script's), as this machine sees that folder."""
    return stand_in_dcgmi(host.dir / "managed" / str(MANAGED_DIRS.index("/usr/local/bin")), body)
