"""A simulated node for the node check's tests: its twin, the expectations apply would write, its lock and
textfile folder, and the command run as the installed one runs it (templates/mgpu-provision-check.j2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from mgpu_provision.judge.records import Expectation, expectation_to_json
from mgpu_provision.node.verbs import check
from tests.support.factories import rtx3090_twin
from tests.support.hosts import REPO

NODE_PYTHON = "/usr/bin/python3"
# What the installed command runs (templates/mgpu-provision-check.j2), with the source tree as the agent.
ENTRY = (
    "import sys; sys.path.insert(0, sys.argv[1]); from mgpu_provision.node.verbs.check import main; "
    "sys.exit(main(sys.argv[2:]))"
)
PAIR = Expectation(
    gpu_model="NVIDIA GeForce RTX 3090",
    gpu_count=2,
    bridge_kind="nvlink-bridge",
    bridge_pairs=((0, 1),),
    bridge_links=4,
    driver_version="550.54.15",
)


class Node:
    """One simulated node's folder: twin, expectations, lock, textfile folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.twin_path = root / "twin.json"
        self.expectations = root / "expectation.json"
        self.textfile = root / "textfile"
        self.textfile.mkdir()
        self.lock = root / "state" / "check.lock"
        self.set_twin(rtx3090_twin())
        self.expect(PAIR)

    def set_twin(self, twin: dict[str, Any]) -> None:
        self.twin_path.write_text(json.dumps(twin))

    def expect(self, expect: Expectation) -> None:
        self.expectations.write_text(json.dumps(expectation_to_json(expect)))

    @property
    def prom(self) -> Path:
        return self.textfile / check.PROM_FILE

    def run(
        self,
        *args: str,
        textfile: bool = True,
        wrap: tuple[str, ...] = (),
        simulated: bool = True,
        path_prepend: str | None = None,
        path: str = "/usr/sbin:/usr/bin:/sbin:/bin",
    ) -> subprocess.CompletedProcess[str]:
        """The installed command with only PATH set (`path_prepend` before it: a stand-in dcgmi's folder;
        `path` a folder of the test's own to hide what this machine has installed)."""
        command = [NODE_PYTHON, "-S", "-I", "-c", ENTRY, str(REPO)]
        command += ["--expectations", str(self.expectations), "--lock", str(self.lock)]
        command += ["--textfile-dir", str(self.textfile)] if textfile else []
        env = {"PATH": (f"{path_prepend}:" if path_prepend else "") + path}
        env.update({"MGPU_PROVISION_SIMULATE": str(self.twin_path)} if simulated else {})
        return subprocess.run([*wrap, *command, *args], capture_output=True, text=True, env=env, timeout=120)
