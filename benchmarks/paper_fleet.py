"""10,000 hosts on paper (issue 32): the control side of `plan` over fake sessions at the transport seam.

    .venv/bin/python benchmarks/paper_fleet.py                    # 100, 1,000 and 10,000 hosts
    .venv/bin/python benchmarks/paper_fleet.py --sizes 1000 --delay 0.25
    .venv/bin/python benchmarks/paper_fleet.py --seam batch --sizes 1000,10000,20000   # issue 41

`--seam batch` replaces the batch seam instead (`fleet.pool.call_many`, what `--via clush` implements):
one call answers every host after the delay, as ClusterShell's tree does, and the control side's CPU and
memory above it are what is left to measure (the tree's own head and gateway CPU per host are measured on
real sshds by benchmarks/fleet.py's `clush-tree`). Its page is `results/paper-fleet-batch.md`.

No sshd and no agent process: `fleet.session.open_session` is replaced by a session whose command waits a
fixed delay (a login and the agent's facts call, as the one-host floor takes them) and answers a facts
reply recorded at the start from the real agent on the simulated twin. Everything above the seam is the
real code: the rig loaded from its file, `plan_fleet` (the worker pool, `read_facts`'s validation against
the Facts contract, `plan_host` with its rendered files) and the `--json` view (`plan_json`). Each size runs
in a fresh process, so its peak RSS is its own. Writes `results/paper-fleet.md` and `.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))

TWIN = REPO / "mgpu_provision" / "demo" / "twin-rtx3090-nvlink.yaml"
DEFAULT_SIZES = "100,1000,10000"
DEFAULT_DELAY_S = 0.25  # the OpenSSH floor at one host on this machine: one cold login and one facts call
# The same rig type as the fleet benchmark (testbed.RIG), one DDP group per 64 hosts so that the launchers
# name groups of a realistic size.
RIG_TYPE = {
    "gpus": {"model": "NVIDIA GeForce RTX 3090", "count": 2},
    "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
    "driver": {"version": "550.54.15", "method": "apt", "hold": True, "reboot": "never"},
    "visible_devices": [0, 1],
}
GROUP = 64


def write_rig(folder: Path, count: int) -> Path:
    """A rig file of `count` hosts on 127.x addresses (never contacted), in DDP groups of GROUP; no twin
    (no agent runs: the recorded reply comes from the twin)."""
    rigs: dict[str, Any] = {}
    hosts = []
    for i in range(count):
        group, name = i // GROUP, f"h{i + 1:05d}"
        rig = f"bench{group:03d}"
        if rig not in rigs:
            ddp = {"master": name, "port": 29500, "backend": "gloo", "nproc_per_node": 2, "ifname": "lo"}
            rigs[rig] = {**RIG_TYPE, "ddp": ddp}
        address = f"127.{1 + i // 65025}.{(i // 255) % 255}.{i % 255 + 1}"
        hosts.append({"name": name, "address": address, "rig": rig})
    path = folder / f"paper-{count}.yaml"
    # JSON is YAML; compact, so that 10,000 hosts stay under the loader's 1 MiB limit for a rig file
    path.write_text(json.dumps({"version": 1, "hosts": hosts, "rigs": rigs}, separators=(",", ":")))
    return path


def record_reply(rig: Path) -> str:
    """The real agent's stdout for the first host's facts request, run once on the simulated twin."""
    from mgpu_provision.fleet.bundle import build_agent
    from mgpu_provision.fleet.session import agent_command
    from mgpu_provision.plan.host import facts_request

    loaded, _ = load_past_limits(rig)
    host = loaded.spec.hosts[0]
    bundle = build_agent()
    with tempfile.TemporaryDirectory() as home:
        cache = Path(home) / ".cache" / "mgpu-provision"
        cache.mkdir(parents=True)
        (cache / bundle.name).write_bytes(bundle.data)
        command = agent_command(bundle.name, sys.executable, "facts", sudo=False)
        request = json.dumps({"args": facts_request(loaded, host), "simulate": str(TWIN)})
        env = {**os.environ, "HOME": home}
        done = subprocess.run(
            ["sh", "-c", command], input=request, capture_output=True, text=True, env=env, check=True
        )
    return done.stdout


def load_past_limits(rig: Path) -> tuple[Any, str]:
    """The loaded rig, and how: the loader, or, where the file is past the loader's size limits (a rig file
    is for people: 1 MiB, 20,000 YAML values), the same models validating the same data (no rules)."""
    from mgpu_provision.errors import SpecError
    from mgpu_provision.rig.loader import load_rig
    from mgpu_provision.rig.models import RigFile
    from mgpu_provision.rig.rig import LoadedRig

    try:
        return load_rig(rig), "the loader"
    except SpecError as exc:
        limit = next((p.message for p in exc.problems if "a rig file is" in p.message), None)
        if limit is None:
            raise
    spec = RigFile.model_validate(json.loads(rig.read_text()))
    return LoadedRig(path=rig, base_dir=rig.parent, spec=spec), f"the models (the loader refused: {limit})"


def one_size(rig: Path, reply: str, delay_s: float, forks: int, seam: str = "session") -> dict[str, Any]:
    """Load, plan and render `rig` over fake sessions (or one fake batch call) in this process."""
    from mgpu_provision.commands.plan_view import plan_json
    from mgpu_provision.fleet import session
    from mgpu_provision.fleet.options import FleetOptions
    from mgpu_provision.fleet.pool import HostOutcome
    from mgpu_provision.fleet.targets import targets_for
    from mgpu_provision.jobs import plan as plan_job
    from mgpu_provision.jobs.plan import plan_fleet

    class RecordedSession(session.AgentSession):
        """Answers every command with the recorded reply after the fixed delay: a host at the seam."""

        def _needs_sudo(self) -> bool:
            return False

        def _run(self, command: str, stdin: str, limit: float, verb: str) -> tuple[int, str, str]:
            self.commands += 1
            time.sleep(delay_s)
            return 0, reply, ""

        def _upload(self, folder: str) -> None:
            raise AssertionError("the recorded host already has the agent")

    def recorded_batch(
        targets: list[Any], verb: str, requests: dict[str, Any], options: Any, timeout: float | None = None
    ) -> dict[str, HostOutcome[dict[str, Any]]]:
        time.sleep(delay_s)  # every host at once, as one ClusterShell run
        return {
            t.name: HostOutcome("ok", session.parse_response(t.name, verb, 0, reply, ""), None, delay_s)
            for t in targets
        }

    if seam == "batch":
        plan_job.call_many = recorded_batch  # type: ignore[assignment]  # the batch seam
    else:
        session.open_session = lambda target, options, agent: RecordedSession(target, agent)  # the seam
    cpu0, wall0 = time.process_time(), time.perf_counter()
    loaded, loaded_by = load_past_limits(rig)
    targets = targets_for(loaded, list(loaded.spec.hosts))
    cpu1, wall1 = time.process_time(), time.perf_counter()
    plan = plan_fleet(loaded, targets, FleetOptions(forks=forks))
    cpu2, wall2 = time.process_time(), time.perf_counter()
    view = json.dumps(plan_json(plan))
    cpu3, wall3 = time.process_time(), time.perf_counter()
    hosts = len(targets)
    ok = sum(1 for h in plan.hosts if h.status == "ok")
    if ok != hosts:
        failed = next(h for h in plan.hosts if h.status != "ok")
        raise SystemExit(f"{failed.host}: {failed.status}: {failed.error}")
    return {
        "hosts": hosts,
        "forks": forks,
        "delay_s": delay_s,
        "load_s": {"cpu": cpu1 - cpu0, "wall": wall1 - wall0},
        "plan_fleet_s": {"cpu": cpu2 - cpu1, "wall": wall2 - wall1},
        "view_s": {"cpu": cpu3 - cpu2, "wall": wall3 - wall2, "bytes": len(view)},
        # The pool's own bound (every worker waiting on hosts), or the one batch call's.
        "floor_wall_s": delay_s if seam == "batch" else -(-hosts // forks) * delay_s,
        "seam": seam,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": forks,
        "loaded_by": loaded_by,
    }


def per_host_ms(row: dict[str, Any], part: str) -> float:
    return 1000 * float(row[part]["cpu"]) / int(row["hosts"])


def markdown(rows: list[dict[str, Any]], context: dict[str, Any]) -> str:
    title = (
        "one fake batch call at the batch seam (fleet.pool.call_many)"
        if rows[0].get("seam") == "batch"
        else "fake sessions at the transport seam"
    )
    waits = "The one batch call waits" if rows[0].get("seam") == "batch" else "Each session waits"
    lines = [
        f"# {rows[-1]['hosts']:,} hosts on paper: plan's control side over {title}",
        "",
        f"Measured {context['date_utc']} UTC with `{context['command']}` on {context['cpus']} CPUs, 1-minute "
        f"load average {context['load_before']:.1f} before and {context['load_after']:.1f} after; git "
        f"{context['git']}. {waits} {rows[0]['delay_s']:g} s and answers the real agent's facts "
        'reply recorded at the start (benchmarks/README.md, "10,000 hosts on paper"); the rig file, the '
        "pool, facts validation, plan_host and the JSON view are the real code. CPU is this process's.",
        "",
        "| hosts | forks | load rig: CPU s (ms/host) | plan_fleet: wall s (pool floor s) | plan_fleet: CPU s "
        "(ms/host) | JSON view: CPU s (MiB) | peak RSS MiB (KiB/host) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['hosts']:,} | {row['forks']} "
            f"| {row['load_s']['cpu']:.2f} ({per_host_ms(row, 'load_s'):.2f}) "
            f"| {row['plan_fleet_s']['wall']:.1f} ({row['floor_wall_s']:.1f}) "
            f"| {row['plan_fleet_s']['cpu']:.2f} ({per_host_ms(row, 'plan_fleet_s'):.2f}) "
            f"| {row['view_s']['cpu']:.2f} ({row['view_s']['bytes'] / 2**20:.1f}) "
            f"| {row['peak_rss_mib']:.0f} ({1024 * row['peak_rss_mib'] / row['hosts']:.0f}) |"
        )
    lines.append("")
    lines += [
        f"- {row['hosts']:,} hosts loaded by {row['loaded_by']}"
        for row in rows
        if row["loaded_by"] != "the loader"
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"host counts (default {DEFAULT_SIZES})")
    parser.add_argument("--delay", type=float, default=DEFAULT_DELAY_S, help="seconds each host takes")
    parser.add_argument("--forks", type=int, default=64, help="plan's --forks (default and most: 64)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--seam", choices=("session", "batch"), default="session", help="what is faked")
    parser.add_argument("--one", nargs=2, metavar=("RIG", "REPLY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a child: one size, its figures as JSON on stdout
        rig, reply = Path(args.one[0]), Path(args.one[1]).read_text()
        print(json.dumps(one_size(rig, reply, args.delay, args.forks, args.seam)))
        return 0
    started, load_before = time.time(), os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="mgpu-paper-") as tmp:
        folder = Path(tmp)
        sizes = sorted(int(s) for s in args.sizes.split(","))
        rigs = {size: write_rig(folder, size) for size in sizes}
        reply = folder / "reply.json"
        reply.write_text(record_reply(rigs[sizes[0]]))
        for size in sizes:
            argv = [sys.executable, __file__, "--delay", str(args.delay), "--forks", str(args.forks)]
            argv += ["--seam", args.seam]
            done = subprocess.run(
                [*argv, "--one", str(rigs[size]), str(reply)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            rows.append(json.loads(done.stdout))
            print(f"{size} hosts: {rows[-1]}", file=sys.stderr)
    git = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    context = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "command": " ".join(["benchmarks/paper_fleet.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "duration_s": round(time.time() - started),
        "git": git,
    }
    page = markdown(rows, context)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "paper-fleet-batch" if args.seam == "batch" else "paper-fleet"
    (args.out / f"{stem}.md").write_text(page)
    (args.out / f"{stem}.json").write_text(
        json.dumps({"context": context, "rows": rows}, indent=2) + "\n"
    )
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
