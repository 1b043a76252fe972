"""Typed facts about one node, exactly as the node agent's `facts` verb reports them.

This is the contract between the node agent (which emits plain JSON, stdlib only) and the control side
(plan, render). The agent's output is validated against these models on arrival, so a protocol drift is
caught at the seam with a clear message instead of deep inside a diff. Unknown keys are ignored so that a
newer agent can add facts without breaking an older control side. They are plain records (`records.py`),
not pydantic models: every plan reads facts, and pydantic's import and model building cost more than the
rest of a small run (issue 41).
"""

from __future__ import annotations

from typing import Literal

from .records import Field, Record

FACTS_SCHEMA_VERSION = 1


class Fact(Record):
    """A part of the facts: frozen, unknown keys ignored."""


class HostInfo(Fact):
    hostname: str
    os: str = Field(description='PRETTY_NAME of /etc/os-release, e.g. "Debian GNU/Linux 12 (bookworm)"')
    kernel: str
    arch: str
    boot_id: str
    machine_id: str | None = Field(None, description="/etc/machine-id, None when empty or unreadable")
    python: str = Field(description="version of the python running the agent")
    user: str = Field(description="the user the agent runs as")
    simulated: bool = Field(False, description="the NVIDIA layer comes from a twin file")
    os_id: str | None = Field(
        None, description='ID of /etc/os-release, e.g. "debian" (picks the driver source)'
    )
    os_version_id: str | None = Field(None, description='VERSION_ID of /etc/os-release, e.g. "12"')
    os_like: list[str] = Field(default_factory=list, description="ID_LIKE of /etc/os-release")
    os_platform_id: str | None = Field(
        None, description='PLATFORM_ID of /etc/os-release, e.g. "platform:el9" (the RHEL release it follows)'
    )


NvmlStatus = Literal["ok", "no-driver", "driver-not-loaded", "version-mismatch", "no-permission", "error"]


class DriverInfo(Fact):
    nvml: NvmlStatus = Field(description="whether NVML could be initialised, and if not, why")
    message: str | None = Field(None, description="plain explanation when nvml is not ok")
    version: str | None = Field(None, description="userspace driver version (NVML), None when unknown")
    cuda: str | None = Field(None, description='CUDA driver API version, e.g. "12.4"')
    loaded: str | None = Field(None, description="kernel module version from /proc/driver/nvidia/version")
    installed: str | None = Field(None, description="userspace version installed on disk (packages)")
    reboot_required: bool = Field(
        False,
        description="the installed userspace driver is not the loaded kernel module (or none is loaded)",
    )
    kernel_module: Literal["open", "proprietary"] | None = Field(
        None, description="which kernel modules are loaded (/proc/driver/nvidia/version), None when none"
    )
    installed_module: Literal["open", "proprietary"] | None = Field(
        None,
        description="which kernel modules are installed for the running kernel (modinfo's license), the ones "
        "the next boot loads; None when unknown",
    )
    unheld: list[str] = Field(
        default_factory=list, description="packages of the installed driver set that apt does not hold"
    )
    nouveau: bool = Field(False, description="nouveau is loaded (it holds the GPU; the runfile refuses)")


class PcieLink(Fact):
    gen: int | None = None
    width: int | None = None
    max_gen: int | None = None
    max_width: int | None = None


NvlinkRemote = Literal["gpu", "switch", "ibmnpu", "unknown"]


class NvLink(Fact):
    link: int
    active: bool
    remote_type: NvlinkRemote | None = None
    remote_pci_bus_id: str | None = None


class LostGpu(Fact):
    """A GPU NVML enumerates but answers GpuIsLost for (fallen off the bus); kept out of `gpus`."""

    index: int
    pci_bus_id: str | None = Field(None, description="its PCI address, when NVML still knows it")
    error: str = Field(description='NVML\'s words, e.g. "GPU is lost"')


class GpuFabric(Fact):
    """Where the NVLink fabric placed a GPU: GPUs of one NVLink domain share cluster UUID and clique id."""

    clique_id: int
    cluster_uuid: str


class Gpu(Fact):
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_mib: int
    persistence_mode: bool | None = None
    minor_number: int | None = Field(None, description="N of /dev/nvidiaN; None from an older agent")
    cpu_affinity: str | None = Field(
        None, description='OS CPUs near the GPU as topo -m prints them ("0-3,8-11", SMT siblings included)'
    )
    pcie: PcieLink = PcieLink()
    nvlinks: list[NvLink] = Field(default_factory=list)
    fabric: GpuFabric | None = Field(None, description="NVLink fabric registration; None outside one")


P2PStatus = Literal["OK", "CNS", "GNS", "TNS", "DR", "NS", "U"]


class GpuPair(Fact):
    """Relation of two GPUs (a < b) in `nvidia-smi topo -m` words."""

    a: int
    b: int
    pcie: str | None = Field(None, description="PIX, PXB, PHB, NODE or SYS; None when NVML cannot say")
    nvlinks: int = Field(0, description="active NVLinks joining the pair (on NVSwitch boxes: via switches)")
    p2p_read: P2PStatus | None = None
    p2p_nvlink: P2PStatus | None = None

    @property
    def cell(self) -> str:
        """The pair's cell as `nvidia-smi topo -m` prints it."""
        return f"NV{self.nvlinks}" if self.nvlinks else (self.pcie or "?")


class Board(Fact):
    vendor: str | None = None
    model: str | None = None


ServiceState = Literal["active", "inactive", "failed", "absent", "unknown"]


class FabricManager(Fact):
    version: str | None = Field(None, description="installed package version, None when not installed")
    service: ServiceState = "unknown"
    enabled: bool | None = Field(
        None, description="the unit starts at boot (NVIDIA's packages do not enable it)"
    )


class PersistenceDaemon(Fact):
    service: ServiceState = Field("unknown", description="nvidia-persistenced's state; absent: not installed")
    enabled: bool | None = Field(None, description="it starts at boot and puts every GPU in persistence mode")
    exec_start: str | None = Field(
        None, description="the unit's effective ExecStart (drop-ins merged); None: not read"
    )


class DriverMirror(Fact):
    """The driver's set simulated against `driver.repo` alone (apt-get -s in private folders)."""

    missing: list[str] = Field(default_factory=list, description="packages the mirror lacks")
    error: str | None = Field(None, description="why the mirror could not be read or trusted")


class ImexNode(Fact):
    """One node of the IMEX domain as `nvidia-imex-ctl -N -j` lists it."""

    index: int | None = None
    host: str | None = Field(None, description="its address in nodes_config.cfg")
    status: str | None = Field(None, description="its daemon's state: READY, WAITING_FOR_PEERS, ...")
    unconnected: list[str] = Field(default_factory=list, description="peers it is not CONNECTED to")


class ImexDomainState(Fact):
    """The IMEX domain as the running daemon sees it (`nvidia-imex-ctl -N -j`)."""

    status: str = Field(description="UP, DOWN, DEGRADED; NOT_CONFIGURED or UNAVAILABLE when it cannot say")
    nodes: list[ImexNode] = Field(default_factory=list)
    error: str | None = Field(None, description="why the status could not be read")


class Imex(Fact):
    """nvidia-imex, the daemon of multi-node NVLink (GB200 NVL72 compute trays)."""

    version: str | None = Field(None, description="installed package version, None when not installed")
    service: ServiceState = "unknown"
    enabled: bool | None = None
    channels: int | None = Field(None, description="IMEX channel devices; None: not read")
    domain: ImexDomainState | None = Field(None, description="None: the daemon is not running (or not asked)")


class Unit(Fact):
    """A systemd unit the facts request named (`units`), such as the one that sets GPU settings at boot."""

    service: ServiceState = Field("unknown", description="absent: no such unit; unknown: no systemd to ask")
    enabled: bool | None = Field(None, description="it starts at boot")


class SliConfig(Fact):
    mode: str | None = Field(None, description='the X config\'s Option "SLI" value, None when unset')
    file: str | None = Field(None, description="the file it was read from")


class XorgLayout(Fact):
    """A ServerLayout section of the node's X config: X uses its screens and ignores every other Screen."""

    file: str
    screens: list[str] = Field(default_factory=list, description="the Screen identifiers it lists")


class ManagedFile(Fact):
    path: str
    exists: bool
    sha256: str | None = None
    mode: str | None = Field(None, description='octal permission bits, e.g. "0644"')
    content: str | None = Field(None, description="text content, when small and requested for a diff")


class GpuProcess(Fact):
    pid: int
    gpu: int
    used_mib: int | None = None
    command: str | None = None
    ppid: int | None = None
    owner: str | None = None
    start_time: float | None = Field(None, description="seconds since the epoch")
    state: str | None = Field(None, description="process state letter from /proc (Z = zombie)")
    orphaned: bool = False
    torchrun_job: bool = Field(False, description="a live torchrun/torchelastic agent is an ancestor")
    alive: bool = True
    mps_server: int | None = Field(
        None, description="an MPS client: the pid of the nvidia-cuda-mps-server it runs through"
    )
    slurm_job: str | None = Field(
        None, description="the Slurm job it runs in (its SLURM_JOB_ID, or its job_<id> cgroup), None: none"
    )


class TorchInfo(Fact):
    python: str
    ok: bool
    version: str | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    error: str | None = None


class NvlinkErrors(Fact):
    """Error counters of one active NVLink since the driver loaded; None = this GPU cannot count it."""

    link: int
    crc: int | None = Field(None, description="CRC errors (flit + data)")
    replay: int | None = None
    recovery: int | None = None
    recovery_events: int | None = Field(None, description="link recoveries, whatever their result (NVLink5)")
    recovery_failed: int | None = Field(None, description="recoveries that left the link down (NVLink5)")
    symbol: int | None = Field(None, description="rx symbol errors FEC could not correct (NVLink5)")
    malformed: int | None = Field(None, description="malformed packets received (NVLink5)")
    dropped: int | None = Field(None, description="packets discarded on rx for a buffer overrun (NVLink5)")
    rx_errors: int | None = Field(None, description="packets received with errors (NVLink5)")
    rx_remote: int | None = Field(None, description="packets received with a stomp/EBP marker (NVLink5)")
    rx_general: int | None = Field(None, description="packets received with a header mismatch (NVLink5)")
    integrity: int | None = Field(None, description="times local errors passed their threshold (NVLink5)")
    effective_errors: int | None = Field(None, description="errors left after FEC (NVLink5)")
    source: Literal["counters", "fields"] = Field(
        "counters", description="nvmlDeviceGetNvLinkErrorCounter, or field values (Blackwell)"
    )
    change: dict[str, int] | None = Field(
        None, description="each counter's rise over HostHealth.counters_interval_s; None from older agents"
    )


FabricState = Literal["not_supported", "not_started", "in_progress", "completed", "unknown"]


class GpuHealth(Fact):
    """Health values of one GPU; None = the GPU or driver cannot say (not checked)."""

    index: int
    ecc_mode: bool | None = None
    ecc_pending_mode: bool | None = Field(None, description="the ECC mode after the next reboot")
    ecc_volatile_uncorrectable: int | None = Field(None, description="since the driver loaded")
    ecc_aggregate_uncorrectable: int | None = Field(None, description="over the GPU's life")
    retired_pages_pending: bool | None = Field(None, description="before Ampere: waits for a reset")
    retired_pages: int | None = None
    remapped_rows_uncorrectable: int | None = Field(None, description="Ampere and later")
    remapped_rows_pending: bool | None = Field(None, description="a remap waits for a GPU reset")
    remapped_rows_failure: bool | None = Field(None, description="a remap failed: memory beyond repair")
    nvlink_errors: list[NvlinkErrors] = Field(default_factory=list)
    throttle: list[str] | None = Field(
        None, description="active clock events: hw_slowdown, hw_thermal, hw_power_brake, sw_thermal, ..."
    )
    power_limit_w: int | None = None
    default_power_limit_w: int | None = None
    power_limit_range_w: tuple[int, int] | None = Field(None, description="(lowest, highest) limit accepted")
    compute_mode: Literal["default", "exclusive_process", "prohibited", "unknown"] | None = None
    mig: bool | None = None
    mig_pending: bool | None = None
    fabric_state: FabricState | None = None
    fabric_status: str | None = Field(None, description='"success" or NVML\'s words for the failure')
    fabric_health: list[str] | None = Field(
        None, description="problems the fabric health mask sets (degraded_bandwidth, route_unhealthy, ...)"
    )
    fabric_summary: Literal["healthy", "unhealthy", "limited_capacity"] | None = Field(
        None, description="the v3 fabric info's health summary (R560+)"
    )
    recovery_action: str | None = Field(
        None,
        description="the driver's verdict: none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, ...",
    )
    violation_ms: dict[str, int] | None = Field(
        None,
        description="time clocks were held down since the driver loaded: power, thermal, board_limit, ...",
    )
    enforced_power_limit_w: int | None = Field(
        None, description="the limit in force: below power_limit_w when a BMC caps the GPU out of band"
    )
    ecc_sram_volatile_uncorrectable: int | None = Field(None, description="on-chip SRAM (Hopper and later)")
    ecc_sram_aggregate_uncorrectable: int | None = None
    ecc_dram_volatile_uncorrectable: int | None = Field(None, description="HBM/GDDR (Hopper and later)")
    ecc_dram_aggregate_uncorrectable: int | None = None
    sram_threshold_exceeded: bool | None = Field(
        None, description="the driver's SRAM error threshold verdict"
    )
    memory_unrepairable: bool | None = Field(None, description="NVML's unrepairable-memory flag")
    nvlink_ber: dict[Literal["effective", "symbol"], int] | None = Field(
        None,
        description="NVLink5: the GPU's effective and symbol BER over all its links, as NVML packs them "
        "(bits 8-11 the mantissa, 0-7 the exponent: BER = mantissa * 10^-exponent)",
    )
    change: dict[str, int] | None = Field(
        None, description="ECC and violation counters' rise over HostHealth.counters_interval_s"
    )


class XidEvent(Fact):
    gpu: int | None = Field(description="the GPU at that address; None when NVML lists no GPU there")
    pci_bus_id: str = Field(description="domain:bus:device as the kernel log prints it")
    code: int
    cleared: bool = Field(False, description="logged before the GPU's last successful reset this boot")


class SXidEvent(Fact):
    """An NVSwitch error as the kernel log prints it (nvidia-nvswitchN: SXid (PCI:...): code, Fatal, ...)."""

    switch: str = Field(description="the kernel device, e.g. nvidia-nvswitch3")
    pci_bus_id: str
    code: int
    fatal: bool


class KernelReadiness(Fact):
    running: str
    installed: list[str] = Field(default_factory=list, description="kernels with an image in /boot")
    nvidia_module_for: list[str] = Field(default_factory=list, description="kernels with an nvidia.ko")
    next_boot: str | None = Field(None, description="the bootloader's default kernel; None: the newest")
    secure_boot: bool | None = None
    module_signed: bool | None = Field(None, description="judged only with Secure Boot on")
    module_key_enrolled: bool | None = Field(
        None, description="the module's signing key is trusted (enrolled); judged only with Secure Boot on"
    )


class HostHealth(Fact):
    gpus: list[GpuHealth] = Field(default_factory=list)
    xid: list[XidEvent] = Field(default_factory=list, description="Xids in this boot's kernel log, in order")
    xid_source: str | None = Field(None, description="journal, kmsg, dmesg or twin; None: no log readable")
    sxid: list[SXidEvent] = Field(default_factory=list, description="NVSwitch SXids in this boot's log")
    xid_change: int | None = Field(None, description="Xids logged over counters_interval_s")
    counters_since: Literal["sample", "boot"] | None = Field(
        None, description="changes count from the node's previous sample this boot, or from boot"
    )
    counters_interval_s: float | None = Field(None, description="the interval the changes cover")
    kernel: KernelReadiness | None = None
    not_checked: list[str] = Field(default_factory=list, description="values not read, each said once")

    def gpu(self, index: int) -> GpuHealth | None:
        return next((g for g in self.gpus if g.index == index), None)


class NetInterface(Fact):
    name: str
    up: bool = Field(description="administratively up (IFF_UP)")


class CpuInfo(Fact):
    logical: int = Field(description="CPUs the agent may run on")
    cores: int | None = Field(None, description="physical cores among them, None when unknown")


class CpuThread(Fact):
    cpu: int = Field(description="the OS CPU id")
    socket: int = Field(description="physical_package_id")
    core: int = Field(description="core_id within the socket (not dense: numbers may skip)")
    numa: int | None = None
    l3: int | None = Field(None, description="the id of its L3 cache (cache/index3/id), None when unknown")


class Machine(Fact):
    """Every online CPU's place and the memory: what slurm.conf's node line and gres.conf's Cores= need."""

    threads: list[CpuThread]
    memory_mib: int | None = None


class SlurmNode(Fact):
    """What Slurm says of this node (only when the request asks and slurmd is installed)."""

    registers: dict[str, str] | None = Field(None, description="`slurmd -C`'s line as key=value pairs")
    controller: dict[str, str] | None = Field(None, description="`scontrol show node -o` of this node")
    error: str | None = Field(None, description="why the controller's line is missing")
    missing_devices: list[str] = Field(
        default_factory=list, description="the GPUs' /dev/nvidia<minor> that do not exist"
    )
    version: str | None = Field(None, description="slurmd's version (`slurmd -V`), None when unknown")
    name: str | None = Field(
        None, description="the NodeName slurmd registers (a running slurmd's -N, else `slurmd -C`'s)"
    )
    configless: str | None = Field(
        None, description="how slurmd gets its files from the controller (configless), None: local files"
    )
    scontrol: str | None = Field(None, description="where scontrol is on the node, None: not found")
    config: dict[str, str] = Field(
        default_factory=dict, description="a few keys of `scontrol show config` (HealthCheckTimeout, ...)"
    )


class CdiPath(Fact):
    role: Literal["device", "mount", "hook"]
    path: str
    exists: bool | None = None


class CdiSpec(Fact):
    """One CDI spec file as the node read it (node/verbs/containers.py)."""

    path: str
    error: str | None = Field(None, description="why it is not a usable spec (invalid YAML/JSON, no kind)")
    kind: str | None = None
    cdi_version: str | None = None
    devices: list[str] = Field(default_factory=list, description="the device names (0, GPU-<uuid>, all)")
    paths: list[CdiPath] = Field(default_factory=list, description="every device node, mount and hook")


class RuntimeState(Fact):
    installed: bool
    config: str | None = Field(None, description="the config file that names the nvidia runtime")
    configured: bool | None = Field(None, description="None: the runtime has no config (podman: CDI only)")
    error: str | None = Field(None, description="why its config could not be read")


class ContainerFacts(Fact):
    toolkit: str | None = Field(None, description="the NVIDIA Container Toolkit's version; None: none")
    refresh: bool = Field(False, description="the toolkit's nvidia-cdi-refresh.path unit is enabled")
    specs: list[CdiSpec] = Field(default_factory=list, description="the specs in /etc/cdi and /var/run/cdi")
    runtimes: dict[str, RuntimeState] = Field(default_factory=dict)


class Facts(Fact):
    schema_version: int = FACTS_SCHEMA_VERSION
    agent_version: str
    agent_digest: str | None = Field(
        None,
        description="sha256 of the agent's zipapp (what apply installs for the node check); None: "
        "the agent runs from a source tree",
    )
    host: HostInfo
    driver: DriverInfo
    gpus: list[Gpu] = Field(default_factory=list)
    lost_gpus: list[LostGpu] = Field(default_factory=list, description="GPUs NVML answers GpuIsLost for")
    pairs: list[GpuPair] = Field(default_factory=list)
    nvswitch: bool = False
    board: Board = Board()
    fabricmanager: FabricManager | None = None
    persistenced: PersistenceDaemon | None = None
    imex: Imex | None = Field(None, description="None: not installed and not looked for")
    nvidia_repository_missing: str | None = Field(
        None,
        description="the repository step of NVIDIA's installation guide when the box's package manager has "
        "none of NVIDIA's repositories; None: it has one, or it was not asked",
    )
    driver_mirror: DriverMirror | None = Field(None, description="None: no driver.repo, or not checked")
    units: dict[str, Unit] = Field(default_factory=dict, description="the units the request named, by name")
    sli: SliConfig = SliConfig()
    xorg_layouts: list[XorgLayout] = Field(default_factory=list)
    files: list[ManagedFile] = Field(default_factory=list)
    processes: list[GpuProcess] = Field(default_factory=list)
    torch: TorchInfo | None = None
    health: HostHealth | None = Field(None, description="None from an agent that does not read health")
    interfaces: list[NetInterface] | None = Field(None, description="None: the agent did not report them")
    cpu: CpuInfo | None = None
    machine: Machine | None = Field(
        None, description="None: not asked (a rig without `slurm`), an older agent, or /sys could not say"
    )
    slurm: SlurmNode | None = Field(None, description="None: not asked, or no slurmd installed")
    containers: ContainerFacts | None = Field(None, description="None: not asked (no containers section)")

    def file(self, path: str) -> ManagedFile | None:
        return next((f for f in self.files if f.path == path), None)

    def pair(self, a: int, b: int) -> GpuPair | None:
        lo, hi = min(a, b), max(a, b)
        return next((p for p in self.pairs if p.a == lo and p.b == hi), None)

    def cell(self, a: int, b: int) -> str:
        """The `nvidia-smi topo -m` cell between GPU a and GPU b ("X" on the diagonal)."""
        if a == b:
            return "X"
        pair = self.pair(a, b)
        return pair.cell if pair is not None else "?"
