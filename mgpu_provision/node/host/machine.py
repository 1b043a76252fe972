"""The machine's CPU layout and memory as Slurm counts them, and what Slurm itself says about this node.

Slurm's gres.conf `Cores=` are its logical core indices (cores numbered socket by socket), not the OS CPU
ids that `nvidia-smi topo -m` prints (those include SMT siblings): mapping one onto the other needs every
CPU's socket and core. slurm.conf's NodeName line needs sockets, cores per socket, threads per core and
memory. Where slurmd is installed, `slurmd -C` says what it would register and `scontrol show node -o` what
the controller holds, so a check can compare them with the facts before slurmd marks the node INVAL.
"""

from __future__ import annotations

import os
import re

from ...catalog.cpulist import parse_cpu_list
from ...typing_lite import TYPE_CHECKING
from ..core.system import read_text

if TYPE_CHECKING:
    import subprocess
    from typing import Any, Dict, List, Optional, Tuple

CPU_DIR = "/sys/devices/system/cpu"
NODE_DIR = "/sys/devices/system/node"
MEMINFO = "/proc/meminfo"
_SLURM_TIMEOUT_S = 10


def _numa_of(node_dir: str) -> Dict[int, int]:
    found: Dict[int, int] = {}
    try:
        names = os.listdir(node_dir)
    except OSError:
        return found
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            for cpu in parse_cpu_list(read_text(os.path.join(node_dir, name, "cpulist")) or ""):
                found[cpu] = int(name[4:])
    return found


def machine(
    cpu_dir: str = CPU_DIR, node_dir: str = NODE_DIR, meminfo: str = MEMINFO
) -> Optional[Dict[str, Any]]:
    """Every online CPU with its socket, core and NUMA node, and the memory; None when /sys cannot say."""
    numa = _numa_of(node_dir)
    threads = []
    for cpu in parse_cpu_list(read_text(os.path.join(cpu_dir, "online")) or ""):
        topology = os.path.join(cpu_dir, "cpu{}".format(cpu), "topology")
        package = read_text(os.path.join(topology, "physical_package_id"))
        core = read_text(os.path.join(topology, "core_id"))
        if package is None or core is None:
            return None
        # The L3 cache's id: slurmd's l3cache_as_socket counts each L3 (an AMD CCX) as a socket.
        l3 = read_text(os.path.join(cpu_dir, "cpu{}".format(cpu), "cache", "index3", "id"))
        thread = {"cpu": cpu, "socket": int(package), "core": int(core), "numa": numa.get(cpu)}
        thread["l3"] = int(l3) if l3 is not None and l3.strip().isdigit() else None
        threads.append(thread)
    if not threads:
        return None
    return {"threads": threads, "memory_mib": _memory_mib(meminfo)}


def _memory_mib(meminfo: str) -> Optional[int]:
    for line in (read_text(meminfo) or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def simulated_machine(
    sockets: int, cores_per_socket: int, threads_per_core: int, memory_mib: int, numa_per_socket: int = 1
) -> Dict[str, Any]:
    """A machine numbered as Linux numbers most x86 boxes: first every core's first thread, socket by socket,
    then the SMT siblings in the same order (so CPU n and n + cores are one core); each socket's cores split
    evenly over `numa_per_socket` NUMA nodes (AMD NPS2/NPS4, Intel SNC)."""
    cores = sockets * cores_per_socket
    per_numa = max(1, cores_per_socket // numa_per_socket)
    threads = [
        {
            "cpu": thread * cores + socket * cores_per_socket + core,
            "socket": socket,
            "core": core,
            "numa": socket * numa_per_socket + min(core // per_numa, numa_per_socket - 1),
        }
        for thread in range(threads_per_core)
        for socket in range(sockets)
        for core in range(cores_per_socket)
    ]
    return {"threads": sorted(threads, key=lambda t: t["cpu"]), "memory_mib": memory_mib}


def parse_key_values(line: str) -> Dict[str, str]:
    """`Key=value Key=value` as `slurmd -C` and `scontrol show node -o` print it; a value with spaces
    (Reason=...) runs until the next token that looks like `Key=`."""
    pairs: Dict[str, str] = {}
    key = None
    for token in line.split():
        name, sep, value = token.partition("=")
        if sep and name[:1].isupper() and name.replace("_", "").isalnum():
            key = name
            pairs[key] = value
        elif key is not None:
            pairs[key] += " " + token
    return pairs


def run_tool(argv: List[str]) -> "subprocess.CompletedProcess[str]":
    import subprocess  # only for Slurm's tools: the facts of a rig without `slurm` start no process here

    return subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_SLURM_TIMEOUT_S, check=False
    )


# Where Slurm's tools live when not on the PATH a login over SSH gets: Debian's sbin, a source build's
# /usr/local, AWS ParallelCluster's and most sites' /opt/slurm.
SLURM_DIRS = (
    "/usr/sbin", "/usr/local/sbin", "/usr/local/bin", "/opt/slurm/bin", "/opt/slurm/sbin",
)  # fmt: skip
# slurmd's cached copy of the controller's files in configless mode (slurmd.c `_create_rundir`, 22.05+);
# user commands read slurm.conf there when no local one exists (read_config.c `_establish_config_source`).
CONFIGLESS_DIR = "/run/slurm/conf"


def find_tool(name: str) -> Optional[str]:
    """Slurm's `name` on PATH or in the folders of `SLURM_DIRS` a login shell over SSH may not have."""
    import shutil  # here: every facts call pays for its imports, and only Slurm's boxes need this one

    return shutil.which(name) or next(
        (p for p in (d + "/" + name for d in SLURM_DIRS) if os.access(p, os.X_OK)), None
    )


def _namespace(proc: str, pid: str) -> Optional[str]:
    try:
        return os.readlink(os.path.join(proc, pid, "ns", "mnt"))
    except OSError:
        return None


def running_slurmd(proc: str = "/proc") -> Optional[List[str]]:
    """The command line of the slurmd running on this box (in this mount namespace: a container's or a
    test host's slurmd is another box's), None when none runs (or /proc cannot say)."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    own = _namespace(proc, "self")
    for pid in pids:
        if (read_text(os.path.join(proc, pid, "comm")) or "").strip() != "slurmd":
            continue
        if _namespace(proc, pid) != own:
            continue
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if argv:
            return argv
    return None


def option_of(argv: List[str], *names: str) -> Optional[str]:
    """The value of a slurmd option (`-N name`, `--conf-server=x` or `--conf-server x`) in `argv`."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg[len(name) + 1 :]
            if not name.startswith("--") and arg.startswith(name) and len(arg) > len(name):
                return arg[len(name) :]
    return None


def configless(argv: Optional[List[str]], run_dir: str = CONFIGLESS_DIR) -> Optional[str]:
    """How this slurmd gets its files from the controller (configless_slurm.shtml: `--conf-server`, or a
    DNS SRV record with no local slurm.conf, which leaves the cache in /run/slurm/conf), None when local."""
    server = option_of(argv or [], "--conf-server")
    if server:
        return "slurmd --conf-server " + server
    if os.path.isdir(run_dir):
        return "slurmd keeps the controller's files in " + run_dir
    return None


def version_of(slurmd: str) -> Optional[str]:
    """slurmd's version (`slurmd -V`: "slurm 22.05.8"), None when it cannot say."""
    done = run_tool([slurmd, "-V"])
    words = done.stdout.split()
    return words[-1] if done.returncode == 0 and words else None


def registered_name(slurmd: Optional[str], hostname: str) -> Tuple[Optional[Dict[str, str]], str]:
    """What slurmd would register (`slurmd -C`, None where it cannot say) and the node's name: a running
    slurmd's `-N` first (it registers under that name, whatever the hostname), then `slurmd -C`'s."""
    given = option_of(running_slurmd() or [], "-N")
    if slurmd is None:
        return None, given or hostname
    local = run_tool([slurmd, "-C"])
    lines = local.stdout.splitlines()
    registers = parse_key_values(lines[0]) if local.returncode == 0 and lines else None
    return registers, given or (registers or {}).get("NodeName", hostname)


def controller_line(scontrol: str, name: str) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
    """The controller's `scontrol show node -o` line for `name`, or None and what scontrol said instead."""
    remote = run_tool([scontrol, "show", "node", "-o", name])
    if remote.returncode == 0 and remote.stdout.strip():
        return parse_key_values(remote.stdout.splitlines()[0]), None
    said = (remote.stderr or remote.stdout).strip().splitlines()
    return None, "scontrol show node {}: {}".format(name, said[-1] if said else "no answer")


# The cluster settings a check needs from `scontrol show config` ("Key = value" lines).
CONFIG_KEYS = ("HealthCheckProgram", "HealthCheckTimeout", "SlurmdParameters", "SLURM_CONF", "SLURM_VERSION")


def cluster_config(scontrol: str) -> Dict[str, str]:
    """The `CONFIG_KEYS` of `scontrol show config`; empty when scontrol cannot say."""
    done = run_tool([scontrol, "show", "config"])
    found: Dict[str, str] = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else ():
        key, sep, value = line.partition("=")
        if sep and key.strip() in CONFIG_KEYS:
            found[key.strip()] = value.strip()
    return found


def slurm(hostname: str, minors: List[Optional[int]], dev_dir: str = "/dev") -> Optional[Dict[str, Any]]:
    """What slurmd would register (`slurmd -C`), its version, name and configless source, the controller's
    line for this node and a few cluster settings, and which of the GPUs' /dev/nvidia<minor> are missing
    (slurmd exits when a gres.conf File= is); None without slurmd. A controller that cannot be reached, or
    an scontrol that hangs (ended after 10 s), is an `error`, never a failure of the verb."""
    import subprocess  # Slurm's tools: a node without slurmd, and facts without `slurm`, start none

    slurmd = find_tool("slurmd")
    if slurmd is None:
        return None
    devices = [os.path.join(dev_dir, "nvidia{}".format(minor)) for minor in minors if minor is not None]
    missing = [device for device in devices if not os.path.exists(device)]
    found: Dict[str, Any] = {
        "registers": None, "controller": None, "error": None, "missing_devices": missing, "version": None,
        "name": None, "configless": configless(running_slurmd()), "scontrol": None, "config": {},
    }  # fmt: skip
    try:
        found["version"] = version_of(slurmd)
        found["registers"], found["name"] = registered_name(slurmd, hostname)
        scontrol = find_tool("scontrol")
        found["scontrol"] = scontrol
        if scontrol is None:
            found["error"] = "scontrol is not installed"
            return found
        found["controller"], found["error"] = controller_line(scontrol, found["name"])
        if found["controller"] is not None:
            found["config"] = cluster_config(scontrol)
    except (OSError, subprocess.TimeoutExpired) as exc:
        found["error"] = "slurm: {}".format(exc)
    return found


# Slurm's job cgroup: "%s/job_%u" (src/plugins/cgroup/v1/xcgroup.c line 482, 22.05.8) and "/job_%u"
# (src/plugins/cgroup/v2/cgroup_v2.c line 1025).
_JOB_CGROUP = re.compile(r"/job_(\d+)(?:/|$)", re.M)


def slurm_job_of(pid: int, proc: str = "/proc") -> Optional[str]:
    """The Slurm job a process runs in: its SLURM_JOB_ID (srun and sbatch set it in every task), else the
    job cgroup it is in (a task that cleared its environment); None outside Slurm or when /proc cannot say."""
    base = os.path.join(proc, str(pid))
    try:
        with open(os.path.join(base, "environ"), "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"SLURM_JOB_ID="):
                    return entry[len(b"SLURM_JOB_ID=") :].decode("ascii", "replace") or None
    except OSError:
        pass
    match = _JOB_CGROUP.search(read_text(os.path.join(base, "cgroup")) or "")
    return match.group(1) if match else None
