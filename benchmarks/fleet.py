"""Fleet-scale benchmark (issue 9): `mgpu-provision facts`/`plan` against Ansible and the plain-SSH floor.

    .venv/bin/python benchmarks/fleet.py --hosts 1,8,32,64 --repeat 3

Starts the largest fleet of OpenSSH test hosts once (root, sshd and unshare needed; see tests/hosts.py),
then for each fleet size converges its hosts with `apply`, runs every contender once untimed and `--repeat`
times timed, alternating (the order rotates each round so no contender always follows the same one). Every
run opens cold connections. Writes `benchmarks/results/fleet.md` and `fleet.json` and prints the table.
Ansible comes from its own virtualenv (`.bench-venv`, see benchmarks/README.md), never the project's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from contenders import CONTENDERS, Contender, Fleet, select
from hotspots import profile_plan
from measure import GNU_TIME, run_together
from report import Sample, as_json, markdown, summarize
from testbed import REPO, Testbed, TestbedError

DEFAULT_ANSIBLE = REPO / ".bench-venv" / "bin" / "ansible"
DEFAULT_PY_SPY = REPO / ".bench-venv" / "bin" / "py-spy"
RESULTS = REPO / "benchmarks" / "results"
MAX_HOSTS = 254  # the harness takes every host's address from one 127.x.y.0/24
RUN_ENV = "MGPU_BENCH_RUN"  # the run's folder: the frozen package under code/, the fleet's files beside it


class BenchmarkError(Exception):
    """The benchmark cannot run or a run did not count; the message says why."""


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise BenchmarkError(
            f"--hosts wants comma-separated host counts, e.g. 1,8,32,64; got {text!r}"
        ) from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_HOSTS:
        raise BenchmarkError(f"--hosts: each count must be between 1 and {MAX_HOSTS}; got {text!r}")
    return sizes


def rotated(items: Sequence[Contender], by: int) -> list[Contender]:
    """The round's order: each round starts one contender later, so none always runs right after another."""
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def one_run(testbed: Testbed, fleet: Fleet, contender: Contender) -> Sample:
    testbed.mark_logs()
    usage = run_together(contender.spawns(fleet))
    problem = contender.problem(fleet, usage)
    if problem:
        raise BenchmarkError(f"{contender.name} on {len(fleet.hosts)} hosts: {problem}")
    channels = testbed.channels_since_mark(len(fleet.hosts))
    return Sample(
        contender=contender.name,
        hosts=len(fleet.hosts),
        wall_s=usage.wall_s,
        cpu_s=usage.cpu_s,
        peak_rss_kib=usage.peak_rss_kib,
        logins_per_host=channels.logins_per_host,
        commands_per_host=channels.commands_per_host,
    )


def measure(
    testbed: Testbed,
    sizes: Sequence[int],
    contenders: Sequence[Contender],
    repeat: int,
    say: Callable[[str], None],
) -> list[Sample]:
    samples: list[Sample] = []
    for size in sizes:
        say(f"{size:4d} hosts  converging them with apply")
        testbed.converge(size)
        fleet = testbed.fleet(size)
        for contender in contenders:  # warm-up: page cache, first-run caches; not recorded
            one_run(testbed, fleet, contender)
        for round_ in range(repeat):
            for contender in rotated(contenders, round_):
                sample = one_run(testbed, fleet, contender)
                samples.append(sample)
                say(f"{size:4d} hosts  round {round_ + 1}  {contender.name:8s} {sample.wall_s:7.2f} s")
    return samples


def _version(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except OSError as exc:
        return f"unavailable ({exc})"
    return ((done.stdout or done.stderr).strip().splitlines() or ["?"])[0]


def context(
    args: argparse.Namespace, sizes: Sequence[int], testbed: Testbed, load_before: float
) -> dict[str, object]:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "command": " ".join(["benchmarks/fleet.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "load_1m_before": load_before,
        "load_1m_after": os.getloadavg()[0],
        "hosts": list(sizes),
        "repeat": args.repeat,
        "smoke_python": "real torch: " + args.smoke_python if args.smoke_python else "stand-in torch",
        "git": _version(["git", "-C", str(REPO), "describe", "--always", "--dirty"]),
        "agent": testbed.agent_name,
        "openssh": _version(["ssh", "-V"]),
        "ansible": _version([args.ansible, "--version"]),
        "mgpu_provision": _version([testbed.mgpu_provision, "--version"]),
        "python": platform.python_version(),
    }


METHOD = """\
Every host is a real sshd on loopback (tests/hosts.py, one sshd per host in its own namespaces, clean HOME)
with a simulated 2x RTX 3090 twin, converged by `apply` for each fleet size and holding the cached agent.
Every contender runs the same agent `facts` request (the one `plan` sends) on every host over a cold
connection: `ssh` is one OpenSSH client per host, all in parallel (curve25519, no multiplexing), the floor;
`ansible` is `ansible all -m shell -f 64` (pipelining on, interpreter fixed), `ansible-raw` the same with
`-m raw`, both with the floor's ssh options and known_hosts (host keys checked); `facts` and `plan` are
`mgpu-provision <verb> --json`. Median of {repeat} alternating runs (the order rotates each round) after one
warm-up each. Client CPU and peak RSS come from GNU time around each client process (with its reaped
children; for `ssh`, CPU summed over the per-host clients and RSS of the largest). Logins and SSH commands
per host are counted in the hosts' sshd logs (LogLevel VERBOSE: one "Starting session" per command). The
hosts' agents and sshds run on the same CPUs as the clients, so node-side work is in every figure. plan's
torch check ran against {smoke_python}."""


def context_lines(info: dict[str, object]) -> list[str]:
    return [
        "# Fleet benchmark: gathering facts from N hosts",
        "",
        f"Measured {info['date_utc']} UTC with `{info['command']}` on {info['cpus']} CPUs ({info['cpu']}), "
        f"1-minute load average {info['load_1m_before']:.1f} before and {info['load_1m_after']:.1f} after; "
        f"git {info['git']} (package frozen at the start; {info['agent']}); {info['openssh']}; "
        f"{info['ansible']}; {info['mgpu_provision']}.",
        "",
        METHOD.format(repeat=info["repeat"], smoke_python=info["smoke_python"]),
    ]


def rerun_on_snapshot(argv: Sequence[str]) -> None:
    """Run this script again on a frozen copy of the package; never returns.

    The work tree may change while a run takes minutes. Then `apply` would have uploaded one agent, `plan`
    would upload another mid-run and the floor would run the first: PYTHONPATH puts the copy ahead of the
    editable install for this process and every client it starts.
    """
    run = Path(tempfile.mkdtemp(prefix="mgpu-bench-"))
    code = run / "code"
    shutil.copytree(
        REPO / "mgpu_provision", code / "mgpu_provision", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, RUN_ENV: str(run), "PYTHONPATH": path}
    os.execve(sys.executable, [sys.executable, __file__, *argv], env)


def say(line: str) -> None:
    """Progress goes to stderr, so stdout holds only the results page."""
    print(line, file=sys.stderr, flush=True)


def checked_arguments(args: argparse.Namespace) -> tuple[list[int], list[Contender]]:
    """The fleet sizes and contenders, after making sure every tool the run needs is there."""
    sizes = parse_sizes(args.hosts)
    if args.repeat < 1:
        raise BenchmarkError("--repeat must be at least 1")
    try:
        contenders = select([n.strip() for n in args.contenders.split(",") if n.strip()])
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None
    if args.profile and not os.access(args.py_spy, os.X_OK):
        raise BenchmarkError(f"no py-spy at {args.py_spy}: .bench-venv/bin/pip install py-spy")
    if not os.access(GNU_TIME, os.X_OK):
        raise BenchmarkError(f"no GNU time at {GNU_TIME} (it measures each client): apt-get install time")
    if any(c.name.startswith("ansible") for c in contenders) and not os.access(args.ansible, os.X_OK):
        raise BenchmarkError(
            f"no ansible at {args.ansible}: python3 -m venv .bench-venv && .bench-venv/bin/pip install "
            "ansible-core (or pass --ansible, or leave ansible out of --contenders)"
        )
    return sizes, contenders


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--hosts", default="1,8,32,64", help="comma-separated fleet sizes (default 1,8,32,64)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per contender and size (default 3)")
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help=f"subset of {','.join(CONTENDERS)} (default all)"
    )
    parser.add_argument("--ansible", default=str(DEFAULT_ANSIBLE), help="the ansible ad-hoc command")
    parser.add_argument(
        "--smoke-python",
        help="python with torch on the nodes for plan's torch check (default: a venv with a stand-in torch)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, profile one plan on the largest fleet with py-spy (writes plan-profile.md)",
    )
    parser.add_argument("--py-spy", default=str(DEFAULT_PY_SPY), help="the py-spy command (for --profile)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where fleet.md and fleet.json go")
    args = parser.parse_args(argv)
    # A user's machine keeps bytecode caches; a session that forbids them would have every client (and
    # the tool above all) recompile its modules on each run and measure that instead.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        sizes, contenders = checked_arguments(args)
        if RUN_ENV not in os.environ:
            rerun_on_snapshot(sys.argv[1:] if argv is None else argv)
        args.out.mkdir(parents=True, exist_ok=True)
        run = Path(os.environ[RUN_ENV])
        try:
            load_before = os.getloadavg()[0]
            testbed = Testbed(run, max(sizes), Path(sys.executable).parent, args.ansible, args.smoke_python)
            try:
                say(f"{len(testbed.hosts)} test hosts up")
                samples = measure(testbed, sizes, contenders, args.repeat, say)
                info = context(args, sizes, testbed, load_before)
                if args.profile:
                    say(f"profile: {profile_plan(testbed.fleet(sizes[-1]), args.py_spy, args.out)}")
            finally:
                testbed.close()
        finally:
            shutil.rmtree(run, ignore_errors=True)
    except (BenchmarkError, TestbedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = summarize(samples)
    page = markdown(rows, context_lines(info))
    (args.out / "fleet.md").write_text(page)
    (args.out / "fleet.json").write_text(json.dumps(as_json(samples, rows, info), indent=2) + "\n")
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
