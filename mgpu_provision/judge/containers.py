"""Containers: the NVIDIA Container Toolkit at the rig's version, a CDI spec that matches the box, runtimes
configured.

A spec is stale when a container started from it would not get this box's GPUs: a device node, mount or hook
it names is missing, the driver libraries it mounts are not the loaded driver's (`libcuda.so.<version>`
after an upgrade: NVIDIA/nvidia-container-toolkit issues #856, #1828), its devices are not NVML's GPUs, or
two specs claim the kind (podman, containerd and CRI-O then pick one by directory order:
cncf-tags/container-device-interface SPEC.md). The plan regenerates a stale spec of its own with
`nvidia-ctk cdi generate`; what is not its own (another vendor's spec, a second spec of the kind) is only
reported.

The toolkit-vs-driver judgement: NVIDIA publishes no matrix of toolkit against driver versions (the install
guide, docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html, asks only for an
installed driver); what the toolkit's own CHANGELOG.md fixes is that `nvidia-ctk cdi generate` exists from
v1.12.0 and the refresh service (nvidia-cdi-refresh) from v1.18.0, so a pin below 1.12.0 cannot manage CDI
(rig/rules.py refuses it) and an installed toolkit below it is judged unable to.
"""

from __future__ import annotations

import re

from ..typing_lite import TYPE_CHECKING
from .records import Expectation, Finding, gpus, nvml_ok

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

CDI_SINCE = (1, 12, 0)  # CHANGELOG.md v1.12.0-rc.2: "Use `nvidia-ctk cdi generate`"
CDI_HOOK_SINCE = (1, 16, 0)  # CHANGELOG.md v1.16.0-rc.1: the hooks move to the nvidia-cdi-hook binary
REFRESH_OUTPUT = "/var/run/cdi/nvidia.yaml"  # deployments/systemd/nvidia-cdi-refresh.service
_LIBRARY = re.compile(r"/lib(cuda|nvidia-ml)\.so\.(\d+\.\d+(?:\.\d+)?)$")
_GPU_NAME = re.compile(r"^(\d+|GPU-[0-9a-fA-F-]+)$")
_MIG_NAME = re.compile(r"^\d+:\d+$")  # the index strategy's MIG device; MIG-<uuid> cannot name its GPU


def version_tuple(version: str) -> Tuple[int, ...]:
    """ "1.17.8" -> (1, 17, 8); a suffix such as "-1" or "~rc.1" is left out."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("-")[0].split("~")[0])[:3])


def containers(facts: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """Every finding about the toolkit, the CDI specs and the runtimes; none without a containers section."""
    if not expect.containers:
        return []
    found = facts.get("containers")
    if found is None:
        return [Finding("containers", "the agent did not report containers (an older agent)", kind="failed")]
    return toolkit(found, expect) + cdi(facts, found, expect) + runtimes(found, expect)


def toolkit(found: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """ "not-installed": the toolkit is not at the pinned version (or not there at all)."""
    have: Optional[str] = found.get("toolkit")
    want = expect.toolkit_version
    if want is None or have == want:
        return []
    summary = "NVIDIA Container Toolkit {} is installed, the rig pins {}".format(have or "none", want)
    if have is not None and version_tuple(have) < CDI_SINCE:
        summary += " ({} has no `nvidia-ctk cdi generate`: CDI needs 1.12.0 or later)".format(have)
    return [Finding("container-toolkit", summary, have, want, kind="not-installed")]


def cdi(facts: Dict[str, Any], found: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """The specs of the rig's kind: "invalid" or "foreign" at the managed path, "missing", "stale" (apply
    regenerates), "conflict" (two specs of the kind: a person removes one)."""
    specs: List[Dict[str, Any]] = found.get("specs") or []
    path, kind = spec_path(found, expect), expect.cdi_kind
    findings: List[Finding] = []
    ours = next((s for s in specs if s.get("path") == path), None)
    for spec in specs:
        if spec.get("error") and spec is not ours:
            message = "CDI spec {} cannot be read ({}); runtimes skip it".format(spec["path"], spec["error"])
            findings.append(Finding("cdi", message, spec["error"], None, kind="failed"))
    if ours is not None and ours.get("error"):
        message = "CDI spec {} is not a spec: {}".format(path, ours["error"])
        return [*findings, Finding("cdi", message, ours["error"], kind, kind="invalid")]
    if ours is not None and ours.get("kind") != kind:
        message = "{} holds another vendor's spec (kind {}), not {}".format(path, ours.get("kind"), kind)
        advice = "move it, or set containers.cdi.output to another file"
        return [*findings, Finding("cdi", message, ours.get("kind"), kind, kind="foreign", advice=advice)]
    claims = [s for s in specs if s.get("kind") == kind and not s.get("error")]
    if len(claims) > 1:
        names = ", ".join(s["path"] for s in claims)
        message = "{} specs claim {}: {}".format(len(claims), kind, names)
        advice = "remove all but {} (a runtime picks one by directory order)".format(path)
        findings.append(Finding("cdi", message, names, path, kind="conflict", advice=advice))
    if ours is None:
        message = "no CDI spec at {} for {}".format(path, kind)
        return [*findings, Finding("cdi", message, None, path, kind="missing")]
    hooks = [
        p["path"] for p in ours.get("paths") or () if p.get("role") == "hook" and p.get("exists") is False
    ]
    if hooks:  # nvidia-ctk writes the hook path it is given: generating again would not bring it
        message = "CDI spec {} runs hook {}, which is missing".format(path, hooks[0])
        advice = "install the toolkit's nvidia-cdi-hook, or set containers.cdi.hook_path to where it is"
        findings.append(Finding("cdi", message, hooks[0], None, kind="failed", advice=advice))
    why = stale(facts, ours)
    if why:
        message = "CDI spec {} is stale: {}".format(path, "; ".join(why))
        findings.append(Finding("cdi", message, why[0], "what nvidia-ctk cdi generate writes", kind="stale"))
    return findings


def spec_path(found: Dict[str, Any], expect: Expectation) -> str:
    """The spec apply keeps: the refresh service's output where that service is enabled (it would write its
    own beside ours, and two specs of the kind conflict), else the rig's."""
    return REFRESH_OUTPUT if found.get("refresh") else expect.cdi_spec


def stale(facts: Dict[str, Any], spec: Dict[str, Any]) -> List[str]:
    """Why a container started from `spec` would not get this box's GPUs and a new spec would; [] when it
    would get them (a missing hook is judged apart: a new spec names it again)."""
    why = []
    missing = [
        p["path"] for p in spec.get("paths") or () if p.get("exists") is False and p.get("role") != "hook"
    ]
    if missing:
        more = " …" if len(missing) > 3 else ""
        why.append("{} missing: {}{}".format(len(missing), ", ".join(missing[:3]), more))
    loaded = (facts.get("driver") or {}).get("loaded")
    if loaded:
        mounted = sorted(
            {m.group(2) for p in spec.get("paths") or () for m in [_LIBRARY.search(p["path"])] if m}
        )
        other = [v for v in mounted if v != loaded]
        if other:
            why.append("mounts driver libraries {}, the loaded driver is {}".format(", ".join(other), loaded))
    if nvml_ok(facts):
        health = (facts.get("health") or {}).get("gpus") or ()
        mig = {int(g["index"]): bool(g.get("mig")) for g in health if g.get("index") is not None}
        why += _device_mismatch(gpus(facts), [str(n) for n in spec.get("devices") or ()], mig)
    return why


def _device_mismatch(listed: List[Dict[str, Any]], names: List[str], mig: Dict[int, bool]) -> List[str]:
    """The spec's GPU devices (by index or UUID: nvidia-ctk's default strategies) against NVML's GPUs. A GPU
    in MIG mode has no whole-GPU device, only its MIG devices (`<gpu>:<mig>`, MIG-<uuid>), and a GPU out of
    MIG mode none of those (pkg/nvcdi/lib-nvml.go getDeviceSpecGeneratorsForAllDevices)."""
    known = {str(g.get("index")) for g in listed} | {str(g.get("uuid")) for g in listed}
    in_mig = [g for g in listed if mig.get(int(g.get("index") or 0))]
    split = {str(g.get("index")) for g in in_mig}

    def named(gpu: Dict[str, Any]) -> bool:
        return str(gpu.get("index")) in names or gpu.get("uuid") in names

    absent = [str(g.get("index")) for g in listed if g not in in_mig and not named(g)]
    named_whole = [str(g.get("index")) for g in in_mig if named(g)]
    extra = [n for n in names if _GPU_NAME.match(n) and n not in known]
    stray_mig = sorted({n for n in names if _MIG_NAME.match(n) and n.split(":")[0] not in split})
    why = []
    if absent:
        why.append("GPU {} not in its devices".format(", ".join(absent)))
    if extra:
        why.append("names device(s) {} NVML does not list".format(", ".join(extra)))
    if named_whole:
        why.append("names GPU {} whole, which is in MIG mode".format(", ".join(named_whole)))
    if stray_mig:
        why.append("names MIG device(s) {} of a GPU not in MIG mode".format(", ".join(stray_mig)))
    return why


def runtimes(found: Dict[str, Any], expect: Expectation) -> List[Finding]:
    """Per runtime the rig names: "not-installed" (a person installs it), "config-invalid" (its config
    cannot be read, so nvidia-ctk would not edit it either), "unconfigured" (apply configures it)."""
    have: Dict[str, Dict[str, Any]] = found.get("runtimes") or {}
    findings = []
    for name in expect.runtimes:
        entry = have.get(name) or {}
        if not entry.get("installed"):
            message = "{} is not installed; the rig asks for it to run GPU containers".format(name)
            findings.append(Finding("runtime", message, None, name, kind="not-installed"))
        elif entry.get("error"):
            message = "{}: {}".format(name, entry["error"])
            findings.append(Finding("runtime", message, entry["error"], name, kind="config-invalid"))
        elif entry.get("configured") is False:
            message = "{} has no nvidia runtime in its config".format(name)
            findings.append(Finding("runtime", message, None, name, kind="unconfigured"))
    return findings
