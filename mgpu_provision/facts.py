"""Typed facts about one node, exactly as the node agent's `facts` verb reports them.

This is the contract between the node agent (which emits plain JSON, stdlib only) and the control side
(plan, render). The agent's output is validated against these models on arrival, so a protocol drift is
caught at the seam with a clear message instead of deep inside a diff. Unknown keys are ignored so that a
newer agent can add facts without breaking an older control side.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FACTS_SCHEMA_VERSION = 1


class Fact(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class HostInfo(Fact):
    hostname: str
    os: str = Field(description='PRETTY_NAME of /etc/os-release, e.g. "Debian GNU/Linux 12 (bookworm)"')
    kernel: str
    arch: str
    boot_id: str
    python: str = Field(description="version of the python running the agent")
    user: str = Field(description="the user the agent runs as")
    simulated: bool = Field(False, description="the NVIDIA layer comes from a twin file")


NvmlStatus = Literal["ok", "no-driver", "driver-not-loaded", "version-mismatch", "no-permission", "error"]


class DriverInfo(Fact):
    nvml: NvmlStatus = Field(description="whether NVML could be initialised, and if not, why")
    message: str | None = Field(None, description="plain explanation when nvml is not ok")
    version: str | None = Field(None, description="userspace driver version (NVML), None when unknown")
    cuda: str | None = Field(None, description='CUDA driver API version, e.g. "12.4"')
    loaded: str | None = Field(None, description="kernel module version from /proc/driver/nvidia/version")
    installed: str | None = Field(None, description="userspace version installed on disk (packages)")
    reboot_required: bool = Field(
        False, description="the loaded kernel module differs from the installed userspace driver"
    )


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


class Gpu(Fact):
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_mib: int
    persistence_mode: bool | None = None
    pcie: PcieLink = PcieLink()
    nvlinks: list[NvLink] = Field(default_factory=list)


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


class FabricManager(Fact):
    version: str | None = Field(None, description="installed package version, None when not installed")
    service: Literal["active", "inactive", "failed", "absent", "unknown"] = "unknown"


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


class TorchInfo(Fact):
    python: str
    ok: bool
    version: str | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    error: str | None = None


class NetInterface(Fact):
    name: str
    up: bool = Field(description="administratively up (IFF_UP)")


class CpuInfo(Fact):
    logical: int = Field(description="CPUs the agent may run on")
    cores: int | None = Field(None, description="physical cores among them, None when unknown")


class Facts(Fact):
    schema_version: int = FACTS_SCHEMA_VERSION
    agent_version: str
    host: HostInfo
    driver: DriverInfo
    gpus: list[Gpu] = Field(default_factory=list)
    pairs: list[GpuPair] = Field(default_factory=list)
    nvswitch: bool = False
    board: Board = Board()
    fabricmanager: FabricManager | None = None
    sli: SliConfig = SliConfig()
    xorg_layouts: list[XorgLayout] = Field(default_factory=list)
    files: list[ManagedFile] = Field(default_factory=list)
    processes: list[GpuProcess] = Field(default_factory=list)
    torch: TorchInfo | None = None
    interfaces: list[NetInterface] | None = Field(None, description="None: the agent did not report them")
    cpu: CpuInfo | None = None

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
