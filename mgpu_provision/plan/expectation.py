"""The expectation record of one host: the rig file's values the shipped judge needs, resolved for it.

The judge (`mgpu_provision/judge/`) reads no rig file and no pydantic model: plan hands it this record, and
a node that judges itself reads the same record from a JSON file apply wrote (`judge.records`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..judge.records import Expectation
from ..rig.cards import fabric_manager_elsewhere
from ..rig.plain import imex_domain

if TYPE_CHECKING:
    from ..catalog.topology import TopoMatrix
    from ..rig.models import Host
    from ..rig.rig import LoadedRig


def for_rig(loaded: LoadedRig, host: Host, files: Mapping[str, str] | None = None) -> Expectation:
    """The record for `host` of its rig, with the rig's captured topology and (path -> sha256) managed
    files."""
    rig, topology, defaults = loaded.rig_of(host), loaded.topologies.get(host.rig), loaded.defaults
    driver, health, bridge = rig.driver, rig.health, rig.bridge
    diag = health.dcgm_diag
    domain = imex_domain(driver, defaults.imex_domain)
    return Expectation(
        gpu_model=rig.gpus.model,
        gpu_count=rig.gpus.count,
        min_pcie_gen=rig.gpus.min_pcie_gen,
        min_pcie_width=rig.gpus.min_pcie_width,
        bridge_kind=bridge.kind,
        bridge_pairs=tuple(bridge.pairs),
        bridge_links=bridge.links,
        bridge_p2p=bridge.p2p,
        topology=None if topology is None else captured_cells(topology),
        driver_version=None if driver is None else driver.version,
        driver_branch=None if driver is None else driver.branch,
        # A GB200/GB300 compute tray's NVLinks end at the rack's switch trays, which run Fabric Manager.
        fabricmanager=not fabric_manager_elsewhere(rig.gpus.model)
        and (bridge.kind == "nvswitch" or (driver is not None and driver.fabricmanager)),
        imex_domain=domain is not None and domain.peers != "per_job",
        health_skip=tuple(health.skip),
        critical_xids=tuple(health.critical_xids),
        ecc=health.ecc,
        nvlink_error_max=health.nvlink_error_max,
        os=host.os,
        files=dict(files or {}),
        containers=rig.containers is not None,
        toolkit_version=None if rig.containers is None else rig.containers.toolkit,
        cdi_spec=(defaults.cdi if rig.containers is None else rig.containers.cdi).output,
        runtimes=() if rig.containers is None else tuple(rig.containers.runtimes),
        dcgm_diag_level=None if diag is None else diag.level,
        dcgm_diag_budget_s=(diag or defaults.dcgm_diag).budget_s,
    )


def captured_cells(matrix: TopoMatrix) -> tuple[tuple[str, ...], ...]:
    """The GPU-to-GPU cells of a captured matrix ("X" on the diagonal), NIC columns left out."""
    labels = [f"GPU{i}" for i in range(matrix.gpu_count)]
    column = {label: matrix.devices.index(label) for label in labels}
    # Columns looked up once, not per cell as TopoMatrix.cell does: every host's plan asks for all cells.
    # A row cut from the copy is still read from the other GPU's row, by TopoMatrix.cell.
    rows = {label: matrix.rows.get(label) for label in labels}

    def cell(a: str, b: str) -> str:
        row = rows[a]
        return row.cells[column[b]] if row is not None else matrix.cell(a, b)

    return tuple(tuple(cell(a, b) for b in labels) for a in labels)
