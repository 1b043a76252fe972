"""`mgpu-provision reclaim` end to end on real sshd test hosts.

Real processes started in each host's namespaces are listed in its twin as GPU memory holders: orphans, a
child of a live parent, a torchrun worker, an orphan that ignores SIGTERM. Reclaim must end exactly the
orphans, leave the others running, and find nothing to do the second time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.cli import main
from mgpu_provision.node.procs import read_proc
from tests.hosts import TWINS_DIR, HostFactory, TestHost

pytestmark = pytest.mark.e2e

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
FAKE_TORCHRUN = (
    "import subprocess; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); p.wait()\n"
)


def background(host: TestHost, command: str) -> int:
    """Start `command` in the host's namespaces from a shell that exits at once; the pid of the process."""
    out = host.run_in_ns(f"{command} </dev/null >/dev/null 2>&1 & echo $!")
    return int(out.stdout)


def orphan(host: TestHost, command: str = "sleep 300") -> int:
    return background(host, command)


def wait_pid_file(path: Path) -> int:
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return int(path.read_text())


def child_of_live_parent(host: TestHost, tmp: Path) -> int:
    pid_file = tmp / f"{host.name}-child.pid"
    background(host, f"sh -c 'sleep 300 & echo $! > {pid_file}; wait'")
    return wait_pid_file(pid_file)


def torchrun_worker(host: TestHost, tmp: Path) -> int:
    launcher = tmp / "torchrun"
    launcher.write_text(FAKE_TORCHRUN)
    pid_file = tmp / f"{host.name}-worker.pid"
    background(host, f"sh -c 'exec python3 {launcher} > {pid_file}'")
    return wait_pid_file(pid_file)


def twin_with(holders: list[tuple[int, int, int]]) -> str:
    """The example 2x RTX 3090 twin, its text kept verbatim (the agent's YAML reader reads what people
    write), with these (pid, gpu, MiB) as GPU memory holders."""
    text = (TWINS_DIR / "rtx3090-nvlink.yaml").read_text()
    return (
        text
        + "processes:\n"
        + "".join(f"  - {{pid: {pid}, gpu: {gpu}, used_mib: {mib}}}\n" for pid, gpu, mib in holders)
    )


def alive(pid: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.alive


def ignores_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    return bool(int(next(s.split()[1] for s in status.splitlines() if s.startswith("SigIgn:")), 16) & 1 << 14)


def reclaim(
    rig: Path, factory: HostFactory, capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["reclaim", str(rig), "--known-hosts", str(factory.known_hosts), "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def actions(report: Any) -> dict[tuple[str, int], str]:
    return {
        (name, p["pid"]): p["action"] for name, host in report["hosts"].items() for p in host["processes"]
    }


def test_reclaim_ends_exactly_the_orphans(
    test_hosts: HostFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = test_hosts.start("gpu-a"), test_hosts.start("gpu-b")
    started: list[int] = []
    try:
        a_orphan, a_child = orphan(a), child_of_live_parent(a, tmp_path)
        b_orphan = orphan(b, f"python3 -c '{IGNORE_TERM}'")
        b_worker = torchrun_worker(b, tmp_path)
        started = [a_orphan, a_child, b_orphan, b_worker]
        deadline = time.monotonic() + 10
        while not ignores_sigterm(b_orphan):
            assert time.monotonic() < deadline, "the orphan never installed its SIGTERM handler"
            time.sleep(0.02)
        for host, holders in (
            (a, [(a_orphan, 0, 1000), (a_child, 1, 2000)]),
            (b, [(b_orphan, 0, 3000), (b_worker, 1, 4000)]),
        ):
            host.set_twin(twin_with(holders))
        rig = test_hosts.write_rig(tmp_path / "rig.yaml", [a, b], reclaim={"policy": "orphans", "grace_s": 1})

        code, dry = reclaim(rig, test_hosts, capsys)
        assert code == 2, dry
        assert actions(dry) == {
            ("gpu-a", a_orphan): "would-end",
            ("gpu-a", a_child): "keep",
            ("gpu-b", b_orphan): "would-end",
            ("gpu-b", b_worker): "keep",
        }
        b_rows = {p["pid"]: p for p in dry["hosts"]["gpu-b"]["processes"]}
        assert b_rows[b_worker]["classification"] == "torchrun"
        assert b_rows[b_orphan]["orphaned"] and b_rows[b_orphan]["owner"] == "root"
        assert all(alive(pid) for pid in started)

        code, done = reclaim(rig, test_hosts, capsys, "--yes")
        assert code == 0, done
        assert actions(done) == {
            ("gpu-a", a_orphan): "ended",
            ("gpu-a", a_child): "keep",
            ("gpu-b", b_orphan): "ended",
            ("gpu-b", b_worker): "keep",
        }
        b_rows = {p["pid"]: p for p in done["hosts"]["gpu-b"]["processes"]}
        assert b_rows[b_orphan]["reason"].endswith("ended by SIGKILL after the 1s grace period")
        assert done["freed_mib"] == 1000 + 3000
        assert done["hosts"]["gpu-a"]["freed_mib"] == 1000
        assert not alive(a_orphan) and not alive(b_orphan)
        assert alive(a_child) and alive(b_worker)

        code, again = reclaim(rig, test_hosts, capsys, "--yes")
        assert code == 0, again
        assert actions(again) == {("gpu-a", a_child): "keep", ("gpu-b", b_worker): "keep"}
        assert again["freed_mib"] == 0
    finally:
        for pid in started:
            if alive(pid):
                a.run_in_ns(f"kill -9 {pid}", check=False)
