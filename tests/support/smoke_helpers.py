"""Helpers shared by the smoke tests: free ports, a /proc scan for a run's processes, listening sockets,
and test hosts that form a DDP group."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from mgpu_provision import cli
from mgpu_provision.node.verbs.smoke import MARKER_ENV
from tests.support.hosts import NODE_PYTHON, HostFactory, TestHost, load_twin

# Generous deadlines: six torch imports per run can take tens of seconds on two busy cores. A passing run ends
# as soon as it is done; a failing one must still name its cause before the deadline, so FAIL_TIMEOUT_S leaves
# the rendezvous timeout (a quarter of it) room after a slow start.
PASS_TIMEOUT_S = 240
FAIL_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def processes_of_run(rid: str) -> list[int]:
    """Every process whose environment names this run or one of its smaller runs (`<run id>-t<n>`, the
    runs that name a bad node), found independently of node.py's own scan."""
    needle = f"{MARKER_ENV}={rid}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if any(var.startswith(needle) for var in f.read().split(b"\0")):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def listening(port: int) -> bool:
    """Whether any socket listens on `port` (IPv4 or IPv6), from /proc/net/tcp*."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def node_args(rid: str, port: int, node_rank: int, **over: Any) -> dict[str, Any]:
    """A loopback gloo request for two nodes of two ranks each, small enough for two CPU cores."""
    args: dict[str, Any] = {
        "node": f"node{node_rank}",
        "python": sys.executable,
        "nnodes": 2,
        "node_rank": node_rank,
        "nproc_per_node": 2,
        "master_addr": "127.0.0.1",
        "master_port": port,
        "backend": "gloo",
        "rdzv_backend": "static",
        "rdzv_id": rid,
        "run_id": rid,
        "timeout_s": PASS_TIMEOUT_S,
        "batch_size": 4,
        "sizes_mib": [0.0625, 0.25],
        "iters": 2,
        "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
    }
    args.update(over)
    return args


# ---- test hosts (e2e and reliability tests) ----------------------------------------------------------


def start_hosts(factory: HostFactory, count: int) -> list[TestHost]:
    """gpu-0 .. gpu-N: 2x RTX 3090 twins of rig `pair`."""
    twin = load_twin("rtx3090-nvlink")
    return [factory.start(f"gpu-{i}", twin, rig="pair") for i in range(count)]


def site_packages() -> str:
    """Where this venv's torch lives: test hosts hide the venv, so nodes get it on PYTHONPATH."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    return str(Path(spec.origin).parents[1])


def smoke_rig(
    factory: HostFactory,
    path: Path,
    hosts: list[TestHost],
    timeout_s: float,
    torch_path: str | None = None,
    backend: str = "gloo",
    nproc_per_node: int = 2,
    drills: dict[str, str] | None = None,
) -> Path:
    """A rig whose hosts form one DDP group (master: the first) of two ranks each (or `nproc_per_node`), on
    loopback; `drills`: the smoke program's drill variables, in the fleet's env."""
    env = {"OMP_NUM_THREADS": "1", **({"PYTHONPATH": torch_path} if torch_path else {}), **(drills or {})}
    ddp = {
        "master": hosts[0].name,
        "port": free_port(),
        "backend": backend,
        "nproc_per_node": nproc_per_node,
        "ifname": "lo",
    }
    return factory.write_rig(
        path,
        hosts,
        rigs={
            "pair": {"gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2}, "ddp": {**ddp, "ifname": "lo"}}
        },
        env=env,
        smoke={"python": NODE_PYTHON, "timeout_s": timeout_s, "batch_size": 4, "sizes_mib": [0.0625, 0.25]},
    )


def apply_env_files(factory: HostFactory, rig: Path) -> None:
    """Install the launcher and env files on every host, as a user does before smoke."""
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = cli.main(
            ["apply", str(rig), "--playbook", "env", "--yes", "--known-hosts", str(factory.known_hosts)]
        )
    assert code == 0, said.getvalue()
