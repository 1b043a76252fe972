"""Builders every test shares: facts as the agent reports them, twins as people write them, rigs, processes.

One place builds each kind of test object, so that a change to the facts contract or the twin format is made
once here rather than in every test module that needs a box; test modules import from here, never from each
other.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mgpu_provision import protocol
from mgpu_provision.catalog.topology import nvlink_count, parse_topology
from mgpu_provision.facts import Facts
from mgpu_provision.fleet.options import AgentPayload, FleetOptions
from mgpu_provision.fleet.session import AgentSession
from mgpu_provision.fleet.targets import HostTarget
from mgpu_provision.node.host.procs import ProcInfo
from mgpu_provision.node.nvidia.select import select_backend
from mgpu_provision.node.verbs.facts import collect

if TYPE_CHECKING:
    from tests.support.hosts import HostFactory, TestHost

REPO = Path(__file__).resolve().parents[2]
TWINS_DIR = REPO / "examples" / "twins"
TOPOLOGIES = REPO / "tests" / "fixtures" / "topologies"
# Stands in for the smoke python on simulated boxes: torch that sees the twin's two GPUs.
FAKE_TORCH = '#!/bin/sh\necho \'{"version": "2.13.0", "cuda_available": true, "device_count": 2}\'\n'

HOST_INFO: dict[str, Any] = {
    "hostname": "gpu-a",
    "os": "Ubuntu 22.04.4 LTS",
    "os_id": "ubuntu",  # os-release as the node reads it: a box without one is never taken for Ubuntu
    "os_version_id": "22.04",
    "os_like": ["debian"],
    "kernel": "5.15.0-105-generic",
    "arch": "x86_64",
    "boot_id": "0c9ad0e5-7e2f-4f37-9d1c-3f8a3f0f0a11",
    "python": "3.10.12",
    "user": "root",
}
DRIVER_OK: dict[str, Any] = {
    "nvml": "ok",
    "version": "550.54.15",
    "installed": "550.54.15",
    "loaded": "550.54.15",
    "cuda": "12.4",
}


# --- facts ---------------------------------------------------------------------------------------------


def facts(**fields: Any) -> Facts:
    """Facts of a healthy box with no GPUs unless given: every top-level field may be replaced, and
    `host` / `driver` given as dicts are merged over the defaults."""
    document: dict[str, Any] = {"agent_version": "0.1.0", "host": dict(HOST_INFO), "driver": dict(DRIVER_OK)}
    for key in ("host", "driver"):
        document[key].update(fields.pop(key, {}))
    document.update(fields)
    return Facts.model_validate(document)


def gpu(index: int, name: str = "NVIDIA GeForce RTX 3090", **fields: Any) -> dict[str, Any]:
    """One GPU as the facts verb reports it (a stable UUID and bus id per index)."""
    return {
        "index": index,
        "name": name,
        "uuid": f"GPU-00000000-0000-0000-0000-{index:012d}",
        "pci_bus_id": bus_id(index),
        "memory_mib": 24576,
        **fields,
    }


def bus_id(index: int) -> str:
    return f"00000000:{0x11 + 0x10 * index:02X}:00.0"


def box_facts(box: dict[str, Any]) -> dict[str, Any]:
    """Facts fields of a box wired as a `topo -m` file in tests/fixtures/topologies says, then broken as
    `box` says: `model`, `names` (odd GPUs), `down` links, `pcie` links, `nvswitch`, `persistence`, `lost`
    (GPUs NVML answers GpuIsLost for)."""
    matrix = parse_topology((TOPOLOGIES / box["topology"]).read_text())
    n = matrix.gpu_count
    nvswitch = bool(box.get("nvswitch", False))
    names = {int(k): v for k, v in box.get("names", {}).items()}
    down = {(d["gpu"], d["link"]) for d in box.get("down", [])}
    pcie = {int(k): v for k, v in box.get("pcie", {}).items()}
    gpus: list[dict[str, Any]] = []
    for i in range(n):
        ends: list[tuple[str, str | None]] = []  # (remote type, remote bus id) per link, in link order
        for j in range(n):
            if j != i:
                links = nvlink_count(matrix.gpu_cell(i, j))
                if nvswitch:
                    ends = [("switch", "00000000:C1:00.0")] * links  # every pair: the links to the fabric
                else:
                    ends += [("gpu", bus_id(j))] * links
        nvlinks = [
            {"link": k, "active": (i, k) not in down, "remote_type": t, "remote_pci_bus_id": b}
            for k, (t, b) in enumerate(ends)
        ]
        gpus.append(
            gpu(
                i,
                names.get(i, box["model"]),
                persistence_mode=box.get("persistence", True),
                pcie={"gen": 1, "width": 16, "max_gen": 4, "max_width": 16, **pcie.get(i, {})},
                nvlinks=nvlinks,
            )
        )
    pairs = []
    for i in range(n):
        for j in range(i + 1, n):
            cell = matrix.gpu_cell(i, j)
            links = nvlink_count(cell)
            lost = sum(
                1
                for g, k in down
                if g in (i, j)
                and (nvswitch or gpus[g]["nvlinks"][k]["remote_pci_bus_id"] == bus_id(i + j - g))
            )
            active = max(0, links - lost)
            pcie_cell = None if links else cell
            p2p = "OK" if active else "NS"
            pairs.append({"a": i, "b": j, "pcie": pcie_cell, "nvlinks": active, "p2p_nvlink": p2p})
    lost = set(box.get("lost", []))  # GPUs NVML answers GpuIsLost for: out of gpus and pairs
    return {
        "gpus": [g for g in gpus if g["index"] not in lost],
        "lost_gpus": [{"index": i, "pci_bus_id": bus_id(i), "error": "GPU is lost"} for i in sorted(lost)],
        "pairs": [p for p in pairs if not lost & {p["a"], p["b"]}],
        "nvswitch": nvswitch,
        "driver": dict(DRIVER_OK),
    }


def case_health(health: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """`health:` of a case: every GPU healthy (what a GeForce card answers), then `gpus: {"1": {...}}` patches
    single GPUs; `xid`, `sxid`, `kernel`, `not_checked` and the counters' interval (`counters_since`,
    `counters_interval_s`, `xid_change`) are taken as given."""
    patches = {int(k): v for k, v in (health.get("gpus") or {}).items()}
    host = ("sxid", "counters_since", "counters_interval_s", "xid_change")
    return {
        **{key: health[key] for key in host if key in health},
        "gpus": [
            {"index": g["index"], "compute_mode": "default", "throttle": [], **patches.get(g["index"], {})}
            for g in gpus
        ],
        "xid": health.get("xid", []),
        "xid_source": "journal",
        "kernel": health.get("kernel"),
        "not_checked": health.get("not_checked", []),
    }


def case_facts(case: dict[str, Any]) -> Facts:
    """Facts of a plan case (tests/unit/plan_cases): `box:` built, then `facts:` keys, `health:` (see
    `case_health`) and `facts_patch_pairs:` ("a-b": {...}) over it."""
    facts: dict[str, Any] = {"agent_version": "0.1.0", "host": HOST_INFO, "driver": dict(DRIVER_OK)}
    if "box" in case:
        facts.update(box_facts(case["box"]))
    facts.update(case.get("facts") or {})
    if "health" in case:
        facts["health"] = case_health(case["health"], facts.get("gpus", []))
    for key, patch in (case.get("facts_patch_pairs") or {}).items():
        a, b = (int(i) for i in key.split("-"))
        pair = next(p for p in facts["pairs"] if (p["a"], p["b"]) == (a, b))
        pair.update(patch)
    return Facts.model_validate(facts)


def twin_state_dir(twin: Path | str) -> str:
    """The state folder the unit tests give a twin's node: `lock/` beside the twin, where their applies
    take the host lock (a simulated node keeps its overlay in its state folder)."""
    return str(Path(twin).parent / "lock")


def facts_from_twin(twin: Path | str | None, **args: Any) -> Facts:
    """The agent's own `facts` verb run in this process on a twin (None: this machine's real NVIDIA layer),
    passed through JSON and the contract as the control side receives it."""
    twin_backend = select_backend(str(twin), twin_state_dir(twin)) if twin else select_backend(None)
    raw = collect(protocol.check_args("facts", args), twin_backend)
    return Facts.model_validate(json.loads(json.dumps(raw)))


# --- targets -------------------------------------------------------------------------------------------


def local_target(**changes: Any) -> HostTarget:
    """A `connection: local` target running the agent with this interpreter; fields replaced by `changes`."""
    fields: dict[str, Any] = dict(
        name="me",
        address="127.0.0.1",
        port=None,
        user=None,
        identity_file=None,
        jump=None,
        become=False,
        python=sys.executable,
        connection="local",
        simulate="/twins/x.yaml",
        connect_timeout_s=5.0,
        command_timeout_s=10.0,
    )
    fields.update(changes)
    return HostTarget(**fields)


def ssh_target(**changes: Any) -> HostTarget:
    """An SSH target at an address nothing answers on (for message and command-line tests)."""
    return local_target(connection="ssh", address="10.0.0.1", port=2222, user="root", **changes)


# --- twins ----------------------------------------------------------------------------------------------


def example_twin(name: str) -> dict[str, Any]:
    """An example twin under examples/twins/ as data (e.g. "rtx3090-nvlink")."""
    data: dict[str, Any] = yaml.safe_load((TWINS_DIR / f"{name}.yaml").read_text())
    return data


def rtx3090_twin(
    driver: str = "550.54.15", persistence: tuple[bool, bool] = (False, False), **more: Any
) -> dict[str, Any]:
    """The 2x RTX 3090 NVLink example twin with the driver installed and loaded at `driver`."""
    data = example_twin("rtx3090-nvlink")
    data["driver"].update(version=driver, loaded=driver)
    for one, on in zip(data["gpus"], persistence, strict=True):
        one["persistence"] = on
    data.update(more)
    return data


def write_twin(folder: Path, topology: str | None, gpu_count: int, **extra: Any) -> Path:
    """A twin of `gpu_count` RTX 3090s with a `topo -m` matrix (or none), written as JSON."""
    twin: dict[str, Any] = {
        "driver": {"version": "550.54.15", "loaded": "550.54.15", "cuda": "12.4"},
        "gpus": [{"name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576} for _ in range(gpu_count)],
        "topology": topology,
    }
    twin.update(extra)
    path = folder / "twin.json"
    path.write_text(json.dumps(twin))
    return path


# --- rig files --------------------------------------------------------------------------------------------


def pair_rig_file(
    factory: HostFactory,
    path: Path,
    hosts: list[TestHost],
    reboot: str = "allowed",
    env: str = "a",
    sli: str = "Off",
    model: str = "NVIDIA GeForce RTX 3090",
) -> Path:
    """A rig file for test hosts running the RTX 3090 pair twin, with a fake smoke python beside it."""
    fake = path.parent / "torch-python"
    fake.write_text(FAKE_TORCH)
    fake.chmod(0o755)
    rig = {
        "gpus": {"model": model, "count": 2, "persistence_mode": True},
        "bridge": {"kind": "nvlink-bridge", "pairs": [[0, 1]], "links": 4},
        "driver": {"version": "550.54.15", "reboot": reboot},
        "sli": {"mode": sli},
        "ddp": {"master": hosts[0].name, "backend": "gloo", "ifname": "lo"},
    }
    return factory.write_rig(
        path, hosts, rigs={"pair": rig}, smoke={"python": str(fake)}, env={"MGPU_ROUND": env}
    )


# --- processes as /proc shows them (reclaim's classifier) ----------------------------------------------


def proc(pid: int, ppid: int, argv: str = "python train.py", **kw: object) -> ProcInfo:
    """A process; by default a member of the login shell's job (pid 50) with nothing special about it."""
    fields: dict[str, object] = {
        "pid": pid,
        "ppid": ppid,
        "state": "S",
        "comm": os.path.basename(argv.split()[0]) if argv else "x",
        "argv": argv.split(),
        "uid": 1000,
        "start_ticks": 1000 + pid,
        "sid": 50,
        "unit": "session-3.scope",
        "alive": True,
        "pgid": 50,
        "ignores_hup": False,
        "torchrun_run": None,
    }
    fields.update(kw)
    return ProcInfo(**fields)  # type: ignore[arg-type]


def job(pid: int, ppid: int, argv: str = "python train.py", **kw: object) -> ProcInfo:
    """A process leading its own process group in the login shell's session (an interactive shell's job)."""
    return proc(pid, ppid, argv, **{"pgid": pid, **kw})


def session(pid: int, ppid: int, argv: str = "python train.py", **kw: object) -> ProcInfo:
    """A process that leads its own session (setsid, sshd's command shell, a container's init)."""
    return proc(pid, ppid, argv, **{"pgid": pid, "sid": pid, **kw})


INIT = session(1, 0, "/sbin/init", comm="systemd", unit="init.scope")
SHELL = session(50, 40, "-bash", comm="bash")  # the user's login shell; absent from a tree after logout


# --- a node behind a session: the one fake of the transport ----------------------------------------------

# What a fake node does with one call: (verb, args, timeout) -> the verb's result, or raise what a real
# session raises (ConnectionFailed: the host is gone; AgentError: the agent answered an error).
Answer = Callable[[str, dict[str, Any], float], dict[str, Any]]


@dataclass(frozen=True)
class FakeAgent:
    data: bytes = b""
    name: str = "agent-fake.pyz"


class FakeSession(AgentSession):
    """An agent session whose node is `answer`: the real `call` (request envelope, reply parsing, the
    default timeout) around it, so jobs meet the same seam as over SSH. `calls` records (verb, args)."""

    def __init__(self, target: HostTarget, answer: Answer) -> None:
        super().__init__(target, FakeAgent())
        self.answer = answer
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _run(self, command: str, stdin: str, limit: float, verb: str) -> tuple[int, str, str]:
        self.commands += 1
        args = json.loads(stdin)["args"]
        self.calls.append((verb, args))
        result = self.answer(verb, args, limit)
        return 0, json.dumps({"ok": True, "agent_version": "test", "result": result}), ""

    def _upload(self, folder: str) -> None:
        raise AssertionError("a fake node never asks for the agent")

    def _needs_sudo(self) -> bool:
        return False


def fake_fleet(node: Callable[[HostTarget], Answer], **options: Any) -> FleetOptions:
    """FleetOptions whose every session is a FakeSession: `node(target)` is that host's answer (raise
    ConnectionFailed in `node` for a host that cannot be reached)."""

    def open_fake(target: HostTarget, options: FleetOptions, agent: AgentPayload) -> AgentSession:
        return FakeSession(target, node(target))

    return FleetOptions(agent=FakeAgent(), sessions=open_fake, **options)
