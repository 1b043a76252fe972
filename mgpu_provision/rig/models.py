"""Pydantic models of the rig file: what a fleet of GPU boxes must look like.

These models are the language of the whole tool and the source of `schemas/rig.schema.json`.
Field-local rules (types, ranges, patterns) live here; rules that relate several fields live in
`rig/rules.py`, so that each rule has its own message and test.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator
from pydantic import Strict as StrictMode

from ..judge.xids import CRITICAL as CRITICAL_XIDS
from .cards import placeholder
from .plain import HealthShape, HostShape, NodeCheckShape, RigShape, SlurmShape, imex_domain, nvml_gres_type

__all__ = ["nvml_gres_type"]  # declared with the shapes (pydantic-free); the rules read it from here

# Values that reach a shell file or a command line: no quotes, no `$`, no backticks, no newlines.
SAFE_TOKEN = r"^[A-Za-z0-9_.,:=@%+/^-]*$"
HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# An Ansible group name: Ansible asks for letters, digits and `_`, and by default still accepts `-` and `.`.
INVENTORY_GROUP = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"
# GPU-<uuid>, MIG-<uuid>, or the older MIG-GPU-<uuid>/<gpu instance>/<compute instance> (CUDA accepts all)
GPU_UUID = r"^(GPU|MIG|MIG-GPU)-[0-9a-fA-F-]{8,}(/[0-9]+/[0-9]+)?$"
DRIVER_VERSION = r"^\d{3,4}(\.\d{1,3}){1,2}$"
DRIVER_BRANCH = r"^\d{3,4}$"
# No leading `-`: a path is passed to sudo and python on the node, where `-s` would be an option.
ABS_OR_RELATIVE_PATH = r"^[A-Za-z0-9_./~+][A-Za-z0-9_./+-]*$"

Port = Annotated[int, Field(ge=1, le=65535, description="TCP port, 1-65535")]
PathStr = Annotated[
    str,
    Field(
        pattern=ABS_OR_RELATIVE_PATH,
        max_length=4096,
        description="a file path: letters, digits and _ . / + - only (no spaces, quotes or $; no leading -)",
    ),
]
HostName = Annotated[str, Field(pattern=HOST_NAME, description="host name: letters, digits, . _ -")]
RigType = Annotated[str, Field(pattern=HOST_NAME, description="a rig type: a key of `rigs`")]
InventoryGroup = Annotated[str, Field(pattern=INVENTORY_GROUP, description="a group of an Ansible inventory")]

# The committed output of `mgpu-provision schema`, in the checkout the tool runs from.
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "rig.schema.json"


def schema_comment(rig_folder: Path) -> str:
    """The editor's schema line for a rig file in `rig_folder`, as the examples write it: a relative path.

    Without a checkout (an installed wheel) there is no schema file to point at; the line then says how
    to make one.
    """
    if not SCHEMA_FILE.exists():
        return (
            "# Editor completion: mgpu-provision schema > rig.schema.json, then put this on line 1:\n"
            "# yaml-language-server: $schema=rig.schema.json"
        )
    return f"# yaml-language-server: $schema={path_in_rig(SCHEMA_FILE, rig_folder)}"


def path_in_rig(path: Path, rig_folder: Path) -> str:
    """`path` as a rig file in `rig_folder` should name it: relative when close by (the loader resolves
    paths against the rig file's folder, so the pair can move together), otherwise absolute."""
    relative = os.path.relpath(path.resolve(), rig_folder.resolve())
    return str(path.resolve()) if relative.startswith("../..") else relative


class Strict(BaseModel):
    """Base of every rig-file model: unknown keys are errors, values are not coerced silently (strict:
    `port: "29500"` is a string where a number belongs, as the JSON Schema says too)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)


class Connection(Strict):
    """How to reach a host. Anything left out comes from `defaults`, then from ~/.ssh/config."""

    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_.-]{0,31}$", description="SSH login user")
    port: Port | None = None
    identity_file: PathStr | None = Field(None, description="private key file; the SSH agent is used too")
    jump: str | None = Field(
        None,
        pattern=r"^([a-z_][a-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9._-]*(:\d{1,5})?$",
        description="jump host ([user@]host[:port] or an ~/.ssh/config alias), like ssh -J",
    )
    become: bool | None = Field(None, description="run the agent with `sudo -n` when the login is not root")
    python: PathStr | None = Field(None, description="python3 (3.8+) on the node that runs the agent")


class Defaults(Connection):
    """Connection settings every host inherits."""

    connect_timeout_s: float = Field(10.0, gt=0, le=600, description="TCP connect + SSH banner timeout")
    command_timeout_s: float = Field(300.0, gt=0, le=7200, description="one agent command's limit")


class Host(Connection, HostShape):
    """One box of the fleet."""

    name: HostName
    address: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$",
        description="IP or DNS name; defaults to the name (so ~/.ssh/config aliases work)",
    )
    rig: str = Field(pattern=HOST_NAME, description="the rig type (a key of `rigs`) this box must match")
    groups: list[Annotated[str, Field(pattern=HOST_NAME)]] = Field(
        default_factory=list, description="extra group names for --limit"
    )
    connection: Literal["ssh", "local"] = Field(
        "ssh", description="ssh (default) or local: run the agent on this machine (demos, the box itself)"
    )
    simulate: PathStr | None = Field(
        None, description="twin file: simulate this node's NVIDIA layer (demos and rehearsal)"
    )
    os: Literal["linux", "windows"] = Field("linux", description="Windows boxes get manual steps for SLI")


class Gpus(Strict):
    model: str = Field(
        min_length=1,
        max_length=96,
        pattern=r"^[A-Za-z0-9 ._()/+-]+$",
        description='exact NVML name, e.g. "NVIDIA GeForce RTX 3090"',
    )

    @field_validator("model")
    @classmethod
    def _not_a_placeholder(cls, value: str) -> str:
        # Checked with the schema, not as a rule: a rig with other errors reports it at once too.
        if placeholder(value):
            raise ValueError(
                f"'{value}' is a placeholder: write the GPU's exact NVML name, as "
                "`nvidia-smi --query-gpu=name --format=csv,noheader` prints it"
            )
        return value

    count: StrictInt = Field(ge=1, le=64, description="number of GPUs every box of this rig has")
    min_pcie_gen: int | None = Field(None, ge=1, le=7, description="lowest PCIe generation (judged by max)")
    min_pcie_width: int | None = Field(None, ge=1, le=32, description="narrowest PCIe link width, e.g. 16")
    persistence_mode: bool | None = Field(None, description="true: ensure persistence mode is on (Linux)")


class Bridge(Strict):
    """The GPU interconnect every box of the rig must have. Checked, never changed."""

    kind: Literal["none", "nvlink-bridge", "nvlink", "nvswitch"] = Field(
        "none",
        description=(
            "none (PCIe only), nvlink-bridge (bridged pairs), nvlink (direct mesh, e.g. DGX-1), "
            "nvswitch (HGX/DGX: every link ends at a switch)"
        ),
    )
    # A YAML pair is a list: the tuple may come from one (StrictMode(False)); its indices may not be strings.
    pairs: list[Annotated[tuple[StrictInt, StrictInt], StrictMode(False)]] = Field(
        default_factory=list, description="GPU index pairs joined by NVLink (bridge or mesh)"
    )
    links: int | None = Field(
        None, ge=1, le=36, description="active links per bridged pair, or per GPU to the switches"
    )
    p2p: bool = Field(True, description="expect peer-to-peer over NVLink between bridged pairs")
    topology_file: PathStr | None = Field(
        None,
        description="`nvidia-smi topo -m` captured from a known-good box (relative to the rig file)",
    )


class DriverRepo(Strict):
    """An internal mirror of the driver's packages (air-gapped or regulated sites): apt, dnf, yum, zypper."""

    url: str = Field(pattern="^https?://[^\\s'\"`$;]+$", description="the mirror's URL (http or https)")
    key: str = Field(
        description="file with the mirror's public signing key (ASCII-armored), relative to the rig file; "
        "apt trusts it for this mirror only, rpm imports it once (dnf, yum, zypper)"
    )
    suite: str = Field("./", pattern=r"^[A-Za-z0-9./_-]+$", description='"./" for a flat repository')
    components: str | None = Field(None, pattern=r"^[A-Za-z0-9_ -]+$", description='e.g. "main contrib"')


IMEX_NODES_CONFIG = "/etc/nvidia-imex/nodes_config.cfg"  # IMEX_NODE_CONFIG_FILE in its config.cfg
ImexPeer = Annotated[str, Field(pattern=r"^[0-9A-Fa-f.:]{2,45}$", description="an IPv4 or IPv6 address")]


class ImexDomain(Strict):
    """Who forms the IMEX domain with this box: NVIDIA's IMEX guide ("Deployment Models") has every node's
    nodes_config.cfg list the IP addresses of all nodes of the domain, the same list on each."""

    peers: list[ImexPeer] | Literal["fleet", "per_job"] = Field(
        "fleet",
        description="the domain's IP addresses; fleet: the addresses of every host of this rig type, in the "
        "rig file's order; per_job: a Slurm prolog writes the file for each job (or SwitchType="
        "switch/nvidia_imex), so nothing is written and the domain is not judged between jobs",
    )
    nodes_config: PathStr = Field(IMEX_NODES_CONFIG, description="the nodes_config.cfg apply writes")


class Driver(Strict):
    version: str | None = Field(None, pattern=DRIVER_VERSION, description='exact version, e.g. "550.54.15"')
    branch: str | None = Field(None, pattern=DRIVER_BRANCH, description='a branch, e.g. "550" (any 550.x)')
    method: Literal["apt", "dnf", "yum", "zypper", "runfile"] | None = Field(
        None,
        description=(
            "package manager (default: the node's, from its os-release): apt (Ubuntu, Debian), dnf (RHEL "
            "8-10 family, Amazon Linux 2023, Fedora), yum (EL7, Amazon Linux 2), zypper (SUSE Linux "
            "Enterprise Server 15, openSUSE Leap 15); or runfile"
        ),
    )
    source: Literal["ubuntu", "cuda", "debian", "rhel"] | None = Field(
        None,
        description=(
            "where the packages come from: ubuntu (Ubuntu's archive), cuda (NVIDIA's CUDA repository), "
            "debian (Debian non-free + contrib), rhel (NVIDIA's dnf module streams); default from os-release"
        ),
    )
    flavor: Literal["default", "server", "open", "server-open"] | None = Field(
        None,
        description=(
            "kernel module and build: open (open kernel modules), server/server-open (Ubuntu's datacenter "
            "builds); proprietary ones are refused on Blackwell and Grace, which run only the open modules"
        ),
    )
    packages: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9+.-]{1,99}$")]] | None = Field(
        None,
        description=(
            "apt only: install exactly these packages of the driver set instead of the source's "
            "(e.g. [nvidia-smi, libnvidia-ml1] for the userspace only, without a kernel module)"
        ),
    )
    hold: bool = Field(True, description="hold/version-lock the packages so upgrades cannot move them")
    reboot: Literal["allowed", "never"] = Field(
        "never", description='allowed: reboot to load a new driver; never: report "reboot required"'
    )
    fabricmanager: bool = Field(False, description="install Fabric Manager at exactly the driver's version")
    imex: bool | ImexDomain = Field(
        False,
        description="multi-node NVLink (GB200/GB300 NVL72 compute trays): nvidia-imex at the driver's "
        "version, its unit enabled and running, an IMEX channel, and nodes_config.cfg listing the domain "
        "(true: `peers: fleet`)",
    )

    @property
    def imex_domain(self) -> ImexDomain | None:
        """The IMEX domain the rig asks for; None without IMEX (`imex: true` is `peers: fleet`)."""
        return imex_domain(self, ImexDomain())
    runfile_url: str | None = Field(None, pattern="^(https://|/)[^\\s'\"`$;]+$", description="runfile source")
    runfile_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    repo: DriverRepo | None = Field(
        None,
        description="install from this mirror (apt: checked in plan to hold the whole set; dnf, yum, zypper: "
        "its signature checked before it is written)",
    )


HealthCheck = Literal[
    "xid",
    "sxid",
    "recovery_action",
    "ecc",
    "memory_repair",
    "nvlink_errors",
    "throttle",
    "power",
    "compute_mode",
    "mig",
    "fabric",
    "kernel",
]
HEALTH_CHECKS: tuple[str, ...] = get_args(HealthCheck)


class DcgmDiag(Strict):
    """DCGM's active diagnostic as a gate of the node check where DCGM is installed (`dcgmi diag -r N -j`);
    without dcgmi the check notes it and goes on."""

    level: Literal[1, 2] = Field(
        1,
        description="1: deployment and software checks (seconds); 2: also PCIe, memory and a short "
        "stress (about two minutes, the GPUs busy)",
    )
    budget_s: float = Field(
        120.0,
        ge=10,
        le=3600,
        description="the diag is ended after this many seconds (a warning says so); each node check run "
        "takes up to this much longer",
    )


class Health(Strict, HealthShape):
    """Health checks on every box of the rig: all on by default; `skip` switches some off."""

    skip: list[HealthCheck] = Field(
        default_factory=list, description="checks to switch off: " + ", ".join(HEALTH_CHECKS)
    )
    critical_xids: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=lambda: list(CRITICAL_XIDS),
        description="Xid codes that fail the xid check; the default: every Xid that NVIDIA's catalog "
        "resolves with a GPU reset or a reboot (the README's table); other known Xids warn",
    )
    ecc: bool | None = Field(None, description="expected ECC mode; null: the mode is not judged (errors are)")
    nvlink_error_max: int = Field(
        100,
        ge=0,
        description="most CRC, replay or recovery errors an active NVLink may count, judged only for agents "
        "that report no counter changes (newer ones are judged by rate: DCGM's limits)",
    )
    power_limit_w: Annotated[int, Field(ge=1, le=5000)] | Literal["default"] | None = Field(
        None,
        description="power limit apply sets on every GPU, in W, or `default` (each GPU's default limit); "
        "absent: the limits are left as they are",
    )
    compute_mode: Literal["default", "exclusive_process", "prohibited"] = Field(
        "default", description="compute mode apply sets on every GPU"
    )
    mig: bool = Field(False, description="expected MIG mode (a change needs a GPU reset: a manual step)")
    dcgm_diag: DcgmDiag | None = Field(
        None,
        description="run DCGM's diagnostic in each node check run by its timer or by hand (not under "
        "Slurm's HealthCheckProgram: slurmd ends it after 60 s); null: no diag",
    )


# "Mosaic" is the X option `SLI` (SLI Mosaic, professional cards); "BaseMosaic" is the X option of that name.
SLI_MODES = ("Off", "Mosaic", "BaseMosaic")


def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


def _sli_mode_schema(schema: dict[str, Any]) -> None:
    # Editors complete the modes and flag a removed one as it is typed; validate accepts any case and
    # YAML 1.1's bare `off` (a boolean false), and explains why a removed mode is refused (rig/rules.py).
    schema.pop("type", None)
    schema["anyOf"] = [
        {"enum": list(SLI_MODES)},
        {"type": "string", "pattern": "^(" + "|".join(_any_case(m) for m in SLI_MODES) + ")$"},
        {"const": False},
    ]


class Sli(Strict):
    mode: str = Field(
        "Off",
        description=(
            "Off (the driver default: no X config snippet), Mosaic (SLI Mosaic, professional cards) or "
            "BaseMosaic (GeForce); graphics only"
        ),
        json_schema_extra=_sli_mode_schema,
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _canonical_mode(cls, value: object) -> object:
        # YAML 1.1 reads a bare `Off`/`On` as a boolean; nvidia-xconfig takes the modes in any case.
        # Unknown modes pass through unchanged so that rig/rules.py can explain why they are refused.
        if isinstance(value, bool):
            return "On" if value else "Off"
        if isinstance(value, str):
            return next((mode for mode in SLI_MODES if mode.lower() == value.lower()), value)
        return value


class Ddp(Strict):
    """How PyTorch DDP finds its peers; written into each node's torchrun launcher and env files."""

    master: HostName = Field(description="host (of the fleet) that runs rank 0 and the rendezvous store")
    port: Port = 29500
    backend: Literal["nccl", "gloo"] = "nccl"
    nproc_per_node: int | None = Field(None, ge=1, le=64, description="defaults to the visible GPU count")
    rdzv_backend: Literal["static", "c10d"] = Field(
        "static", description="static: --node-rank per node; c10d: elastic rendezvous on master:port"
    )
    rdzv_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    ifname: str | None = Field(
        None,
        pattern=r"^[=^]?[A-Za-z0-9_.,:-]{1,64}$",
        description="network interface(s) for NCCL and Gloo (NCCL_SOCKET_IFNAME syntax)",
    )
    fabric: Literal["ethernet", "infiniband", "roce"] | None = Field(
        None,
        description="the network between the nodes; infiniband or roce: smoke fails when NCCL's log shows it "
        "fell back to sockets (NET/Socket) between nodes",
    )
    gpudirect_rdma: bool = Field(
        False, description="smoke fails unless NCCL's channels to other nodes use GPUDirect RDMA (GDRDMA)"
    )


EnvValue = Annotated[str, Field(max_length=4096)]
EnvName = Annotated[str, Field(pattern=ENV_NAME)]
PathEntries = list[Annotated[str, Field(max_length=4096)]]
_PATH_PREPEND = (
    "absolute paths put in front of a search-path variable (PATH, LD_LIBRARY_PATH, ...), each once; "
    "an entry the variable already holds stays where it is"
)


class Files(Strict):
    """Where the managed files go on each node. Relative paths are only allowed for local hosts."""

    profile_d: PathStr | None = "/etc/profile.d/mgpu-provision.sh"
    environment_file: PathStr | None = "/etc/mgpu-provision/environment"
    launcher: PathStr | None = "/usr/local/bin/mgpu-torchrun"
    xorg_conf: PathStr = "/etc/X11/xorg.conf.d/20-mgpu-provision.conf"
    systemd_dir: PathStr | None = Field(
        "/etc/systemd/system",
        description="where apply writes the unit that sets health.compute_mode and health.power_limit_w "
        "at every boot; null: not managed (both are lost at each reboot until the next apply)",
    )
    state_dir: PathStr = Field("/var/lib/mgpu-provision", description="lock file and backups")


SLURM_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class Srun(Strict):
    """What a step started by this tool (smoke --via srun, README's training command) asks Slurm for."""

    partition: str | None = Field(None, pattern=SLURM_NAME, description="srun --partition; null: the default")
    account: str | None = Field(None, pattern=SLURM_NAME, description="srun --account (accounting clusters)")
    reservation: str | None = Field(None, pattern=SLURM_NAME, description="srun --reservation")
    exclusive: bool = Field(True, description="srun --exclusive: no other job on the step's nodes")
    cpus_per_rank: int = Field(
        1, ge=1, le=1024, description="CPUs per rank: --cpus-per-task is this times nproc_per_node"
    )


class Slurm(Strict, SlurmShape):
    """How the box presents its GPUs to Slurm: gres.conf generated from facts, checked against the
    controller's node line."""

    gres_type: str | None = Field(
        None,
        pattern=r"^[a-z0-9_.-]{1,64}$",
        description="the GRES type (gpu:<type>:<n>); default: the NVML name lower-cased with underscores. "
        "A shorter type must be a substring of that, as AutoDetect=nvml matches it",
    )
    gres_conf: PathStr = Field("/etc/slurm/gres.conf", description="the gres.conf apply writes")
    cores: bool = Field(True, description="write Cores= (Slurm's logical core indices near each GPU)")
    socket_layout: Literal["auto", "exact", "sockets", "numa", "l3cache"] = Field(
        "auto",
        description="how Cores= meets Slurm's socket rule (gres.c _check_core_range_matches_sock, 24.11+: "
        "Cores= must cover whole Slurm sockets). exact: the GPU's own cores (Slurm before 24.11); sockets: "
        "the whole sockets they are on; numa: one Slurm socket per NUMA node (slurm.conf: "
        "SlurmdParameters=numa_node_as_socket, Sockets= the NUMA node count); l3cache: one per L3 cache "
        "(SlurmdParameters=l3cache_as_socket, gres.shtml's recommendation for AMD); auto: exact before "
        "24.11, sockets from 24.11 (or when slurmd's version is unknown)",
    )
    memory_headroom_percent: float = Field(
        3.0,
        ge=0,
        le=50,
        description="RealMemory is MemTotal less this share: a later drop below RealMemory (a kernel "
        "reserving more, crashkernel, an offlined DIMM) makes the node INVAL (Low RealMemory)",
    )
    mem_spec_limit_mib: int | None = Field(
        None, ge=1, description="MemSpecLimit= on the node line (memory kept from jobs); null: none"
    )
    autodetect: Literal["off", "nvidia"] = Field(
        "off",
        description="gres.conf AutoDetect: off (the lines say it all) or nvidia (Slurm 24.11+ reads the "
        "GPUs itself, no NVML library needed; the lines then sanity-check it)",
    )
    srun: Srun = Field(default_factory=Srun, description="what steps this tool starts ask Slurm for")
    links: bool = Field(True, description="write Links= (NVLinks to each other GPU, from the facts)")
    health_check: PathStr | None = Field(
        None,
        description="the node check (mgpu-provision-check) to run as slurmd's HealthCheckProgram through a "
        "managed script that drains the node on a failed check; null: none",
    )
    health_script: PathStr = Field(
        "/usr/local/bin/mgpu-provision-slurm-health", description="where that script is written"
    )
    restart_command: list[Annotated[str, Field(pattern=SAFE_TOKEN, min_length=1)]] = Field(
        default_factory=lambda: ["systemctl", "restart", "slurmd"],
        min_length=1,
        description="what apply runs when gres.conf changed (slurmd reads gres.conf only when it starts)",
    )


ContainerRuntime = Literal["docker", "containerd", "cri-o", "podman"]


class Cdi(Strict):
    """The CDI spec apply keeps with `nvidia-ctk cdi generate` (flags of cmd/nvidia-ctk/cdi/generate)."""

    output: PathStr = Field(
        "/etc/cdi/nvidia.yaml",
        pattern=r"^/(etc|var/run|run)/cdi/[A-Za-z0-9_.-]+\.(yaml|json)$",
        description="the spec file (.yaml or .json) under /etc/cdi or /var/run/cdi; where the toolkit's "
        "refresh service (nvidia-cdi-refresh, 1.18+) is enabled its /var/run/cdi/nvidia.yaml is kept instead",
    )
    driver_root: PathStr = Field("/", description="--driver-root: where the driver's files are (/ on a host)")
    hook_path: PathStr | None = Field(
        None,
        description="--nvidia-cdi-hook-path: the program the spec's hooks run; default "
        "/usr/bin/nvidia-cdi-hook (toolkit 1.16 and later), /usr/bin/nvidia-ctk before (its `hook` command)",
    )


class Containers(Strict):
    """The NVIDIA Container Toolkit, pinned like the driver; the CDI spec kept in step with the driver; the
    runtimes configured for it."""

    toolkit: str = Field(pattern=r"^\d+\.\d+\.\d+$", description='exact toolkit version, e.g. "1.17.8"')
    hold: bool = Field(True, description="hold/version-lock the toolkit's packages at that version")
    runtimes: list[ContainerRuntime] = Field(
        default_factory=list,
        description="runtimes to configure with `nvidia-ctk runtime configure` (docker, containerd, cri-o) "
        "and to check; podman reads the CDI spec itself",
    )
    cdi: Cdi = Field(default_factory=Cdi)


class Rig(Strict, RigShape):
    """A rig type: what every box that names it must look like."""

    gpus: Gpus
    bridge: Bridge = Bridge()
    driver: Driver | None = None
    sli: Sli | None = None
    # StrictInt: YAML's `true` is not GPU 1, and "0" is not GPU 0 (UUIDs are the only strings).
    visible_devices: list[StrictInt | Annotated[str, Field(pattern=GPU_UUID)]] | None = Field(
        None, description="GPU indices or UUIDs CUDA may see (CUDA_VISIBLE_DEVICES); default all"
    )
    ddp: Ddp | None = None
    slurm: Slurm | None = Field(None, description="the box runs slurmd: gres.conf and Slurm checks")
    containers: Containers | None = Field(
        None, description="GPU containers: the NVIDIA Container Toolkit, its CDI spec and runtimes"
    )
    health: Health = Field(default_factory=Health, description="GPU health checks (all on by default)")
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="extra variables for this rig, merged over the fleet's `env`"
    )
    path_prepend: dict[EnvName, PathEntries] = Field(
        default_factory=dict,
        description=_PATH_PREPEND + "; a variable listed here replaces the fleet's list for it",
    )


class Smoke(Strict):
    python: PathStr = Field("python3", description="interpreter with torch on the nodes")
    timeout_s: float = Field(180.0, gt=0, le=7200)
    batch_size: int = Field(8, ge=1, le=65536)
    busbw_floor_gbps: float | None = Field(None, ge=0, description="fail when all_reduce busbw is below")
    baseline_drop: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="fail when busbw dropped by more than this share below the box's own baseline (the "
        "figure its last passing smoke of the same group recorded)",
    )
    sizes_mib: list[Annotated[float, Field(gt=0, le=16384)]] | None = Field(
        None,
        description="all_reduce sizes to time; default 1 to 256 MiB on GPUs (NCCL), 0.25 to 4 MiB with Gloo",
    )


class Reclaim(Strict):
    policy: Literal["never", "orphans", "orphans+patterns"] = "orphans"
    patterns: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, description="regexes on the command line (with orphans+patterns)"
    )
    grace_s: float = Field(10.0, ge=0, le=600, description="SIGTERM, then SIGKILL after this long")

    @field_validator("patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from exc
        return value


# A systemd time span as the timer's OnUnitActiveSec reads it: one number and one unit.
TIME_SPAN = r"^[1-9][0-9]{0,5}(s|min|h)$"


class NodeCheck(Strict, NodeCheckShape):
    """The check every node runs on itself (`mgpu-provision-check`), installed by apply: the shipped judge
    over the node's own facts and the expectations apply wrote, run by a systemd timer, Slurm or by hand."""

    interval: str | None = Field(
        "5min",
        pattern=TIME_SPAN,
        description="how often the systemd timer runs the check (a systemd time span: 30s, 5min, 1h); "
        "null: no timer (Slurm's HealthCheckProgram or cron runs the command)",
    )
    # Slurm kills HealthCheckProgram after 60 s (slurm.conf), and a check must end on its own before that.
    deadline_s: float = Field(
        45.0, ge=10, le=55, description="the check ends within this many seconds, even when NVML hangs"
    )
    textfile_dir: PathStr | None = Field(
        None,
        description="node_exporter's textfile collector folder: each run writes mgpu-provision-check.prom "
        "there; null: no metrics file",
    )
    command: PathStr = Field("/usr/local/bin/mgpu-provision-check", description="the check's command")
    agent: PathStr = Field(
        "/usr/local/lib/mgpu-provision/agent.pyz", description="the agent the command runs (a zipapp)"
    )
    expectations: PathStr = Field(
        "/etc/mgpu-provision/expectation.json", description="what the node holds itself to (JSON)"
    )


class RigFile(Strict):
    """The whole rig file."""

    version: Literal[1] = Field(1, description="rig file format version")
    defaults: Defaults = Defaults()
    hosts: list[Host] = Field(
        default_factory=list, description="the boxes of the fleet (at least one here or in `inventory`)"
    )
    inventory: PathStr | None = Field(
        None,
        description="an Ansible inventory (ini or yaml, relative to the rig file) whose `rig_groups` are "
        "hosts of the fleet too; needs the extra: pip install 'mgpu-provision[ansible]'",
    )
    rig_groups: dict[InventoryGroup, RigType] = Field(
        default_factory=dict,
        description="inventory group -> rig type: every host of the group (and of its child groups) is a "
        "box of that rig type",
    )
    groups: dict[Annotated[str, Field(pattern=HOST_NAME)], list[HostName]] = Field(
        default_factory=dict, description="named groups of hosts, for --limit"
    )
    rigs: dict[Annotated[str, Field(pattern=HOST_NAME)], Rig] = Field(min_length=1)
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        description="variables for every node (NCCL_*, GLOO_*, ...); values are literal data ($ included)",
    )
    path_prepend: dict[EnvName, PathEntries] = Field(default_factory=dict, description=_PATH_PREPEND)
    files: Files = Files()
    smoke: Smoke = Smoke()
    reclaim: Reclaim = Reclaim()
    node_check: NodeCheck | None = Field(
        None, description="install the node check on every Linux host (apply writes and removes it)"
    )
