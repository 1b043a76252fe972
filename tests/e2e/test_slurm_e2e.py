"""Slurm end to end: SSH test hosts running a real slurmd each, a real slurmctld and munged on loopback.

`slurm-conf` prints the node lines from the boxes' facts, apply writes gres.conf and restarts slurmd, and
the nodes register idle with their GPUs' affinity (`(S:...)`): on a box with SMT on and DeepOps-style affinity
(`0-3,8-11`: OS CPUs with siblings) gres.conf gets Slurm's logical cores. A box that loses a GPU is reported
by plan while its node is still idle, before a restarted slurmd would make it INVAL. The HealthCheckProgram
script runs the installed node check, drains a sick node with an `mgpu:` reason, resumes its own drain and
leaves an admin's. `apply --drain slurm` waits for a running `srun` job before changing its node, resumes
the nodes it drained, skips a batch whose job outlasts `--drain-timeout`, and leaves an admin's drain. The
installed launcher runs a 2 x 2 Gloo DDP job as one srun step, its ranks placed by Slurm, and a failing rank
ends the step on both nodes within seconds (`--kill-on-bad-exit=1`); smoke's step asks for the GPUs and CPUs.
Issue 39: a box of 4 NUMA nodes on 2 sockets registers IDLE with NUMA nodes as Slurm sockets; a configless
slurmd (`--conf-server`) is detected and gets its gres.conf lines at the controller, and the health script
drains with no PATH, no local slurm.conf and scontrol only in /opt/slurm/bin, logging a hanging or failing
scontrol to syslog while the node stays as it was; the node check runs as an acceptance step through srun.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision import cli
from tests.support.dcgm import ARGV, FIXTURES, dcgmi_on_host
from tests.support.hosts import MANAGED_DIRS, NODE_PYTHON, HostFactory, TestHost, record_folder
from tests.support.slurm import SlurmCluster, require_slurm
from tests.support.smoke_helpers import free_port, site_packages

SMT_TOPOLOGY = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\t0-3,8-11\t0
GPU1\tNV4\t X \t4-7,12-15\t1
"""
MODEL = "NVIDIA GeForce RTX 3090"
GRES_TYPE = "nvidia_geforce_rtx_3090"
GRES_LINE = f"Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=1000 Gres=gpu:{GRES_TYPE}:2"


def twin(gpus: int) -> dict[str, Any]:
    return {
        "driver": {"version": "550.54.15", "loaded": "550.54.15", "cuda": "12.4"},
        "gpus": [{"name": MODEL, "memory_mib": 24576} for _ in range(gpus)],
        "topology": SMT_TOPOLOGY if gpus == 2 else None,
        "machine": {"sockets": 2, "cores_per_socket": 4, "threads_per_core": 2, "memory_mib": 1000},
    }


RESTART = "/usr/local/bin/restart-slurmd"
# The script is slurmd's HealthCheckProgram; the tests run it themselves (interval 0: slurmd never does,
# since it would run it without the twin's MGPU_PROVISION_SIMULATE).
HEALTH_CONF = "HealthCheckProgram=/usr/local/bin/mgpu-provision-slurm-health\nHealthCheckInterval=0\n"
LAUNCHER = "/usr/local/bin/mgpu-torchrun"


def restart_script(host: TestHost, cluster: SlurmCluster) -> None:
    """The test hosts have no systemd: the rig's restart command stops this host's slurmd by its pid file
    and starts it again, as `systemctl restart slurmd` would."""
    pid_file = cluster.dir / f"slurmd-{host.name}.pid"
    path = host.dir / "managed" / str(MANAGED_DIRS.index("/usr/local/bin")) / Path(RESTART).name
    path.write_text(
        "#!/bin/sh\n"
        f'pid=$(cat {pid_file} 2>/dev/null) && kill "$pid" 2>/dev/null \\\n'
        '    && while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done\n'
        "exec env -u SLURM_CONF /usr/sbin/slurmd\n"
    )
    path.chmod(0o755)


def slurm_hosts(
    test_hosts: HostFactory, cluster: SlurmCluster, names: tuple[str, ...], node_line: str = ""
) -> list[TestHost]:
    """Test hosts of rig `pair` (2 GPUs each), each a node of `cluster` with its restart script."""
    hosts = [test_hosts.start(name, twin(2), rig="pair") for name in names]
    for host in hosts:
        cluster.add_node(host, node_line, gpus=2)
        restart_script(host, cluster)
    return hosts


def cli_out(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(list(args))
    return code, out.getvalue()


@pytest.fixture
def cluster(test_hosts: HostFactory) -> Any:
    require_slurm()
    # A short folder of its own (munge's socket path must stay under the 108 bytes of a unix socket name),
    # removed with the cluster.
    folder = Path(tempfile.mkdtemp(prefix="mgpu-slurm-"))
    record_folder(folder)
    made = SlurmCluster(folder, test_hosts.pool.take())
    try:
        yield made
    finally:
        made.stop()
        shutil.rmtree(made.dir, ignore_errors=True)


def test_apply_writes_gres_conf_and_the_nodes_register_idle_with_logical_cores(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    hosts = slurm_hosts(test_hosts, cluster, ("na", "nb"))
    rig = test_hosts.write_rig(
        tmp_path / "rig.yaml",
        hosts,
        rigs={
            "pair": {
                "gpus": {"model": MODEL, "count": 2},
                "slurm": {"restart_command": [RESTART]},
            }
        },
    )
    known = ["--known-hosts", str(test_hosts.known_hosts)]

    code, printed = cli_out("slurm-conf", str(rig), *known)
    assert code == 0, printed
    lines = printed.splitlines()
    assert "GresTypes=gpu" in lines
    for host in hosts:
        want = (
            # RealMemory: the twin's 1000 MiB less 3% headroom
            f"NodeName={host.name} Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=970 "
            f"Gres=gpu:{GRES_TYPE}:2"
        )
        assert want in lines, printed
        cluster.node_lines[host.name] = want.split(" ", 1)[1]
    cluster.start(slurmd=False)  # apply's restart starts them, once gres.conf is there

    code, report = cli_out("apply", str(rig), *known, "--yes", "--json")
    assert code == 0, report
    assert all(h["status"] == "changed" for h in json.loads(report)["hosts"].values()), report
    for host in hosts:
        gres = (host.dir / "etc-slurm" / "gres.conf").read_text()
        # Logical cores of the GPU's socket, not topo -m's OS CPUs with SMT siblings (deepops#1195).
        assert f"Name=gpu Type={GRES_TYPE} File=/dev/nvidia0 Cores=0-3 Links=-1,4\n" in gres
        assert f"Name=gpu Type={GRES_TYPE} File=/dev/nvidia1 Cores=4-7 Links=4,-1\n" in gres
        cluster.wait_state(host.name, ["IDLE"])
    assert cluster.sinfo_gres() == dict.fromkeys(("na", "nb"), f"gpu:{GRES_TYPE}:2(S:0-1)")
    assert "invalid GRES core specification" not in cluster.logs()

    # A GPU falls off nb: plan says so while the node is still idle, before a restart would make it INVAL;
    # na loses a device node, which would stop its slurmd at the next start.
    hosts[1].set_twin(twin(1))
    hosts[0].run_in_ns("rm /dev/nvidia1")
    code, plan = cli_out("plan", str(rig), *known, "--json")
    assert code == 2, plan
    changes = json.loads(plan)["hosts"]["nb"]["changes"]
    gres_checks = [c for c in changes if c["resource"] == "slurm:gres"]
    assert gres_checks and "INVAL" in gres_checks[0]["summary"], changes
    devices = [c for c in json.loads(plan)["hosts"]["na"]["changes"] if c["resource"] == "slurm:devices"]
    assert devices and devices[0]["summary"].startswith("/dev/nvidia1 missing"), plan
    assert cluster.node_state("nb")["State"].startswith("IDLE")


# 2 sockets x 4 cores x 2 threads, two NUMA nodes per socket (NPS2 / SNC): GPU 0 near NUMA node 0 (cores 0-1
# of socket 0 and their siblings), GPU 1 near NUMA node 3 (cores 2-3 of socket 1).
NUMA_TOPOLOGY = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\t0-1,8-9\t0
GPU1\tNV4\t X \t6-7,14-15\t3
"""


def test_a_box_of_4_numa_nodes_on_2_sockets_registers_idle_with_numa_nodes_as_sockets(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    numa = dict(twin(2), topology=NUMA_TOPOLOGY)
    numa["machine"] = dict(numa["machine"], numa_per_socket=2)
    host = test_hosts.start("na", numa, rig="pair")
    cluster.add_node(host, "", gpus=2)
    restart_script(host, cluster)
    rig = test_hosts.write_rig(
        tmp_path / "rig.yaml",
        [host],
        rigs={
            "pair": {
                "gpus": {"model": MODEL, "count": 2},
                "slurm": {"restart_command": [RESTART], "socket_layout": "numa"},
            }
        },
    )
    known = ["--known-hosts", str(test_hosts.known_hosts)]
    code, printed = cli_out("slurm-conf", str(rig), *known)
    assert code == 0, printed
    assert "# na: sockets are NUMA nodes: slurm.conf needs SlurmdParameters=numa_node_as_socket" in printed
    (line,) = [x for x in printed.splitlines() if x.startswith("NodeName=na ")]
    assert "Sockets=4 CoresPerSocket=2 ThreadsPerCore=2 " in line, printed
    cluster.node_lines["na"] = line.split(" ", 1)[1]
    cluster.slurmd_parameters = "config_overrides,numa_node_as_socket"
    cluster.start(slurmd=False)
    code, report = cli_out("apply", str(rig), *known, "--yes", "--json")
    assert code == 0, report
    gres = (host.dir / "etc-slurm" / "gres.conf").read_text()
    # Each GPU's NUMA node is one whole Slurm socket: Cores= that 24.11+'s socket rule accepts too.
    assert f"NodeName=na AutoDetect=off Name=gpu Type={GRES_TYPE} File=/dev/nvidia0 Cores=0-1 " in gres, gres
    assert f"NodeName=na AutoDetect=off Name=gpu Type={GRES_TYPE} File=/dev/nvidia1 Cores=6-7 " in gres, gres
    state = cluster.wait_state("na", ["IDLE"])
    assert state["Sockets"] == "4" and state["CoresPerSocket"] == "2", state
    assert cluster.sinfo_gres() == {"na": f"gpu:{GRES_TYPE}:2(S:0,3)"}
    code, plan = cli_out("plan", str(rig), *known, "--json")
    assert code == 0, plan  # converged: no layout, parameter or affinity complaint


HEALTH_ENV = "env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURMD_NODENAME=na"


def health_check_rig(
    test_hosts: HostFactory,
    tmp_path: Path,
    host: TestHost,
    deadline_s: int,
    health: dict[str, Any] | None = None,
) -> Path:
    """A rig of one pair box whose node check slurmd runs as its HealthCheckProgram (no timer: the node
    check apply installs is the script Slurm calls), with the rig's `health` section if given."""
    return test_hosts.write_rig(
        tmp_path / "rig.yaml",
        [host],
        rigs={
            "pair": {
                "gpus": {"model": MODEL, "count": 2},
                "slurm": {
                    "restart_command": [RESTART],
                    "health_check": "/usr/local/bin/mgpu-provision-check",
                },
                **({"health": health} if health else {}),
            }
        },
        node_check={"interval": None, "deadline_s": deadline_s},
    )


def health_checked_node(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path, health: dict[str, Any] | None = None
) -> tuple[TestHost, Callable[[str], subprocess.CompletedProcess[str]]]:
    """Node na of a running cluster, applied with the node check as slurmd's HealthCheckProgram (and the
    rig's `health` section, if given); and how to run an installed program on it as slurmd runs that one:
    root, only PATH and SLURMD_NODENAME (no SLURM_CONF), plus the twin that stands for this box's NVIDIA
    layer."""
    (host,) = slurm_hosts(test_hosts, cluster, ("na",))
    rig = health_check_rig(test_hosts, tmp_path, host, deadline_s=20, health=health)
    cluster.extra_conf = HEALTH_CONF
    cluster.node_lines["na"] = (
        f"Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=1000 Gres=gpu:{GRES_TYPE}:2"
    )
    cluster.start(slurmd=False)
    code, report = cli_out("apply", str(rig), "--known-hosts", str(test_hosts.known_hosts), "--yes", "--json")
    assert code == 0, report
    cluster.wait_state("na", ["IDLE"])

    def as_slurmd(program: str) -> subprocess.CompletedProcess[str]:
        env = f"{HEALTH_ENV} MGPU_PROVISION_SIMULATE={host.twin_path}"
        return host.run_in_ns(f"{env} {program}", check=False)

    return host, as_slurmd


def test_the_health_script_drains_a_sick_node_with_an_mgpu_reason_and_resumes_only_its_own_drain(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    host, as_slurmd = health_checked_node(test_hosts, cluster, tmp_path)

    def accept() -> subprocess.CompletedProcess[str]:
        # Acceptance inside an allocation: the node check as one task of a step that holds the node's GPUs.
        return cluster.client(
            "srun", "-w", "na", "-N1", "--gres=gpu:2", "--exclusive", "--immediate=10", "--time=2",
            "env", f"MGPU_PROVISION_SIMULATE={host.twin_path}", "/usr/local/bin/mgpu-provision-check",
            check=False, timeout=90,
        )  # fmt: skip

    done = accept()
    assert done.returncode == 0, done.stdout + done.stderr
    broken = twin(2)
    broken["gpus"][0]["health"] = {"xid": [79]}
    host.set_twin(broken)
    done = accept()
    assert done.returncode == 2 and "FAIL xid: GPU 0 logged Xid 79" in done.stdout, done.stdout + done.stderr
    host.set_twin(twin(2))
    deadline = time.monotonic() + 30
    while cluster.node_state("na")["State"] != "IDLE":  # the steps' COMPLETING ends
        assert time.monotonic() < deadline, cluster.node_state("na")
        time.sleep(0.2)

    def health_check() -> None:
        assert as_slurmd("/usr/local/bin/mgpu-provision-slurm-health").returncode == 0

    sick = twin(2)
    sick["gpus"][1]["health"] = {"xid": [79]}  # fallen off the bus
    healthy_state = cluster.node_state("na")
    health_check()  # healthy: nothing changes
    assert cluster.node_state("na")["State"] == healthy_state["State"]
    host.set_twin(sick)
    health_check()
    state = cluster.node_state("na")
    assert "DRAIN" in state["State"], state
    assert state["Reason"].startswith("mgpu: xid: GPU 1 logged Xid 79 since boot"), state

    host.set_twin(twin(2))
    health_check()
    assert "DRAIN" not in cluster.wait_state("na", ["IDLE"])["State"]  # resumed: the drain was its own

    cluster.scontrol("update", "nodename=na", "state=drain", "reason=disk swap")
    host.set_twin(sick)
    health_check()
    host.set_twin(twin(2))
    health_check()
    state = cluster.node_state("na")
    assert "DRAIN" in state["State"] and state["Reason"].startswith("disk swap"), state

    for command in ("apply", "recover"):  # a rolling apply's or recover's drain is that command's to lift
        cluster.scontrol("update", "nodename=na", "state=resume")
        cluster.scontrol("update", "nodename=na", "state=drain", f"reason=mgpu: {command}")
        health_check()
        state = cluster.node_state("na")
        assert "DRAIN" in state["State"] and state["Reason"].startswith(f"mgpu: {command}"), state

    # A slurm.conf scontrol cannot read: the script says so (exit 1, slurmd logs it), changes nothing, and
    # plan names scontrol's words.
    cluster.scontrol("update", "nodename=na", "state=resume")
    (cluster.nodes[0].etc / "slurm.conf").write_text("NodeName=\x00 garbage=(\n")
    host.set_twin(sick)
    env = f"env -i SLURMD_NODENAME=na MGPU_PROVISION_SIMULATE={host.twin_path}"
    done = host.run_in_ns(f"{env} /usr/local/bin/mgpu-provision-slurm-health", check=False)
    assert done.returncode == 1 and "scontrol show node na failed" in done.stderr, done.stderr
    assert "DRAIN" not in cluster.node_state("na")["State"]
    rig = tmp_path / "rig.yaml"  # health_checked_node wrote it
    code, plan = cli_out("plan", str(rig), "--known-hosts", str(test_hosts.known_hosts), "--json")
    node = [c for c in json.loads(plan)["hosts"]["na"]["changes"] if c["resource"] == "slurm:node"]
    assert code == 2 and node and "scontrol show node na" in node[0]["summary"], plan


@contextlib.contextmanager
def syslog_of(host: TestHost) -> Iterator[Path]:
    """A /dev/log in the host's private /dev, each datagram `logger` sends a line of the file yielded."""
    assert host.process is not None
    out = host.dir / "syslog"
    out.touch()
    code = (
        "import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ns.bind('/dev/log')\n"
        "f = open(sys.argv[1], 'ab', 0)\nwhile True:\n    f.write(s.recv(65536) + b'\\n')\n"
    )
    catcher = subprocess.Popen(
        ["nsenter", "-t", str(host.process.pid), "-m", "-u", "--", "python3", "-c", code, str(out)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while host.run_in_ns("test -S /dev/log", check=False).returncode != 0:
            assert time.monotonic() < deadline and catcher.poll() is None, "no /dev/log"
            time.sleep(0.05)
        yield out
    finally:
        catcher.terminate()
        catcher.wait(timeout=10)
        host.run_in_ns("rm -f /dev/log", check=False)


def logged(syslog: Path, word: str, timeout_s: float = 5.0) -> str:
    """The catcher's file once it holds `word` (it writes each datagram as it arrives)."""
    deadline = time.monotonic() + timeout_s
    while word not in syslog.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return syslog.read_text()


def test_a_configless_node_is_detected_and_its_health_script_needs_no_path_slurm_conf_or_usr_bin_scontrol(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    host = test_hosts.start("na", twin(2), rig="pair")
    node = cluster.add_node(host, GRES_LINE, gpus=2, configless=True)
    restart_script(host, cluster)
    # Slurm's clients only in /opt/slurm/bin (AWS ParallelCluster, most source builds): Debian's hidden here.
    host.run_in_ns(
        "mount -t tmpfs tmpfs /opt && mkdir -p /opt/slurm/bin && cp /usr/bin/scontrol /opt/slurm/bin/"
        " && mount --bind /dev/null /usr/bin/scontrol"
    )
    rig = health_check_rig(test_hosts, tmp_path, host, deadline_s=45)
    known = ["--known-hosts", str(test_hosts.known_hosts)]
    cluster.extra_conf = HEALTH_CONF
    cluster.start()  # slurmd --conf-server: its files come from slurmctld, none is on the node
    assert not (node.etc / "slurm.conf").exists()
    deadline = time.monotonic() + 30
    while "INVAL" not in cluster.node_state("na").get("State", ""):  # no gres.conf at the controller yet
        assert time.monotonic() < deadline, cluster.node_state("na")
        time.sleep(0.2)

    code, plan = cli_out("plan", str(rig), *known, "--json")
    changes = {c["resource"]: c for c in json.loads(plan)["hosts"]["na"]["changes"]}
    assert code == 2 and "file:/etc/slurm/gres.conf" not in changes and "slurmd" not in changes, plan
    step = changes["slurm:configless"]
    assert step["action"] == "manual" and f"--conf-server {cluster.address}:" in step["summary"], step
    # What the step says to put on the controller is what makes the node register its GPUs.
    (cluster.dir / "gres.conf").write_text(step["desired"] + "\n")
    cluster.scontrol("reconfigure")
    cluster.stop_slurmd(node)
    cluster.start_slurmd(node)
    # slurmctld's own drain of the invalid registration is an admin's to lift (and the script leaves it);
    # it may be set a moment after the node registers IDLE, so lift it whenever it shows until the node is
    # IDLE without it (a resume of a node not drained is refused: the run failed that way once).
    settled, deadline = time.monotonic() + 2, time.monotonic() + 30
    while "DRAIN" in (state := cluster.wait_state("na", ["IDLE"]))["State"] or time.monotonic() < settled:
        assert time.monotonic() < deadline, state
        if "DRAIN" in state["State"]:
            cluster.scontrol("update", "nodename=na", "state=resume", check=False)
        time.sleep(0.2)
    assert cluster.sinfo_gres() == {"na": f"gpu:{GRES_TYPE}:2(S:0-1)"}

    code, report = cli_out("apply", str(rig), *known, "--yes", "--json")
    left = [c["resource"] for c in json.loads(report)["hosts"]["na"]["remaining"]]
    assert left == ["slurm:configless"], report
    bin_dir = host.dir / "managed" / str(MANAGED_DIRS.index("/usr/local/bin"))
    assert (bin_dir / "mgpu-provision-slurm-health").exists()

    def health_check() -> subprocess.CompletedProcess[str]:
        # As slurmd runs HealthCheckProgram: SLURMD_NODENAME and nothing else, not even PATH
        # (slurmd.c run_script_health_check), plus the twin that stands for this box's NVIDIA layer.
        env = f"env -i SLURMD_NODENAME=na MGPU_PROVISION_SIMULATE={host.twin_path}"
        return host.run_in_ns(f"{env} /usr/local/bin/mgpu-provision-slurm-health", check=False)

    sick = twin(2)
    sick["gpus"][1]["health"] = {"xid": [79]}
    host.set_twin(sick)
    done = health_check()
    assert done.returncode == 0, done.stdout + done.stderr
    state = cluster.node_state("na")
    assert "DRAIN" in state["State"] and state["Reason"].startswith("mgpu: xid: GPU 1"), state

    # scontrol hangs: ended within the script's bound, logged, the node left as it was.
    host.run_in_ns("cp /opt/slurm/bin/scontrol /opt/slurm/bin/.scontrol")
    host.run_in_ns("printf '#!/bin/sh\\nexec sleep 300\\n' > /opt/slurm/bin/scontrol")
    host.set_twin(twin(2))
    with syslog_of(host) as syslog:
        started = time.monotonic()
        done = health_check()
        took = time.monotonic() - started
        assert done.returncode == 1 and "no answer within 6 s" in done.stderr, done.stderr
        assert took < 60, took
        said = logged(syslog, "failed")
        assert "mgpu-provision-slurm-health: node na: scontrol show node na failed" in said
        assert cluster.node_state("na")["State"] == state["State"]
        # scontrol fails at once: logged the same way.
        host.run_in_ns("printf '#!/bin/sh\\necho refused >&2; exit 1\\n' > /opt/slurm/bin/scontrol")
        assert health_check().returncode == 1
        assert "(exit 1: refused)" in logged(syslog, "refused")
    host.run_in_ns("cp /opt/slurm/bin/.scontrol /opt/slurm/bin/scontrol")
    done = health_check()
    assert done.returncode == 0, done.stderr
    state = cluster.wait_state("na", ["IDLE"])
    assert "DRAIN" not in state["State"], (state, done.stdout, done.stderr)  # healthy: its own drain lifted


def test_a_thermal_violation_or_a_next_boot_kernel_warns_and_never_drains_the_node(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    # Issue 38: DCGM's MonitorThermal only warns on thermal violation time, and a next boot's kernel without
    # the module is a risk on a box that works now. The node check exits 0 with WARN lines; the real health
    # script on the real slurmd then runs no `scontrol update`: the node stays IDLE, no drain, no reason.
    host, as_slurmd = health_checked_node(test_hosts, cluster, tmp_path)
    hot = twin(2)
    hot["gpus"][1]["health"] = {"violation_ms": {"thermal": 1000}}
    host.set_twin(hot)
    assert as_slurmd("/usr/local/bin/mgpu-provision-check").returncode == 0  # the first sample: a window
    hot["gpus"][1]["health"] = {"violation_ms": {"thermal": 4000}}
    host.set_twin(hot)
    kernel = twin(2)
    kernel["kernel"] = {
        "running": "6.8.0-45-generic",
        "installed": ["6.8.0-45-generic", "6.8.0-47-generic"],
        "nvidia_module_for": ["6.8.0-45-generic"],
    }
    before = cluster.node_state("na")
    for box, check in ((hot, "throttle"), (kernel, "kernel")):
        host.set_twin(box)
        said = as_slurmd("/usr/local/bin/mgpu-provision-check")
        assert said.returncode == 0 and said.stdout.startswith(f"WARN {check}: "), said.stdout + said.stderr
        # The script's own run judges the same window (the sample a minute is kept: health_rates.py).
        assert as_slurmd("/usr/local/bin/mgpu-provision-slurm-health").returncode == 0
        state = cluster.node_state("na")
        assert state["State"] == before["State"] and "DRAIN" not in state["State"], state
        assert state.get("Reason", "") == before.get("Reason", ""), state


def test_the_health_script_leaves_the_rigs_dcgm_diag_to_the_timer(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    # A level 2 diag keeps the GPUs for minutes and slurmd ends its HealthCheckProgram after 60 s: the real
    # health script on the real slurmd runs the node check with --no-dcgm-diag, so a failing diag on the
    # box (a stand-in dcgmi on the script's PATH, /usr/local/bin) drains nothing; the check run by hand
    # runs it and fails.
    host, as_slurmd = health_checked_node(test_hosts, cluster, tmp_path, {"dcgm_diag": {"level": 2}})
    folder = dcgmi_on_host(host, f"cat {FIXTURES / 'dcgm4-r2-pcie-fail-thermal-monitor.json'}")
    before = cluster.node_state("na")
    done = as_slurmd("/usr/local/bin/mgpu-provision-slurm-health")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (folder / ARGV).exists()
    state = cluster.node_state("na")
    assert state["State"] == before["State"] and "DRAIN" not in state["State"], state
    by_hand = host.run_in_ns(
        f"env -i PATH=/usr/local/bin:/usr/bin:/bin MGPU_PROVISION_SIMULATE={host.twin_path} "
        "/usr/local/bin/mgpu-provision-check",
        check=False,
    )
    assert by_hand.returncode == 2 and by_hand.stdout.startswith("FAIL dcgm-diag: GPU 0"), by_hand.stdout
    assert (folder / ARGV).read_text() == "diag -r 2 -j\n"


def test_recover_drains_resets_checks_and_resumes_its_own_drain_and_leaves_an_admins(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    (host,) = slurm_hosts(test_hosts, cluster, ("na",), GRES_LINE)
    pair = {"gpus": {"model": MODEL, "count": 2}, "slurm": {"restart_command": [RESTART]}}
    rig = str(test_hosts.write_rig(tmp_path / "rig.yaml", [host], rigs={"pair": pair}))
    known = ["--known-hosts", str(test_hosts.known_hosts)]
    cluster.start(slurmd=False)  # apply writes gres.conf and starts slurmd
    code, report = cli_out("apply", rig, *known, "--yes", "--json")
    assert code == 0, report
    cluster.wait_state("na", ["IDLE"])
    sick = twin(2)
    sick["gpus"][1]["health"] = {"xid": [119]}  # GSP RPC timeout: the catalog's RESET_GPU
    host.set_twin(sick)

    code, report = cli_out("recover", rig, *known, "--yes", "--json")
    assert code == 0, report
    na = json.loads(report)["hosts"]["na"]
    assert [s["step"] for s in na["steps"]] == ["judge", "drain", "reset", "check", "resume"], na
    assert "this run's" in na["steps"][1]["words"], na
    state = cluster.wait_state("na", ["IDLE"])
    assert "DRAIN" not in state["State"], state  # resumed: the drain was its own

    # An admin's drain stays, reason and all: recover resets under it and lifts nothing.
    sick["gpus"][1]["health"] = {"xid": [119, 119]}  # a new Xid after the recorded reset
    host.set_twin(sick)
    cluster.scontrol("update", "nodename=na", "state=drain", "reason=disk swap")
    code, report = cli_out("recover", rig, *known, "--yes", "--json")
    assert code == 0, report
    na = json.loads(report)["hosts"]["na"]
    assert [s["step"] for s in na["steps"]] == ["judge", "drain", "reset", "check"], na
    assert "already drained: disk swap" in na["steps"][1]["words"], na
    state = cluster.node_state("na")
    assert "DRAIN" in state["State"] and state["Reason"].startswith("disk swap"), state


def _profile_script(host: TestHost) -> Path:
    return host.dir / "managed" / str(MANAGED_DIRS.index("/etc/profile.d")) / "mgpu-provision.sh"


def test_apply_drain_slurm_waits_for_the_running_job_then_changes_the_node_and_resumes_it(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    hosts = slurm_hosts(test_hosts, cluster, ("na", "nb"), GRES_LINE)

    def rig(env: dict[str, str]) -> str:
        pair = {"gpus": {"model": MODEL, "count": 2}, "slurm": {"restart_command": [RESTART]}, "env": env}
        return str(test_hosts.write_rig(tmp_path / "rig.yaml", hosts, rigs={"pair": pair}))

    known = ["--known-hosts", str(test_hosts.known_hosts)]
    cluster.start(slurmd=False)
    code, report = cli_out("apply", rig({}), *known, "--yes", "--json")
    assert code == 0, report
    for host in hosts:
        cluster.wait_state(host.name, ["IDLE"])
    before = {h.name: _profile_script(h).read_text() for h in hosts}

    # A job on na outlasts a 1 s drain timeout: the batch is skipped, nothing on na changes, and the drain
    # this run set is lifted again (the job keeps running, the node takes work again).
    job = subprocess.Popen(
        ["srun", "-w", "na", "-N1", "sleep", "15"], env=cluster.env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    cluster.wait_state("na", ["ALLOCATED", "MIXED"])
    code, report = cli_out(
        "apply", rig({"MGPU_ROLL": "1"}), *known, "--yes", "--json", "--drain", "slurm", "--serial", "1",
        "--drain-timeout", "1",
    )  # fmt: skip
    result = json.loads(report)
    assert code == 2, report
    assert result["hosts"]["na"]["status"] == "skipped", report
    assert result["drain_skipped"][0].startswith("batch 1 (na) skipped: na still "), report
    assert "after 1s (its jobs are running)" in result["drain_skipped"][0], report
    assert result["hosts"]["nb"]["status"] == "changed", report  # batch 2 went ahead
    assert _profile_script(hosts[0]).read_text() == before["na"]
    state = cluster.node_state("na")
    assert "DRAIN" not in state["State"] and state["State"].startswith(("ALLOCATED", "MIXED")), state
    assert "DRAIN" not in cluster.wait_state("nb", ["IDLE"])["State"]  # resumed after its change

    # Without the short timeout apply waits for the job: na's file changes only after the job ended.
    ended: list[float] = []

    def wait_for_the_job() -> None:
        job.wait()
        ended.append(time.time())

    waiter = threading.Thread(target=wait_for_the_job)
    waiter.start()
    code, report = cli_out("apply", rig({"MGPU_ROLL": "1"}), *known, "--yes", "--json", "--drain", "slurm")
    waiter.join(timeout=30)
    assert code == 0, report
    assert job.returncode == 0, job.stdout.read() if job.stdout else ""
    na = json.loads(report)["hosts"]["na"]
    assert na["status"] == "changed" and any(n.startswith("resumed in Slurm (na)") for n in na["notes"]), na
    changed_at = _profile_script(hosts[0]).stat().st_mtime
    assert "MGPU_ROLL" in _profile_script(hosts[0]).read_text()
    assert ended and ended[0] <= changed_at, (ended, changed_at)
    assert "DRAIN" not in cluster.wait_state("na", ["IDLE"])["State"]  # resumed


def test_apply_drain_slurm_leaves_an_admins_drain_alone(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    (host,) = slurm_hosts(test_hosts, cluster, ("na",), GRES_LINE)
    pair = {"gpus": {"model": MODEL, "count": 2}, "slurm": {"restart_command": [RESTART]}}
    rig = str(test_hosts.write_rig(tmp_path / "rig.yaml", [host], rigs={"pair": pair}))
    cluster.start(slurmd=False)
    cluster.scontrol("update", "nodename=na", "state=drain", "reason=disk swap")
    code, report = cli_out(
        "apply", rig, "--known-hosts", str(test_hosts.known_hosts), "--yes", "--json", "--drain", "slurm"
    )
    assert code == 0, report
    na = json.loads(report)["hosts"]["na"]
    assert "left drained in Slurm: the drain is not this rollout's (disk swap" in " ".join(na["notes"]), na
    state = cluster.wait_state("na", ["IDLE+DRAIN", "DOWN+DRAIN"])
    assert state["Reason"].startswith("disk swap"), state


def ddp_rig(
    test_hosts: HostFactory,
    hosts: list[TestHost],
    path: Path,
    master: str,
    port: int = 0,
    timeout_s: float | None = None,
    **env: str,
) -> Path:
    """Rig `pair` with a 2 x 2 Gloo DDP group over `hosts`, smoke's python (and timeout) and `env` in the
    env files."""
    smoke: dict[str, Any] = {"python": NODE_PYTHON}
    if timeout_s is not None:
        smoke["timeout_s"] = timeout_s
    pair = {
        "gpus": {"model": MODEL, "count": 2},
        "slurm": {"restart_command": [RESTART]},
        "ddp": {"master": master, "port": port or free_port(), "backend": "gloo", "nproc_per_node": 2,
                "ifname": "lo"},
    }  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": site_packages(), **env}
    return test_hosts.write_rig(path, hosts, rigs={"pair": pair}, env=env, smoke=smoke)


def applied(test_hosts: HostFactory, cluster: SlurmCluster, hosts: list[TestHost], rig: Path) -> None:
    """Apply `rig` and wait for its nodes to be idle again. Checks are left out: facts probe torch without
    the rig's PYTHONPATH, which only the launcher's env adds."""
    known = ["--known-hosts", str(test_hosts.known_hosts)]
    code, report = cli_out("apply", str(rig), *known, "--yes", "--json", "--skip-tags", "checks")
    assert code == 0, report
    for host in hosts:
        cluster.wait_state(host.name, ["IDLE"])


DDP_SCRIPT = """\
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
if os.environ.get("FAIL_RANK") == str(rank):
    print(f"failing at {time.time()}", flush=True)
    sys.exit(3)
if os.environ.get("FAIL_RANK"):  # the others wait off the network: only Slurm can end them early
    time.sleep(100)
total = torch.ones(1)
dist.all_reduce(total)
print(f"rank {rank} of {world} on {os.environ['SLURMD_NODENAME']}: sum {int(total.item())}", flush=True)
dist.destroy_process_group()
"""


def test_the_launcher_takes_rank_count_and_master_from_srun_and_a_failing_rank_ends_the_step(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    hosts = slurm_hosts(test_hosts, cluster, ("na", "nb"), GRES_LINE)
    # The rig names nb as master: inside the srun step Slurm's allocation decides instead.
    rig = ddp_rig(test_hosts, hosts, tmp_path / "rig.yaml", master="nb")
    cluster.start(slurmd=False)
    applied(test_hosts, cluster, hosts, rig)
    script = cluster.dir / "ddp.py"
    script.write_text(DDP_SCRIPT)
    srun = ["-N2", "--ntasks-per-node=1", "--immediate=10", "--kill-on-bad-exit=1", "--time=2"]

    def run(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            # TMPDIR: torchrun's torchelastic_* folder on each node lands in the test's own, not /tmp.
            ["srun", *srun, LAUNCHER, str(script)], env={**cluster.env(), "TMPDIR": str(tmp_path), **env},
            capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip

    done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    # Two ranks of a node share srun's stdout, so their lines can run together: find each report whole.
    lines = sorted(re.findall(r"rank \d+ of \d+ on \w+: sum \d+", done.stdout))
    # Rank 0 on na, the allocation's first node, though the rig names nb as master.
    assert lines == [f"rank {r} of 4 on {'na' if r < 2 else 'nb'}: sum 4" for r in range(4)], done

    failed = run(FAIL_RANK="3")
    ended = time.time()
    assert failed.returncode != 0, failed
    failing_at = float(failed.stdout.split("failing at ", 1)[1].split()[0])
    # --kill-on-bad-exit=1: the step ends on every node within seconds, not after the others' 100 s sleep.
    assert ended - failing_at < 15, (ended - failing_at, failed.stderr)


def test_smoke_via_srun_passes_2x2_names_the_job_and_a_failing_rank_ends_it_within_seconds(
    test_hosts: HostFactory, cluster: SlurmCluster, tmp_path: Path
) -> None:
    hosts = slurm_hosts(test_hosts, cluster, ("na", "nb"), GRES_LINE)
    port = free_port()
    cluster.start(slurmd=False)

    def smoke_via_srun(name: str, **env: str) -> dict[str, Any]:
        # The rig's timeout_s of 200 s: the other ranks would wait 100 s (the process group's timeout).
        rig = ddp_rig(test_hosts, hosts, tmp_path / name, "na", port, timeout_s=200, **env)
        applied(test_hosts, cluster, hosts, rig)
        known = ["--known-hosts", str(test_hosts.known_hosts)]
        code, out = cli_out("smoke", str(rig), *known, "--via", "srun", "--json")
        document = json.loads(out)
        assert document["exit_code"] == code, document
        return dict(document)

    passed = smoke_via_srun("rig.yaml")
    (group,) = passed["groups"]
    assert passed["exit_code"] == 0 and group["ok"], group["problems"]
    assert group["world_size"] == 4 and group["ranks_joined"] == 4, group
    srun = group["srun"]
    assert srun["nodes"] == ["na", "nb"] and srun["exit_code"] == 0, srun
    assert srun["job_id"] and srun["job_id"].isdigit(), srun
    # The job the report names is the controller's, on both nodes (finished jobs stay for MinJobAge).
    job = cluster.scontrol("show", "job", "-o", srun["job_id"]).stdout
    assert "NodeList=na,nb" in job, job
    # It asked Slurm for each node's GPUs, a CPU per rank, and the nodes to itself (slurm.srun's defaults).
    assert "TresPerNode=gres:gpu:2" in job and "CPUs/Task=2" in job and "OverSubscribe=NO" in job, job
    hosts_of = {node["host"]: sorted(r["rank"] for r in node["ranks"]) for node in group["nodes"]}
    assert hosts_of == {"na": [0, 1], "nb": [2, 3]}, hosts_of

    failed = smoke_via_srun("fail.yaml", MGPU_SMOKE_FAIL_RANK="3")
    (group,) = failed["groups"]
    assert failed["exit_code"] == 2 and not group["ok"], group
    assert any("MGPU_SMOKE_FAIL_RANK=3" in (node["diagnosis"] or "") for node in group["nodes"]), json.dumps(
        {k: group[k] for k in ("problems", "srun", "nodes")}, indent=1
    )
    # The other ranks would wait 100 s for rank 3; --kill-on-bad-exit=1 ends them within seconds.
    assert group["srun"]["exit_code"] not in (0, None) and group["srun"]["elapsed_s"] < 30, group["srun"]
