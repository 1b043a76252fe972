"""The files apply writes on each node: env files for CUDA/NCCL/Gloo, the `mgpu-torchrun` launcher, X config.

A training job on a multi-GPU box fails in quiet ways when its environment is wrong (CUDA and nvidia-smi
numbering GPUs differently, NCCL picking the wrong interface, a node starting with the wrong rank). The files
carry the rig file's answer to every node, rendered from `templates/*.j2` deterministically (no timestamps,
sorted where order is free) so that a converged node shows no drift. `diff_files` turns them into Changes.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2

from ... import protocol
from ...errors import ProvisionError
from ...facts import Facts, ManagedFile
from ...spec.models import Host, Rig
from ..change import Change, Phase
from . import sli

if TYPE_CHECKING:
    from ...spec import LoadedRig

# Values systemd and sh both take unquoted; anything else is double-quoted with escapes.
_BARE_VALUE = re.compile(r"[A-Za-z0-9_.,:=@%+/^-]+")
_DOUBLE_QUOTE_ESCAPES = re.compile(r'([\\"`$])')
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class EnvFileError(ProvisionError):
    """A value cannot be written safely into a node's env file or launcher."""


@dataclass(frozen=True)
class DesiredFile:
    """A managed file as the rig file wants it on one node."""

    path: str
    content: str
    mode: str  # octal permission bits, e.g. "0644", as the agent's file step and facts spell them
    phase: Phase  # the playbook step that manages it: "env" or "sli"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()


def _safe(value: str) -> str:
    # The loader validates values already; a newline reaching a file would split an assignment, so refuse.
    if _CONTROL_CHARS.search(value):
        raise EnvFileError(f"value {value!r} contains a newline or control character; it cannot be written")
    return value


def shell_quote(value: object) -> str:
    """Quote a value for POSIX sh (profile.d script, launcher)."""
    return shlex.quote(_safe(str(value)))


def systemd_quote(value: object) -> str:
    """Quote a value for a systemd EnvironmentFile; the result is valid sh as well."""
    text = _safe(str(value))
    if _BARE_VALUE.fullmatch(text):
        return text
    return '"' + _DOUBLE_QUOTE_ESCAPES.sub(r"\\\1", text) + '"'


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("mgpu_provision", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,  # shell and config files, not HTML; values go through the quoting filters instead
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_TEMPLATES.filters["shell_quote"] = shell_quote
_TEMPLATES.filters["systemd_quote"] = systemd_quote


def render(template: str, **context: Any) -> str:
    return _TEMPLATES.get_template(template).render(**context)


def ifname_variables(ifname: str) -> list[tuple[str, str]]:
    """NCCL takes prefixes with `=` (exact) or `^` (exclude); Gloo takes plain interface names only."""
    variables = [("NCCL_SOCKET_IFNAME", ifname)]
    if not ifname.startswith("^"):  # Gloo cannot express an exclusion: leave it to pick its default
        variables.append(("GLOO_SOCKET_IFNAME", ifname.removeprefix("=")))
    return variables


def environment(loaded: LoadedRig, rig: Rig) -> list[tuple[str, str]]:
    """The variables every env file sets, in a fixed order; the rig's `env` wins over derived values."""
    derived: list[tuple[str, str]] = [("CUDA_DEVICE_ORDER", "PCI_BUS_ID")]
    if rig.visible_devices is not None:
        derived.append(("CUDA_VISIBLE_DEVICES", ",".join(str(d) for d in rig.visible_devices)))
    # 1: abort the communicator and end the process on an NCCL error, so a dead peer cannot hang the job.
    derived.append(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"))
    if rig.ddp is not None and rig.ddp.ifname is not None:
        derived.extend(ifname_variables(rig.ddp.ifname))
    explicit = {**loaded.spec.env, **rig.env}
    variables = dict(derived)
    variables.update(sorted(explicit.items()))
    return list(variables.items())


def _visible_labels(rig: Rig) -> list[str]:
    devices = rig.visible_devices or []
    return [f"nvidia-smi GPU {d}" if isinstance(d, int) else f"the GPU with UUID {d}" for d in devices]


def node_path(loaded: LoadedRig, host: Host, path: str) -> str:
    """Where a rig-file path lies on `host`: relative ones (local hosts only) are beside the rig file."""
    return str(loaded.resolve(path)) if host.connection == "local" else path


def _launcher_context(loaded: LoadedRig, host: Host, rig: Rig) -> dict[str, Any] | None:
    ddp = rig.ddp
    if ddp is None:
        return None
    return {
        "master_name": ddp.master,
        "master_addr": loaded.host(ddp.master).target,
        "master_port": ddp.port,
        "nnodes": len(loaded.ddp_group(host)),
        "node_rank": loaded.node_rank(host),
        "nproc_per_node": rig.nproc_per_node,
        "backend": ddp.backend,
        "rdzv_backend": ddp.rdzv_backend,
        "rdzv_id": ddp.rdzv_id or f"mgpu-{ddp.master}",
        "python": loaded.spec.smoke.python,
    }


def desired_files(loaded: LoadedRig, host: Host) -> list[DesiredFile]:
    """Every file apply manages on `host`; a path set to null in the rig's `files` is left alone."""
    if host.os == "windows":  # profile.d, systemd and sh launchers are Linux things; SLI is a manual step
        return []
    rig = loaded.rig_of(host)
    paths = loaded.spec.files
    common = {
        "rig_name": host.rig,
        "host_name": host.name,
        "variables": environment(loaded, rig),
        "visible": _visible_labels(rig),
    }
    files: list[DesiredFile] = []
    profile_path = node_path(loaded, host, paths.profile_d) if paths.profile_d else None
    if profile_path:
        files.append(DesiredFile(profile_path, render("profile.sh.j2", **common), "0644", "env"))
    if paths.environment_file:
        path = node_path(loaded, host, paths.environment_file)
        files.append(DesiredFile(path, render("environment.j2", **common), "0644", "env"))
    launcher = _launcher_context(loaded, host, rig)
    if paths.launcher and launcher is not None:
        content = render("mgpu-torchrun.j2", profile_path=profile_path, **common, **launcher)
        files.append(DesiredFile(node_path(loaded, host, paths.launcher), content, "0755", "env"))
    mode = sli.desired_mode(host, rig)
    if mode is not None:
        content = render("xorg-sli.conf.j2", mode=mode, **common)
        files.append(DesiredFile(node_path(loaded, host, paths.xorg_conf), content, "0644", "sli"))
    return files


def _unified(old: str, new: str, path: str, old_label: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=old_label, tofile=path
    )
    return "".join(lines)


def _describe(mode: str | None, sha256: str | None) -> str:
    return f"mode {mode or '?'}, sha256 {(sha256 or '?')[:12]}"


def diff_file(want: DesiredFile, have: ManagedFile | None) -> Change | None:
    """The Change that makes `have` (the node's file, None when not reported) into `want`, or None."""
    step = protocol.file_step(want.path, want.content, want.mode)
    resource = f"file:{want.path}"
    desired = _describe(want.mode, want.sha256)
    if have is None or not have.exists:
        lines = want.content.count("\n")
        return Change(
            resource,
            "create",
            f"new file, {lines} lines, mode {want.mode}",
            None,
            desired,
            diff=_unified("", want.content, want.path, "/dev/null"),
            agent_step=step,
            phase=want.phase,
        )
    same_content = have.content == want.content if have.content is not None else have.sha256 == want.sha256
    same_mode = have.mode == want.mode
    if same_content and same_mode:
        return None
    what = []
    if not same_content:
        what.append("content differs")
    if not same_mode:
        what.append(f"mode {have.mode or '?'} → {want.mode}")
    diff = None
    if not same_content and have.content is not None:
        diff = _unified(have.content, want.content, want.path, want.path)
    return Change(
        resource,
        "update",
        ", ".join(what),
        _describe(have.mode, have.sha256),
        desired,
        diff=diff,
        agent_step=step,
        phase=want.phase,
    )


def diff_files(desired: list[DesiredFile], facts: Facts) -> list[Change]:
    """Create/update Changes for every desired file that is missing or differs in content or mode."""
    changes = (diff_file(want, facts.file(want.path)) for want in desired)
    return [change for change in changes if change is not None]
