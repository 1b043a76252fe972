"""Helpers shared by the smoke tests: free ports, a /proc scan for a run's processes, listening sockets."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from typing import Any

from mgpu_provision.node.smoke import MARKER_ENV

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
    """Every process whose environment names this run, found independently of node.py's own scan."""
    needle = f"{MARKER_ENV}={rid}/".encode()
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
