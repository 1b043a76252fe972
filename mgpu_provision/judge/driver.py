"""The loaded driver against the rig's pin, and Fabric Manager at the driver's version and running.

A new driver only takes effect once its kernel module is loaded, so "installed" and "loaded" are two
findings: the plan turns the first into an install and the second into a reboot; a node reports either as
not ready. Without Fabric Manager (or with one at another version: it refuses to start) the GPUs of an
HGX/DGX box show PCIe instead of NVLink and CUDA init can fail.
"""

from __future__ import annotations

from ..protocol import FABRICMANAGER_UNIT, branch_of
from ..typing_lite import TYPE_CHECKING
from .records import Expectation, Finding

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional


def satisfies(installed: Optional[str], version: Optional[str], branch: Optional[str]) -> bool:
    """`installed` is the pinned exact version, or of the pinned branch."""
    if installed is None:
        return False
    if version is not None:
        return installed == version
    return branch_of(installed) == branch


def installed_version(facts: Dict[str, Any]) -> Optional[str]:
    """The driver on disk, else the one NVML reports (a runfile install has no package to ask)."""
    driver = facts.get("driver") or {}
    found: Optional[str] = driver.get("installed") or driver.get("version")
    return found


def driver(facts: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """ "not-installed": the driver on disk is not the pinned one; "not-loaded": it is, but its kernel module
    is not the one running (another version, or none: nouveau bound, a refused reboot). Nothing unpinned."""
    if not expect.driver_pinned:
        return []
    info = facts.get("driver") or {}
    installed, loaded = installed_version(facts), info.get("loaded")
    desired = expect.driver_version or f"{expect.driver_branch}.x"
    if not satisfies(installed, expect.driver_version, expect.driver_branch):
        summary = f"driver {installed or 'none'} is installed, the rig pins {desired}"
        return [Finding("driver", summary, installed, desired, kind="not-installed")]
    if info.get("reboot_required") or loaded != installed:
        message = f"driver {installed} is installed but {loaded or 'none'} is loaded"
        return [Finding("driver", message, loaded, installed, kind="not-loaded", advice="reboot to load it")]
    return []


def fabricmanager(facts: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """Fabric Manager installed ("missing"), at the driver's version ("version") and active ("service")."""
    if not expect.fabricmanager:
        return []
    fm, installed = facts.get("fabricmanager"), installed_version(facts)
    if fm is None or fm.get("version") is None:
        summary = (
            "Fabric Manager is not installed; NVSwitch boxes need it at the driver's version "
            f"({installed or 'unknown'})"
        )
        return [Finding("fabricmanager", summary, None, installed, kind="missing")]
    findings: List[Finding] = []
    version, service = fm["version"], fm.get("service", "unknown")
    if installed is not None and version != installed:
        summary = (
            f"Fabric Manager {version} does not match driver {installed} (it starts only at the same version)"
        )
        findings.append(Finding("fabricmanager", summary, version, installed, kind="version"))
    if service != "active":
        summary = f"the {FABRICMANAGER_UNIT} service is {service}, it must be active"
        findings.append(Finding("fabricmanager", summary, service, "active", kind="service"))
    return findings


def imex(facts: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """A running nvidia-imex whose domain is not UP: DOWN (no peer reached), DEGRADED (some peers missing or
    not connected) or a status it cannot read. Judged only where the rig names the domain's peers (not
    `per_job`) and the daemon runs: an absent or stopped daemon is the install's and the service's."""
    domain = (facts.get("imex") or {}).get("domain")
    if not expect.imex_domain or not domain or domain.get("status") == "UP":
        return []
    status = str(domain.get("status"))
    kind = {"DOWN": "domain-down", "DEGRADED": "domain-degraded"}.get(status, "domain-unknown")
    missing = [
        f"{node.get('host')} {node.get('status')}"
        for node in domain.get("nodes") or ()
        if node.get("status") != "READY"
    ]
    nodes = domain.get("nodes") or ()
    unconnected = sorted({peer for node in nodes for peer in node.get("unconnected") or ()})
    said = "; ".join(
        part
        for part in (
            domain.get("error"),
            ("not ready: " + ", ".join(missing)) if missing else None,
            ("not connected: " + ", ".join(unconnected)) if unconnected else None,
        )
        if part
    )
    message = f"the IMEX domain is {status}" + (f" ({said})" if said else "")
    advice = (
        "every node of the domain needs the same nodes_config.cfg and a running nvidia-imex at the driver's "
        "version: check `nvidia-imex-ctl -N` and `journalctl -u nvidia-imex` there, then restart nvidia-imex"
    )
    return [Finding("imex", message, status, "UP", kind=kind, advice=advice)]
