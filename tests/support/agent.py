"""Running the built agent zipapp as a node does: the node's python3, a request on stdin, one JSON reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TWINS = ROOT / "examples" / "twins"
NODE_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def run_agent(pyz: Path, verb: str, request: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [NODE_PYTHON, str(pyz), verb],
        input=request if isinstance(request, str) else json.dumps(request),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd="/",  # nothing from the checkout may leak onto sys.path
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # exactly one JSON object
    reply: dict[str, Any] = json.loads(lines[0])
    return reply
