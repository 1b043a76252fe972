"""Many hosts through ClusterShell's tree (issue 41): head → 2 gateways → racks, at the batch seam.

    .venv/bin/python benchmarks/clush_tree.py --hosts 64,256,1024

The lab is tests/support/netns.py's: the head, 2 gateways and 2 racks in network namespaces of their own,
so the head reaches the nodes only through the gateways. As ClusterShell's own tests do, the N hosts are
ssh_config aliases onto a few real sshds per rack (4), each host a name of its own with its own OpenSSH
login and its own reply; the agent is the tests' small protocol-speaking zipapp (fleet layer only, not the
agent's facts). Each size runs `fleet.clush.call_many_clush` once in a fresh process in the head's
namespace (the agent already cached on every node by a first run) and reports the wall, the head's CPU
(itself and its OpenSSH clients to the gateways), each gateway's CPU (its ClusterShell gateway and its
OpenSSH clients, from /proc of the gateway's namespace) and the peak RSS of the head process. Writes
`results/clush-tree.md` and `.json`, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))
SSHDS_PER_RACK = 4


def head(spec: dict[str, Any]) -> dict[str, Any]:
    """One run on the head (called in its namespace): every host's reply through the gateways."""
    from mgpu_provision.fleet.clush import call_many_clush
    from mgpu_provision.fleet.options import FleetOptions
    from mgpu_provision.fleet.targets import HostTarget
    from tests.support.hosts import fake_agent

    targets = [
        HostTarget(
            name=name,
            address=address,
            port=2222,
            user="root",
            identity_file=spec["key"],
            jump=None,
            become=False,
            python=sys.executable,
            connection="ssh",
            simulate=None,
            connect_timeout_s=10.0,
            command_timeout_s=120.0,
        )
        for name, address in spec["hosts"].items()
    ]
    options = FleetOptions(
        forks=64,
        known_hosts=Path(spec["known"]),
        ssh_config=Path(spec["ssh_config"]),
        topology=Path(spec["topology"]),
    )
    started, cpu = time.monotonic(), _cpu_self()
    outcomes = call_many_clush(targets, "facts", {t.name: {"n": 1} for t in targets}, options, fake_agent())
    wall = time.monotonic() - started
    replies = sum(
        1 for o in outcomes.values() if o.status == "ok" and o.value and o.value["args"] == {"n": 1}
    )
    errors = sorted({o.error for o in outcomes.values() if o.error})[:3]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "wall_s": wall,
        "head_cpu_s": _cpu_self() - cpu,
        "replies": replies,
        "errors": errors,
        "rss_mib": peak,
    }


def _cpu_self() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


GATEWAY_WRAPPER = """#!{python}
import resource, signal, socket, subprocess, sys
# The gateway's sshd session hangs up on it when the head ends the channel; this parent stays to count it.
signal.signal(signal.SIGHUP, signal.SIG_IGN)
default = lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)
child = subprocess.Popen([{python!r}, *sys.argv[1:]], preexec_fn=default)
child.wait()
used = resource.getrusage(resource.RUSAGE_CHILDREN)
with open({log!r}, "a") as log:
    log.write(socket.gethostname() + " " + str(used.ru_utime + used.ru_stime) + "\\n")
"""


def _gateway_cpu(log: Path, gateways: int) -> list[float]:
    """Each gateway's CPU seconds, as its wrappers wrote them."""
    totals = [0.0] * gateways
    for line in log.read_text().splitlines() if log.exists() else []:
        name, seconds = line.split()
        totals[int(name.removeprefix("gw")) - 1] += float(seconds)
    return totals


def floor(lab: Any, folder: Path, racks: list[list[str]], known: Path) -> float:
    """The flat OpenSSH floor for the same logins: plain `ssh` per host, 64 at a time, started from each
    gateway's namespace at once (the head has no route), the same agent command and request as the run."""
    from mgpu_provision.fleet.session import agent_command
    from tests.support.hosts import fake_agent

    config = max(
        (folder / "home").glob(".cache/mgpu-provision/clush/*/ssh_config"), key=lambda p: p.stat().st_mtime
    )
    request = folder / "request.json"
    request.write_text(json.dumps({"args": {"n": 1}, "simulate": None}))
    remote = agent_command(fake_agent().name, sys.executable, "facts", False)
    ssh = f"ssh -F {config} -oUserKnownHostsFile={known} -oBatchMode=yes -oKexAlgorithms=curve25519-sha256"
    started = time.monotonic()
    runs = [
        subprocess.Popen(
            [
                *ns.prefix,
                "xargs",
                "-P",
                "64",
                "-I{}",
                "sh",
                "-c",
                f"{ssh} {{}} {shlex.quote(remote)} < {request} >/dev/null",
            ],
            stdin=subprocess.PIPE,
            text=True,
        )
        for ns, names in zip(lab.gateway_ns, racks, strict=True)
    ]
    for run, names in zip(runs, racks, strict=True):
        run.communicate("\n".join(names) + "\n")
    return time.monotonic() - started


def lab_run(sizes: list[int]) -> list[dict[str, Any]]:
    import tempfile

    from tests.support import hosts, netns

    key, pool = hosts.ClientKey(), hosts._AddressPool()
    factory_gen = hosts.host_factory(key, pool)
    factory = next(factory_gen)
    lab = netns.TreeLab(factory, racks=2, nodes_per_rack=SSHDS_PER_RACK)
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="mgpu-tree-bench-"))
    try:
        for rack in (1, 2):
            for i in range(SSHDS_PER_RACK):
                lab.start_node(f"sshd-{rack}{i}", rack, None, rig="x")
        folder.chmod(0o755)
        ssh_config = lab.write_ssh_config(folder / "gateways.ssh_config")
        gateway_log, wrapper = folder / "gateway-cpu.log", folder / "gateway-python"
        wrapper.write_text(GATEWAY_WRAPPER.format(python=sys.executable, log=str(gateway_log)))
        wrapper.chmod(0o755)
        for size in sizes:
            names = {f"node-{n:05d}": n for n in range(size)}
            half = (size + 1) // 2
            addresses = {
                name: lab.node_address(1 if n < half else 2, n % SSHDS_PER_RACK) for name, n in names.items()
            }
            topology = folder / f"topology-{size}.conf"
            first, second = list(names)[:half], list(names)[half:]
            lines = ["[routes]", "head: gw[1-2]", f"gw1: {','.join(first)}"]
            lines += [f"gw2: {','.join(second)}"] if second else []
            topology.write_text("\n".join(lines) + "\n")
            spec = {
                "key": str(key.path), "known": str(factory.known_hosts), "ssh_config": str(ssh_config),
                "topology": str(topology), "hosts": addresses,
            }  # fmt: skip
            spec_file = folder / f"spec-{size}.json"
            spec_file.write_text(json.dumps(spec))
            env = {
                **os.environ, "HOME": str(folder / "home"), "PYTHONPATH": str(REPO),
                "CLUSTERSHELL_GW_PYTHON_EXECUTABLE": str(wrapper),
            }  # fmt: skip
            (folder / "home").mkdir(exist_ok=True)
            command = [*lab.head.prefix, sys.executable, __file__, "--head", str(spec_file)]
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=900)  # agent cached
            gateway_log.unlink(missing_ok=True)
            load_before = os.getloadavg()[0]
            done = subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=900)
            time.sleep(1)  # the wrappers write their count once their gateway has gone
            gateways = _gateway_cpu(gateway_log, len(lab.gateway_ns))
            row = json.loads(done.stdout)
            row["floor_s"] = floor(lab, folder, [first, second], factory.known_hosts)
            row.update(
                hosts=size, gateway_cpu_s=gateways, load_before=load_before, load_after=os.getloadavg()[0]
            )
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        lab.close()
        next(factory_gen, None)
        key.remove()
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def write(rows: list[dict[str, Any]]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "clush-tree.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "# ClusterShell's tree at the batch seam: head → 2 gateways → 2 racks (benchmarks/clush_tree.py)",
        "",
        f"Hosts are ssh_config aliases onto {SSHDS_PER_RACK} real sshds per rack, each host its own OpenSSH",
        "login and reply (the tests' fake agent, cached); the head reaches the racks only through the",
        "gateways (network namespaces). One run per size, after a first run that uploads the agent; the",
        "floor is plain `ssh` per host, 64 at a time from each gateway's namespace. 2 shared cores.",
        "",
        "| hosts | replies | wall | flat ssh floor | wall/floor | head CPU | head CPU/host "
        "| gateway CPU (gw1, gw2) | head peak RSS | load before → after |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        gw = ", ".join(f"{c:.1f} s" for c in r["gateway_cpu_s"])
        lines.append(
            f"| {r['hosts']} | {r['replies']} | {r['wall_s']:.2f} s | {r['floor_s']:.2f} s | "
            f"{r['wall_s'] / r['floor_s']:.2f}× | {r['head_cpu_s']:.2f} s | "
            f"{1000 * r['head_cpu_s'] / r['hosts']:.1f} ms | {gw} | {r['rss_mib']:.0f} MiB | "
            f"{r['load_before']:.1f} → {r['load_after']:.1f} |"
        )
    (RESULTS / "clush-tree.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", default="64,256,1024")
    parser.add_argument("--head", type=Path, help=argparse.SUPPRESS)  # the run in the head's namespace
    args = parser.parse_args()
    if args.head is not None:
        print(json.dumps(head(json.loads(args.head.read_text()))))
        return
    write(lab_run([int(n) for n in args.hosts.split(",")]))


if __name__ == "__main__":
    main()
