"""NVIDIA's Xid catalog as both ends read it: what each Xid the tool knows means, the catalog's resolution
for it, and what a person (or `recover`) does about it.

One table, shared by the node check (which judges Xids on the node), plan, and `recover` (which picks a GPU
reset or a reboot from the resolution). Its sources, cited per row where they differ:
- NVIDIA's Xid catalog, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, as
  leptonai/gpud generates it (`components/accelerator/nvidia/xid/catalog_generated.go`, 2025-10-29): the
  `ImmediateResolution` column (RESET_GPU, RESTART_BM, RESTART_APP, IGNORE, WORKFLOW_*, XID_154).
- DCGM 4.6 `modules/health/DcgmHealthWatch.cpp` `BuildXidMappings`: its "devastating" Xids 48, 74, 79, 95,
  119, 120, 140 FAIL on every watch, 94 WARNs; 63 WARNs in the memory watch (pending page retirement).
- Azure/azurehpc-health-checks `customTests/azure_gpu_xid.nhc`, which fails each listed Xid once.

The rig's default `health.critical_xids` is every Xid here whose resolution needs the GPU reset or the box
rebooted (`CRITICAL`); the catalog's IGNORE / RESTART_APP / informational ones the tool still names
(`NOTED`: 63, 92, 94, 154) warn, never fail. Application Xids (13, 31, 43, 45) are reported in the facts and
judged as nothing: the application that raised them is the one to restart.

Shipped to nodes: standard library only, Python 3.8.
"""

from __future__ import annotations

from ..typing_lite import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Dict, Optional, Tuple

# The catalog's resolutions the tool acts on, and what `recover` does for each.
RESET_GPU, RESTART_BM, WORKFLOW = "reset_gpu", "restart_bm", "workflow"
RESTART_APP, IGNORE, INFORMATIONAL = "restart_app", "ignore", "informational"
RECOVERY_OF = {RESET_GPU: "reset", WORKFLOW: "reset", RESTART_BM: "reboot"}

RESET = "reset the GPU (nvidia-smi -r -i {index}, no process on it) or reboot"


class Xid(NamedTuple):
    meaning: str
    resolution: str  # the catalog's ImmediateResolution, lower case (WORKFLOW_XID_48 etc.: "workflow")
    advice: str


CATALOG: Dict[int, Xid] = {
    46: Xid("GPU stopped processing (timeout)", RESET_GPU, RESET),
    # WORKFLOW_XID_48: a double-bit error the driver could not contain; DCGM fails it.
    48: Xid(
        "double-bit ECC error", WORKFLOW, "drain the GPU and reset it or reboot; replace it if it recurs"
    ),
    62: Xid("internal micro-controller (PMU) halt", RESET_GPU, RESET + "; replace it if it recurs"),
    # IGNORE in the catalog, WARN in DCGM: the repair is recorded and applied at the next reset.
    63: Xid(
        "ECC page retirement or row remap recorded", IGNORE, "reset the GPU or reboot to apply the repair"
    ),
    64: Xid(
        "ECC page retirement or row remap failed", RESET_GPU, "the memory cannot be repaired: replace it"
    ),
    # WORKFLOW_NVLINK_ERR; DCGM fails it.
    74: Xid("NVLink error", WORKFLOW, "reset the GPU; reseat or replace the bridge or cable if it recurs"),
    79: Xid(
        "GPU has fallen off the bus",
        RESTART_BM,
        "reboot, then check its power cables and PCIe seating; replace it if it recurs",
    ),
    92: Xid("high single-bit ECC error rate", IGNORE, "watch the rate; replace the GPU if it stays high"),
    # RESTART_APP in the catalog and WARN in DCGM: the driver contained the error and stopped the one app.
    94: Xid(
        "contained ECC error", RESTART_APP, "restart the application that hit it; reset the GPU if it recurs"
    ),
    95: Xid(
        "uncontained ECC error", RESET_GPU, "reset the GPU or reboot: every application on it was affected"
    ),
    109: Xid("context switch timeout", RESET_GPU, RESET),
    110: Xid("security fault", RESET_GPU, RESET),
    119: Xid(
        "GSP RPC timeout",
        RESET_GPU,
        RESET + "; if it recurs, update the driver (R525 before 525.105.17 had this bug) or report it",
    ),
    120: Xid("GSP error", RESET_GPU, RESET + "; if it recurs, update the driver or report it to NVIDIA"),
    136: Xid(
        "NVLink link training failed", RESET_GPU, RESET + "; check the link's cable or bridge if it recurs"
    ),
    140: Xid("ECC unrecovered error", RESET_GPU, RESET + "; replace the GPU if it recurs"),
    143: Xid("GPU initialization error", RESET_GPU, RESET + "; replace the GPU if it does not come back"),
    # WORKFLOW_NVLINK5_ERR; the fatal NETIR reports on GB200 (gpud PR #1160).
    149: Xid(
        "fatal NVLink network (NETIR) error",
        WORKFLOW,
        "reset the GPU or reboot the tray; check the NVLink cables and the switch tray it names",
    ),
    # XID_154: informational, it says which recovery another Xid needs (the recovery-action check reads it).
    154: Xid(
        "the driver changed the GPU's recovery action",
        INFORMATIONAL,
        "do what the recovery-action check says",
    ),
    155: Xid("NVLink software-defined error", RESET_GPU, RESET),
    156: Xid("resource retirement event", RESET_GPU, RESET + " to complete the retirement"),
    158: Xid("GPU fatal timeout", RESET_GPU, RESET + "; replace the GPU if it recurs"),
    # No resolution in the 2025-10 catalog yet; the SEC2 halt is what 62 is for the PMU, and is reset alike.
    169: Xid("internal micro-controller (SEC2) halt", RESET_GPU, RESET + "; replace it if it recurs"),
}
GENERIC = Xid(
    "see NVIDIA's Xid catalog", RESET_GPU, "reset the GPU or reboot; look up the Xid in NVIDIA's catalog"
)

# The rig file's default `health.critical_xids` (rig/models.py): every Xid that needs a reset or a reboot.
CRITICAL: Tuple[int, ...] = tuple(sorted(c for c, x in CATALOG.items() if x.resolution in RECOVERY_OF))
# Named when seen, as a warning: the catalog says the GPU goes on working.
NOTED: Tuple[int, ...] = tuple(sorted(c for c in CATALOG if c not in CRITICAL))
# Raised by applications, not by the GPU (13 graphics exception, 31 page fault, 43 channel stopped, 45
# preemptive cleanup after another error): in the facts, never a finding.
APP: Tuple[int, ...] = (13, 31, 43, 45)


def entry(code: int) -> Xid:
    return CATALOG.get(code, GENERIC)


def recovery(code: int) -> Optional[str]:
    """ "reset" or "reboot": what clears this Xid, as its resolution says; None: nothing to recover."""
    return RECOVERY_OF.get(entry(code).resolution)
