"""The machine's CPU layout and memory as Slurm counts them, and what Slurm itself says about this node.

Slurm's gres.conf `Cores=` are its logical core indices (cores numbered socket by socket), not the OS CPU
ids that `nvidia-smi topo -m` prints (those include SMT siblings): mapping one onto the other needs every
CPU's socket and core. slurm.conf's NodeName line needs sockets, cores per socket, threads per core and
memory. Where slurmd is installed, `slurmd -C` says what it would register and `scontrol show node -o` what
the controller holds, so a check can compare them with the facts before slurmd marks the node INVAL.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from ...catalog.cpulist import parse_cpu_list
from ..core.system import read_text

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
        threads.append({"cpu": cpu, "socket": int(package), "core": int(core), "numa": numa.get(cpu)})
    if not threads:
        return None
    return {"threads": threads, "memory_mib": _memory_mib(meminfo)}


def _memory_mib(meminfo: str) -> Optional[int]:
    for line in (read_text(meminfo) or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def simulated_machine(
    sockets: int, cores_per_socket: int, threads_per_core: int, memory_mib: int
) -> Dict[str, Any]:
    """A machine numbered as Linux numbers most x86 boxes: first every core's first thread, socket by socket,
    then the SMT siblings in the same order (so CPU n and n + cores are one core)."""
    cores = sockets * cores_per_socket
    threads = [
        {
            "cpu": thread * cores + socket * cores_per_socket + core,
            "socket": socket,
            "core": core,
            "numa": socket,
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
    return subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_SLURM_TIMEOUT_S, check=False
    )


def find_tool(name: str) -> Optional[str]:
    """Slurm's `name` on PATH or in the sbin folders a login shell over SSH may not have on it."""
    import shutil  # here: every facts call pays for its imports, and only Slurm's boxes need this one

    return shutil.which(name) or next(
        (p for p in ("/usr/sbin/" + name, "/usr/local/sbin/" + name) if os.access(p, os.X_OK)), None
    )


def registered_name(slurmd: Optional[str], hostname: str) -> Tuple[Optional[Dict[str, str]], str]:
    """What slurmd would register (`slurmd -C`, None where it cannot say) and the node's name in it."""
    if slurmd is None:
        return None, hostname
    local = run_tool([slurmd, "-C"])
    lines = local.stdout.splitlines()
    registers = parse_key_values(lines[0]) if local.returncode == 0 and lines else None
    return registers, (registers or {}).get("NodeName", hostname)


def controller_line(scontrol: str, name: str) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
    """The controller's `scontrol show node -o` line for `name`, or None and what scontrol said instead."""
    remote = run_tool([scontrol, "show", "node", "-o", name])
    if remote.returncode == 0 and remote.stdout.strip():
        return parse_key_values(remote.stdout.splitlines()[0]), None
    said = (remote.stderr or remote.stdout).strip().splitlines()
    return None, "scontrol show node {}: {}".format(name, said[-1] if said else "no answer")


def slurm(hostname: str, minors: List[Optional[int]], dev_dir: str = "/dev") -> Optional[Dict[str, Any]]:
    """What slurmd would register (`slurmd -C`), the controller's line for this node, and which of the GPUs'
    /dev/nvidia<minor> are missing (slurmd exits when a gres.conf File= is); None without slurmd. A
    controller that cannot be reached is an `error`, never a failure of the verb."""
    slurmd = find_tool("slurmd")
    if slurmd is None:
        return None
    devices = [os.path.join(dev_dir, "nvidia{}".format(minor)) for minor in minors if minor is not None]
    missing = [device for device in devices if not os.path.exists(device)]
    found: Dict[str, Any] = {"registers": None, "controller": None, "error": None, "missing_devices": missing}
    try:
        found["registers"], name = registered_name(slurmd, hostname)
        scontrol = find_tool("scontrol")
        if scontrol is None:
            found["error"] = "scontrol is not installed"
            return found
        found["controller"], found["error"] = controller_line(scontrol, name)
    except (OSError, subprocess.TimeoutExpired) as exc:
        found["error"] = "slurm: {}".format(exc)
    return found
