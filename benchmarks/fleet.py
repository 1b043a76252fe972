"""Fleet-scale benchmark (issues 9, 20, 32, 41): `mgpu-provision` against the plain-SSH floor and its peers.

    .venv/bin/python benchmarks/fleet.py                 # every issue 20 target, ~20-30 min on 2 busy cores
    .venv/bin/python benchmarks/fleet.py --quick         # 1 and 8 hosts, one round: proves the harness

Starts the largest fleet of OpenSSH test hosts once, in two racks of network namespaces behind a gateway
each (root, sshd, unshare, ip and iptables needed; see testbed.py). Then, in one run: the one-process
figures (the agent's facts call on a simulated node, what `plan` imports, `validate`); `smoke`'s start-up
against its floor on small fleets (real torch, Gloo); and for each fleet size, after converging its hosts
with `apply`, every contender (`ssh` floor, `plan`, `apply` with nothing to do, optionally `facts`,
ClusterShell flat and through the gateways, plain Fabric, pyinfra and Ansible) `--repeat` times,
alternating (the order rotates each round so no contender always follows the same one). Every run opens
cold connections. Writes `benchmarks/results/fleet.md` and `fleet.json` and prints the page, issue 41's
targets judged at its head. The peers come from their own virtualenv (see benchmarks/README.md), never the
project's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from contenders import CONTENDERS, SMOKE, SMOKE_FLOOR, Contender, Fleet, select
from hotspots import profile_plan
from measure import GNU_TIME, Usage, run_together
from report import HALVED, Sample, Singles, as_json, markdown, summarize
from single import agent_cost, startup_figures
from smoke_clock import parse_clock, start_up
from testbed import MAX_HOSTS, REPO, SmokeSetup, Testbed, TestbedError, hosts_needed

# The peers and py-spy live in a virtualenv of their own, outside the checkout (benchmarks/README.md).
BENCH_VENV = Path(os.environ.get("MGPU_BENCH_VENV", "/var/cache/mgpu-provision-tests/bench-venv"))
DEFAULT_ANSIBLE = BENCH_VENV / "bin" / "ansible"
DEFAULT_PYINFRA = BENCH_VENV / "bin" / "pyinfra"
DEFAULT_PY_SPY = BENCH_VENV / "bin" / "py-spy"
FABRIC_VERSION = (
    "import fabric, paramiko; print('Fabric', fabric.__version__, 'Paramiko', paramiko.__version__)"
)
BENCH_VENV_SETUP = (
    f"python3 -m venv {BENCH_VENV} && {BENCH_VENV}/bin/pip install ansible-core 'pyinfra>=3,<4' py-spy"
)
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_SIZES = "1,8,64,128,256"
DEFAULT_CONTENDERS = "ssh,ssh-64,plan,apply"
DEFAULT_SMOKE_SIZES = "1,2"
QUICK = {"hosts": "1,8", "repeat": 1, "smoke_hosts": "1"}
# Below this size each contender gets an untimed warm-up run; from it on, the converging `apply` and `plan`
# runs have already warmed hosts and client, and a warm-up of every contender would add minutes.
WARM_UP_BELOW = 64
RANKS_PER_HOST = 2  # the benchmark rig's ddp.nproc_per_node
EXAMPLE = "examples/rtx3090-workstation.yaml"  # validate's example
# Per host, the benchmark holds 4 files per `ssh` client at once (stdin, stdout, stderr, GNU time's report)
# and plan's client one socket per host; leave room for everything else.
FILES_PER_HOST = 8
RUN_ENV = "MGPU_BENCH_RUN"  # the run's folder: the frozen package under code/, the fleet's files beside it


class BenchmarkError(Exception):
    """The benchmark cannot run or a run did not count; the message says why."""


def parse_sizes(text: str, option: str = "--hosts") -> list[int]:
    if option != "--hosts" and text.strip() == "none":
        return []
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise BenchmarkError(
            f"{option} wants comma-separated host counts, e.g. 1,8,64; got {text!r}"
        ) from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_HOSTS:
        raise BenchmarkError(f"{option}: each count must be between 1 and {MAX_HOSTS}; got {text!r}")
    return sizes


def rotated(items: Sequence[Contender], by: int) -> list[Contender]:
    """The round's order: each round starts one contender later, so none always runs right after another."""
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def checked_run(testbed: Testbed, fleet: Fleet, contender: Contender) -> tuple[Usage, Sample]:
    testbed.mark_logs()
    usage = run_together(contender.spawns(fleet), contender.at_once)
    problem = contender.problem(fleet, usage)
    if problem:
        raise BenchmarkError(f"{contender.name} on {len(fleet.hosts)} hosts: {problem}")
    gateway_cpu = testbed.gateway_cpu_since_mark()  # once the gateways are done: the logs are complete
    channels = testbed.channels_since_mark([h.name for h in fleet.hosts])
    return usage, Sample(
        contender=contender.name,
        hosts=len(fleet.hosts),
        wall_s=usage.wall_s,
        cpu_s=usage.cpu_s,
        peak_rss_kib=usage.peak_rss_kib,
        logins_per_host=channels.logins_per_host,
        commands_per_host=channels.commands_per_host,
        node_logins_from=channels.node_logins_from,
        gateway_logins=channels.gateway_logins,
        gateway_cpu_s=gateway_cpu,
    )


def contenders_for(size: int, contenders: Sequence[Contender]) -> list[Contender]:
    """A bounded contender with room for every host is the unbounded one again: it is not run twice."""
    return [c for c in contenders if c.at_once is None or c.at_once < size]


def one_run(testbed: Testbed, fleet: Fleet, contender: Contender) -> Sample:
    return checked_run(testbed, fleet, contender)[1]


def smoke_run(testbed: Testbed, setup: SmokeSetup, contender: Contender) -> Sample:
    """One run of smoke or its floor; smoke's start-up comes from the clock its processes wrote."""
    setup.clock.write_text("")
    usage, sample = checked_run(testbed, setup.fleet, contender)
    if contender is SMOKE_FLOOR:
        return dataclasses.replace(sample, startup_s=sample.wall_s)
    ranks = RANKS_PER_HOST * len(setup.fleet.hosts)
    events = parse_clock(setup.clock.read_text())
    try:
        timing = start_up(events, usage.started_at, ranks)
    except ValueError as exc:
        raise BenchmarkError(f"smoke on {len(setup.fleet.hosts)} hosts: {exc}") from None
    zero = usage.started_at
    timeline = tuple(
        (e.kind, e.pid, e.rank, round(e.begin - zero, 3), round(e.end - zero, 3)) for e in events
    )
    return dataclasses.replace(sample, startup_s=timing.overhead_s, torch_s=timing.torch_s, timeline=timeline)


def measure_smoke(
    testbed: Testbed, sizes: Sequence[int], repeat: int, say: Callable[[str], None]
) -> list[Sample]:
    samples: list[Sample] = []
    pair: list[Contender] = [SMOKE_FLOOR, SMOKE]
    for size in sizes:
        say(f"{size:4d} hosts  smoke: converging them for a real-torch run")
        setup = testbed.smoke_setup(size)
        for contender in pair:
            smoke_run(testbed, setup, contender)
        for round_ in range(repeat):
            for contender in rotated(pair, round_):
                sample = smoke_run(testbed, setup, contender)
                samples.append(sample)
                say(
                    f"{size:4d} hosts  round {round_ + 1}  {contender.name:11s} {sample.wall_s:7.2f} s"
                    + (f" (start-up {sample.startup_s:.2f} s less torch)" if contender is SMOKE else "")
                )
    return samples


def measure_singles(testbed: Testbed, runs: int, say: Callable[[str], None]) -> Singles:
    """The one-process figures: the agent's call on the first host, converged as a fleet of one, and
    startup.py's figures of the frozen package."""
    testbed.converge(1)
    prefix, python, agent, request = testbed.agent_call()
    call = agent_cost(prefix, python, agent, request, runs)
    code = Path(os.environ[RUN_ENV]) / "code"
    found = startup_figures(code, python, EXAMPLE, runs)
    figures = found.figures
    say(
        f"agent facts {call.facts_cpu_s.median * 1000:.0f} ms CPU (python start-up "
        f"{call.python_start_cpu_s.median * 1000:.0f} ms); import commands.plan "
        f"{figures['import_commands_plan_ms'].best:.0f} ms; validate {figures['validate_wall_s'].best:.3f} s"
    )
    return Singles(
        agent_facts_cpu_s=call.facts_cpu_s.median,
        agent_facts_wall_s=call.facts_wall_s.median,
        python_start_cpu_s=call.python_start_cpu_s.median,
        import_ms=figures["import_commands_plan_ms"].median,
        import_best_ms=figures["import_commands_plan_ms"].best,
        plan_run_imports_ms=figures["plan_json_run_imports_ms"].median,
        plan_run_imports_best_ms=figures["plan_json_run_imports_ms"].best,
        plan_loads=tuple(found.plan_loads),
        validate_wall_s=figures["validate_wall_s"].median,
        validate_best_wall_s=figures["validate_wall_s"].best,
        validate_cpu_s=figures["validate_cpu_s"].median,
        plan_local_wall_s=figures["plan_local_wall_s"].median,
        plan_local_best_wall_s=figures["plan_local_wall_s"].best,
        plan_local_cpu_s=figures["plan_local_cpu_s"].median,
    )


def startup_against(baseline: str, runs: int, say: Callable[[str], None]) -> Singles:
    """startup.py on `baseline` (a git ref of this repository) and the frozen package, alternating in this
    run: the issue 32 figures that must halve, best of `runs` of each copy."""
    run = Path(os.environ[RUN_ENV])
    folder = run / "baseline"
    folder.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", baseline, "mgpu_provision"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise BenchmarkError(f"git archive {baseline}: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    code = run / "code"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "startup.py"),
            "--code",
            str(folder),
            str(code),
            "--repeat",
            str(runs),
            "--example",
            EXAMPLE,
        ],
        capture_output=True,
        text=True,
        cwd=run,
        check=False,
    )
    if done.returncode != 0:
        raise BenchmarkError(f"startup.py against {baseline} failed: {done.stderr[-2000:]}")
    figures = json.loads(done.stdout)
    old, new = figures[str(folder)], figures[str(code)]
    pairs = tuple(
        (name, old[name]["min"], new[name]["min"]) for name in HALVED if name in old and name in new
    )
    say("start-up against " + baseline + ": " + ", ".join(f"{n} {o:g} -> {w:g}" for n, o, w in pairs))
    (run / "startup.json").write_text(done.stdout)
    return Singles(startup_pairs=pairs, baseline=baseline)


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
        here = contenders_for(size, contenders)
        if size < WARM_UP_BELOW:
            for contender in here:  # warm-up: page cache, first-run caches; not recorded
                one_run(testbed, fleet, contender)
        for round_ in range(repeat):
            for contender in rotated(here, round_):
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
    args: argparse.Namespace,
    sizes: Sequence[int],
    smoke_sizes: Sequence[int],
    testbed: Testbed,
    load_before: float,
    started: float,
) -> dict[str, object]:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "duration_s": round(time.time() - started),
        "command": " ".join(["benchmarks/fleet.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "open_files_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "load_1m_before": load_before,
        "load_1m_after": os.getloadavg()[0],
        "hosts": list(sizes),
        "smoke_hosts": list(smoke_sizes),
        "repeat": args.repeat,
        "smoke_python": "real torch: " + args.smoke_python if args.smoke_python else "stand-in torch",
        "git": _version(["git", "-C", str(REPO), "describe", "--always", "--dirty"]),
        "package_commit": package_commit(),
        "agent": testbed.agent_name,
        "openssh": _version(["ssh", "-V"]),
        "ansible": _version([args.ansible, "--version"]),
        "pyinfra": _version([args.pyinfra, "--version"]),
        "fabric": _version([sys.executable, "-c", FABRIC_VERSION]),
        "mgpu_provision": _version([testbed.mgpu_provision, "--version"]),
        "python": platform.python_version(),
    }


def package_commit() -> str:
    """The last commit that changed the package, and whether the frozen copy had uncommitted edits: the
    code measured (the repository's own state also counts benchmarks/ and docs)."""
    last = _version(["git", "-C", str(REPO), "log", "-1", "--format=%h %s", "--", "mgpu_provision"])
    edits = _version(["git", "-C", str(REPO), "status", "--porcelain", "--", "mgpu_provision"])
    return last + ("" if edits == "?" else " (with uncommitted edits)")


METHOD = """\
Every host is a real sshd (tests/support/hosts.py, one sshd per host in its own namespaces, clean HOME) with a
simulated 2x RTX 3090 twin, converged by `apply` for each fleet size and holding the cached agent. The hosts
alternate between 2 racks, network namespaces each behind a gateway of its own (tests/support/netns.py): every
contender but `clush-tree` runs in a client namespace linked to every rack; `clush-tree` runs in a head
namespace linked only to the 2 gateways (no route to a rack, and each rack's firewall admits SSH from its
gateway and the flat client only). Every contender runs the same agent `facts` request (the one `plan` sends)
on every host over a cold connection: `ssh` is one OpenSSH client per host, all in parallel (curve25519, no
multiplexing), the floor; `facts` and `plan` are `mgpu-provision <verb> --json`, `clush` the same plan `--via
clush` (ClusterShell, flat: one OpenSSH client per host), `clush-tree` that plan with `--topology` (head -> 2
gateways -> the hosts of their racks); `apply` is `mgpu-provision apply --yes --json` on the converged fleet
(it reads every host's facts, finds nothing to do and contacts no host again, so its floor is the same `ssh`
floor); `ansible` (when run) is `ansible all -m shell -f 64` (pipelining on, interpreter fixed), `ansible-raw`
the same with `-m raw`; `fabric` is plain Fabric's `ThreadingGroup.run` of the command (one thread and
Paramiko connection per host: the floor of a tool on that library), `pyinfra` is `pyinfra INVENTORY exec -y
--parallel 64 --` (pyinfra 3, its own venv); both check host keys against the same file.
Median of {repeat} alternating runs (the order rotates each round), after one warm-up each below {warm_up}
hosts (from {warm_up} on, converging warmed hosts and client).
Client CPU is each client process's rusage from `wait4`, in microseconds (with its reaped children), less the
cost of the namespace prefix and GNU time around it (measured in the same run); peak RSS comes from GNU time
(for `ssh`, CPU summed over the per-host clients and RSS of the largest). Logins and SSH commands per host
are counted in the hosts' sshd logs (LogLevel VERBOSE), with the address each login came from (and the
gateways' logs: the tree's head logs in only there); the gateways' CPU comes from GNU time around
ClusterShell's gateway (its `CLUSTERSHELL_GW_PYTHON_EXECUTABLE`). The hosts' agents and sshds run on the
same CPUs as the clients, so node-side work is in every figure. plan's torch check ran against
{smoke_python}; `smoke` runs real torch (this venv's, Gloo on loopback, 2 ranks per host) and a
`sitecustomize` hook on the smoke python's PYTHONPATH notes when each of its processes started and imported
torch (smoke_clock.py)."""


def context_lines(info: dict[str, object]) -> list[str]:
    return [
        "# Fleet benchmark: gathering facts from N hosts, apply with nothing to do, smoke start-up",
        "",
        f"Measured {info['date_utc']} UTC with `{info['command']}` on {info['cpus']} CPUs ({info['cpu']}, "
        f"{info['memory_gib']} GiB), 1-minute load average {info['load_1m_before']:.1f} before and "
        f"{info['load_1m_after']:.1f} after; the run took {info['duration_s']} s; git {info['git']}, the "
        f"package last changed in {info['package_commit']}, frozen at the start ({info['agent']}); "
        f"{info['openssh']}; "
        f"{info['mgpu_provision']}; open files limit {info['open_files_limit']}.",
    ]


def method_lines(info: dict[str, object]) -> list[str]:
    return [METHOD.format(repeat=info["repeat"], smoke_python=info["smoke_python"], warm_up=WARM_UP_BELOW)]


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
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    print(f"{stamp} {line}", file=sys.stderr, flush=True)


def raise_open_files(hosts: int) -> None:
    """Raise this process's open-files limit to what `hosts` clients need (inherited by every client), as
    far as the hard limit allows; say plainly when the machine does not allow enough."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1024 + FILES_PER_HOST * hosts
    if soft >= wanted:
        return
    if hard != resource.RLIM_INFINITY and hard < wanted:
        raise BenchmarkError(
            f"{hosts} hosts need about {wanted} open files, and the hard limit is {hard}: "
            "raise it (ulimit -Hn)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def checked_arguments(args: argparse.Namespace) -> tuple[list[int], list[int], list[Contender]]:
    """The fleet sizes, smoke sizes and contenders, after making sure every tool the run needs is there."""
    if args.quick:
        args.hosts, args.repeat, args.smoke_hosts = QUICK["hosts"], QUICK["repeat"], QUICK["smoke_hosts"]
    sizes = parse_sizes(args.hosts)
    smoke_sizes = parse_sizes(args.smoke_hosts, "--smoke-hosts")
    if args.repeat < 1:
        raise BenchmarkError("--repeat must be at least 1")
    try:
        contenders = select([n.strip() for n in args.contenders.split(",") if n.strip()])
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None
    if args.profile and not os.access(args.py_spy, os.X_OK):
        raise BenchmarkError(f"no py-spy at {args.py_spy}: {BENCH_VENV_SETUP}")
    if not os.access(GNU_TIME, os.X_OK):
        raise BenchmarkError(f"no GNU time at {GNU_TIME} (it measures each client): apt-get install time")
    for peer, command in (("ansible", args.ansible), ("pyinfra", args.pyinfra)):
        if any(c.name.startswith(peer) for c in contenders) and not os.access(command, os.X_OK):
            raise BenchmarkError(
                f"no {peer} at {command}: {BENCH_VENV_SETUP} (or pass --{peer}, or leave {peer} out of "
                "--contenders)"
            )
    return sizes, smoke_sizes, contenders


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--hosts", default=DEFAULT_SIZES, help=f"comma-separated fleet sizes (default {DEFAULT_SIZES})"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per contender and size (default 3)")
    parser.add_argument(
        "--contenders",
        default=DEFAULT_CONTENDERS,
        help=f"subset of {','.join(CONTENDERS)} (default {DEFAULT_CONTENDERS})",
    )
    parser.add_argument(
        "--smoke-hosts",
        default=DEFAULT_SMOKE_SIZES,
        help=f"fleet sizes for smoke's start-up, or none (default {DEFAULT_SMOKE_SIZES})",
    )
    parser.add_argument(
        "--singles-runs", type=int, default=7, help="runs of each one-process figure (median; default 7)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"hosts {QUICK['hosts']}, repeat {QUICK['repeat']}, smoke on {QUICK['smoke_hosts']} host(s)",
    )
    parser.add_argument("--ansible", default=str(DEFAULT_ANSIBLE), help="the ansible ad-hoc command")
    parser.add_argument("--pyinfra", default=str(DEFAULT_PYINFRA), help="the pyinfra command")
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
    parser.add_argument(
        "--startup-baseline",
        metavar="REF",
        help="also run startup.py on REF's package beside this one (issue 32's halved start-up)",
    )
    args = parser.parse_args(argv)
    # A user's machine keeps bytecode caches; a session that forbids them would have every client (and
    # the tool above all) recompile its modules on each run and measure that instead.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.time()
    startup_json: object = None
    try:
        sizes, smoke_sizes, contenders = checked_arguments(args)
        if RUN_ENV not in os.environ:
            rerun_on_snapshot(sys.argv[1:] if argv is None else argv)
        raise_open_files(max(sizes))
        args.out.mkdir(parents=True, exist_ok=True)
        run = Path(os.environ[RUN_ENV])
        try:
            load_before = os.getloadavg()[0]
            largest = hosts_needed(sizes, smoke_sizes)
            testbed = Testbed(
                run, largest, Path(sys.executable).parent, args.ansible, args.smoke_python, args.pyinfra
            )
            try:
                say(f"{len(testbed.hosts)} test hosts up ({time.time() - started:.0f} s)")
                singles = measure_singles(testbed, args.singles_runs, say)
                if args.startup_baseline:
                    against = startup_against(args.startup_baseline, args.singles_runs, say)
                    singles = dataclasses.replace(
                        singles, startup_pairs=against.startup_pairs, baseline=against.baseline
                    )
                    startup_json = json.loads((run / "startup.json").read_text())
                samples = measure_smoke(testbed, smoke_sizes, args.repeat, say)
                samples += measure(testbed, sizes, contenders, args.repeat, say)
                info = context(args, sizes, smoke_sizes, testbed, load_before, started)
                if args.profile:
                    say(f"profile: {profile_plan(testbed.fleet(sizes[-1]), args.py_spy, args.out)}")
            finally:
                testbed.close()
        finally:
            shutil.rmtree(run, ignore_errors=True)
    except (BenchmarkError, TestbedError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = summarize(samples)
    page = markdown(rows, context_lines(info), singles, method_lines(info))
    (args.out / "fleet.md").write_text(page)
    (args.out / "fleet.json").write_text(json.dumps(as_json(samples, rows, info, singles), indent=2) + "\n")
    if args.startup_baseline:
        (args.out / "fleet-startup.json").write_text(json.dumps(startup_json, indent=2) + "\n")
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
