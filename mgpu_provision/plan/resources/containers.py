"""Containers: the NVIDIA Container Toolkit at its pin, a CDI spec regenerated after every driver change,
the runtimes configured (phase `containers`, after the driver's).

What is judged is the shipped judge's (judge/containers.py), so the node check sees the same stale spec.
`nvidia-ctk cdi generate` asks NVML for the driver version and GPUs, so while a driver change of this plan
(or its reboot) is pending the spec is regenerated in apply's round after the reboot, not before: the
Change says so and carries no step until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import protocol
from ...catalog.containers import TOOLKIT_PACKAGES
from ...judge import containers as judge
from ...judge import driver as judge_driver
from ...judge.records import Finding
from ..change import Action, Change, HostContext, failed_checks
from .driver import family_of

if TYPE_CHECKING:
    from ...rig.models import Containers

REGENERATED = frozenset({"missing", "stale", "invalid"})  # the cdi findings a new spec of ours fixes


def diff(ctx: HostContext) -> list[Change]:
    want = ctx.rig.containers
    if want is None or ctx.host.os != "linux":
        return []
    findings = judge.containers(ctx.facts_json, ctx.expect)
    changes: list[Change] = []
    for finding in findings:
        if finding.check == "container-toolkit":
            changes.append(_toolkit(ctx, want, finding))
        elif finding.check == "cdi" and finding.kind in REGENERATED:
            changes.append(_regenerate(ctx, want, finding))
        elif finding.check == "runtime" and finding.kind == "unconfigured":
            step = protocol.runtime_configure_step(str(finding.desired))
            changes.append(Change("runtime", "update", finding.summary, None, finding.desired,
                                  agent_step=step, phase="containers"))  # fmt: skip
        elif finding.kind in ("foreign", "conflict"):
            changes.append(Change(finding.check, "manual", finding.summary, finding.current, finding.desired))
        else:
            changes += failed_checks([finding])
    kinds = {f.kind for f in findings if f.check == "cdi"}
    if kinds & (REGENERATED | {"foreign"}):  # regenerated already, or not ours to write
        return changes
    spec = judge.spec_path(ctx.facts_json.get("containers") or {}, ctx.expect)
    if not _driver_settled(ctx) and ctx.rig.driver is not None:
        changes.append(_after_reboot(spec))  # the driver change of this plan: the spec follows it
    elif any(f.check == "container-toolkit" for f in findings) and _driver_settled(ctx):
        # A new toolkit writes its own spec: generated again right after the install.
        changes.append(_regenerate(ctx, want, Finding("cdi", f"regenerate {spec} with the new toolkit")))
    return changes


def _driver_settled(ctx: HostContext) -> bool:
    """The pinned driver is installed and loaded, and NVML answers: what `nvidia-ctk cdi generate` needs."""
    return ctx.nvml_ok and not judge_driver.driver(ctx.facts_json, ctx.expect)


def _toolkit(ctx: HostContext, want: Containers, finding: Finding) -> Change:
    method = family_of(ctx.facts.host).method
    summary = f"{finding.summary}: install {want.toolkit}"
    if method is None:
        summary = f"{summary} by hand (no package manager known for {ctx.facts.host.os_id or 'this OS'})"
        return Change(
            "container-toolkit", "manual", summary, finding.current, want.toolkit, phase="containers"
        )
    step = protocol.container_toolkit_step(want.toolkit, method, want.hold, list(TOOLKIT_PACKAGES))
    action: Action = "update" if finding.current else "create"
    return Change("container-toolkit", action, summary, finding.current, want.toolkit, agent_step=step,
                  phase="containers")  # fmt: skip


def _regenerate(ctx: HostContext, want: Containers, finding: Finding) -> Change:
    spec = judge.spec_path(ctx.facts_json.get("containers") or {}, ctx.expect)
    if not _driver_settled(ctx):
        return _after_reboot(spec, finding.summary)
    step = protocol.cdi_generate_step(spec, want.cdi.driver_root, hook_path(want))
    action: Action = "create" if finding.kind == "missing" else "update"
    summary = f"{finding.summary}: nvidia-ctk cdi generate --output={spec}"
    return Change("cdi", action, summary, finding.current, spec, agent_step=step, phase="containers")


def hook_path(want: Containers) -> str:
    """The rig's hook, else the toolkit's own: nvidia-ctk's `hook` command before 1.16.0, the nvidia-cdi-hook
    binary from it (NVIDIA/nvidia-container-toolkit CHANGELOG.md v1.16.0-rc.1)."""
    if want.cdi.hook_path is not None:
        return want.cdi.hook_path
    old = judge.version_tuple(want.toolkit) < judge.CDI_HOOK_SINCE
    return "/usr/bin/nvidia-ctk" if old else "/usr/bin/nvidia-cdi-hook"


def _after_reboot(spec: str, why: str = "") -> Change:
    """The spec follows a driver change of this plan: regenerated once the new driver is loaded."""
    summary = (
        f"{why + ': ' if why else ''}regenerate {spec} once the pinned driver is loaded (after its reboot)"
    )
    return Change("cdi", "update", summary, None, spec, phase="containers")
