"""The files apply writes on each node: env files for CUDA/NCCL/Gloo, the `mgpu-torchrun` launcher, X config.

A training job on a multi-GPU box fails in quiet ways when its environment is wrong (CUDA and nvidia-smi
numbering GPUs differently, NCCL picking the wrong interface, a node starting with the wrong rank). The files
carry the rig file's answer to every node, rendered from `templates/*.j2` deterministically (no timestamps,
sorted where order is free) so that a converged node shows no drift. `diff_files` turns them into Changes.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import protocol
from ...catalog import envpath
from ...errors import ProvisionError
from ...facts import Facts, ManagedFile
from ...judge.files import same_digest
from ...rig.cache import control_cache_dir
from ...rig.envvalues import value_problem
from ...rig.models import Host, Rig
from ..change import Change, Phase, check_failed
from . import gloo, sli
from . import torch as torch_names
from .gloo import GlooInterface

if TYPE_CHECKING:
    import jinja2

    from ...rig import LoadedRig

# Values systemd and sh both take unquoted; anything else is double-quoted with escapes.
_BARE_VALUE = re.compile(r"[A-Za-z0-9_.,:=@%+/^-]+")
# Inside double quotes POSIX sh and systemd's EnvironmentFile parser both give these four characters
# their special meaning and take them literally after a backslash; every other character, newlines
# included, stands for itself in both.
_DOUBLE_QUOTE_ESCAPES = re.compile(r'([\\"`$])')
# What a service started by systemd sees as PATH when nothing sets it: systemd's default in its widest
# (split /usr) form; on merged-/usr systems /sbin and /bin are links to the /usr folders.
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def _safe(value: object) -> str:
    # The loader refuses these values already; a value from elsewhere must not reach a file either.
    text = str(value)
    problem = value_problem(text)
    if problem is not None:
        raise EnvFileError(f"value {text!r} {problem}; it cannot be written")
    return text


def shell_quote(value: object) -> str:
    """Quote a value for POSIX sh (the launcher's own settings)."""
    return shlex.quote(_safe(value))


def env_quote(value: object) -> str:
    """Quote a value as data for both env files: sourcing the profile.d script in sh, dash or bash, and
    systemd reading the EnvironmentFile, each give back exactly `value`."""
    text = _safe(value)
    if _BARE_VALUE.fullmatch(text):
        return text
    return '"' + _DOUBLE_QUOTE_ESCAPES.sub(r"\\\1", text) + '"'


def sh_prepend(name: str, entries: list[str]) -> list[str]:
    """sh lines that do what `envpath.prepend` does to `name` (tested against it), safe under `set -u`."""
    lines = []
    for entry in reversed(entries):
        quoted = env_quote(entry)
        lines.append(
            f'case ":${{{name}-}}:" in *:{quoted}:*) ;; '
            f'*) {name}={quoted}${{{name}:+":${name}"}} ;; esac'
        )
    return [*lines, f"export {name}"]


@functools.cache
def _templates() -> jinja2.Environment:
    """The one template environment of a run, made (and jinja2 imported) when the first file is rendered:
    a run that renders no file never loads jinja2, and each template is compiled once per run; the compiled
    templates are kept in the control machine's cache (jinja2's own, checked against each template's
    source), so a later run does not compile them again."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("mgpu_provision", "templates"),
        bytecode_cache=_compiled_templates(jinja2.__version__),
        auto_reload=False,  # the package's templates do not change during a run: no stat per render
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell and config files, not HTML; values go through the quoting filters instead
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(shell_quote=shell_quote, env_quote=env_quote)
    return env


def _compiled_templates(version: str) -> jinja2.BytecodeCache | None:
    """jinja2's bytecode cache in a folder per jinja2 version; none where that folder cannot be made."""
    import jinja2

    folder = control_cache_dir() / f"templates-jinja2-{version}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(folder)) if os.access(folder, os.W_OK) else None


def render(template: str, **context: Any) -> str:
    return _templates().get_template(template).render(**context)


def torchrun_flag(flag: str, underscores: bool) -> str:
    """`--nproc-per-node` as the node's torch spells it: torch before 2.0 knows only `--nproc_per_node`."""
    return "--" + flag[2:].replace("-", "_") if underscores else flag


def _gloo(loaded: LoadedRig, rig: Rig, facts: Facts | None) -> GlooInterface | None:
    """The Gloo interface for the rig's `ddp.ifname` on this node; None when the rig or its env decides."""
    if rig.ddp is None or rig.ddp.ifname is None or "GLOO_SOCKET_IFNAME" in merged_env(loaded, rig):
        return None
    up = None if facts is None or facts.interfaces is None else [i.name for i in facts.interfaces if i.up]
    return gloo.gloo_interface(rig.ddp.ifname, up)


def environment(loaded: LoadedRig, rig: Rig, facts: Facts | None = None) -> list[tuple[str, str]]:
    """The variables every env file sets, in a fixed order, for what the node (`facts`) has and runs: its
    torch's variable names, its Gloo interface, its cores per local rank. The rig's `env` wins over them."""
    derived: list[tuple[str, str]] = [("CUDA_DEVICE_ORDER", "PCI_BUS_ID")]
    if rig.visible_devices is not None:
        derived.append(("CUDA_VISIBLE_DEVICES", ",".join(str(d) for d in rig.visible_devices)))
    # 1: abort the communicator and end the process on an NCCL error, so a dead peer cannot hang the job.
    names = torch_names.spelling(facts) if facts is not None else torch_names.Spelling()
    derived.append((names.async_error_handling, "1"))
    if rig.ddp is not None and rig.ddp.ifname is not None:
        derived.append(("NCCL_SOCKET_IFNAME", rig.ddp.ifname))
        resolved = _gloo(loaded, rig, facts)
        if resolved is not None and resolved.name is not None:
            derived.append(("GLOO_SOCKET_IFNAME", resolved.name))
    cpu = facts.cpu if facts is not None else None
    if (
        cpu is not None
    ):  # torchrun's own default is 1 thread per rank, which starves data loading on big boxes
        derived.append(("OMP_NUM_THREADS", str(max(1, (cpu.cores or cpu.logical) // rig.nproc_per_node))))
    variables = dict(derived)
    variables.update(sorted(merged_env(loaded, rig).items()))
    return list(variables.items())


def merged_env(loaded: LoadedRig, rig: Rig) -> dict[str, str]:
    """The rig file's `env` for `rig`: the rig's variables over the fleet's."""
    return {**loaded.spec.env, **rig.env}


def path_prepends(loaded: LoadedRig, rig: Rig) -> list[tuple[str, list[str]]]:
    """The rig file's `path_prepend` for `rig`, by name: a rig's list for a variable replaces the fleet's
    (as `env` merges); an empty list prepends nothing."""
    merged = {**loaded.spec.path_prepend, **rig.path_prepend}
    return [(name, list(entries)) for name, entries in sorted(merged.items()) if entries]


def systemd_prepends(prepends: list[tuple[str, list[str]]]) -> list[tuple[str, str]]:
    """The EnvironmentFile's stand-in for `path_prepend`: systemd cannot read a variable's current value,
    so PATH gets the entries before systemd's default PATH and any other variable the entries alone."""
    return [
        (name, envpath.prepend(SYSTEMD_DEFAULT_PATH if name == "PATH" else None, entries))
        for name, entries in prepends
    ]


def env_checks(loaded: LoadedRig, host: Host, facts: Facts) -> list[Change]:
    """What keeps the env files from carrying the rig's intent on this node: a Gloo interface not resolved."""
    resolved = None if host.os == "windows" else _gloo(loaded, loaded.rig_of(host), facts)
    if resolved is None or resolved.problem is None:
        return []
    return [check_failed("ddp.ifname", resolved.problem)]


def _visible_labels(rig: Rig) -> list[str]:
    devices = rig.visible_devices or []
    return [f"nvidia-smi GPU {d}" if isinstance(d, int) else f"the GPU with UUID {d}" for d in devices]


def node_path(loaded: LoadedRig, host: Host, path: str) -> str:
    """Where a rig-file path lies on `host`: relative ones (local hosts only) are beside the rig file."""
    return str(loaded.resolve(path)) if host.connection == "local" else path


def _launcher_context(loaded: LoadedRig, host: Host) -> dict[str, Any] | None:
    rendezvous = loaded.rendezvous(host)
    if rendezvous is None:
        return None
    return {"master_name": rendezvous.master, **rendezvous.settings(), "python": loaded.spec.smoke.python}


def launcher_options(rdzv_backend: str, underscores: bool) -> list[str]:
    """torchrun's options in the launcher: each value the launcher's shell variable of that setting."""
    names = ("nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_id")
    shell = {name: f"${name}" for name in names}
    return [
        f'{torchrun_flag(flag, underscores)}="{value.format(**shell)}"'
        for flag, value in protocol.torchrun_options(rdzv_backend)
    ]


@dataclass(frozen=True)
class _Paths:
    """Where this host's managed files go; None: not managed here."""

    profile: str | None
    environment: str | None
    launcher: str | None
    xorg: str | None


def _paths(loaded: LoadedRig, host: Host) -> _Paths:
    if host.os == "windows":  # profile.d, systemd and sh launchers are Linux things; SLI is a manual step
        return _Paths(None, None, None, None)
    rig = loaded.rig_of(host)
    files = loaded.spec.files

    def where(path: str | None, wanted: bool = True) -> str | None:
        return node_path(loaded, host, path) if path and wanted else None

    return _Paths(
        profile=where(files.profile_d),
        environment=where(files.environment_file),
        launcher=where(files.launcher, rig.ddp is not None),
        xorg=where(files.xorg_conf, rig.sli is not None),
    )


def launcher_path(loaded: LoadedRig, host: Host) -> str | None:
    """Where apply installs `host`'s launcher; None when it installs none (`files.launcher: null`, no ddp)."""
    return _paths(loaded, host).launcher


def managed_paths(loaded: LoadedRig, host: Host) -> list[tuple[str, Phase]]:
    """Every file apply writes or removes on `host`, with its playbook step; known before any facts."""
    paths = _paths(loaded, host)
    managed: list[tuple[str, Phase]] = [
        (path, "env") for path in (paths.profile, paths.environment, paths.launcher) if path
    ]
    return managed + ([(paths.xorg, "sli")] if paths.xorg else [])


def desired_files(loaded: LoadedRig, host: Host, facts: Facts) -> list[DesiredFile]:
    """Every file apply writes on `host`, for its facts; a path set to null in `files` is left alone."""
    rig = loaded.rig_of(host)
    paths = _paths(loaded, host)
    prepends = path_prepends(loaded, rig)
    common = {
        "rig_name": host.rig,
        "host_name": host.name,
        "variables": environment(loaded, rig, facts),
        "prepend_lines": [line for name, entries in prepends for line in sh_prepend(name, entries)],
        "systemd_prepends": systemd_prepends(prepends),
        "visible": _visible_labels(rig),
        "slurm": rig.slurm is not None,  # CUDA_VISIBLE_DEVICES is Slurm's inside a job
    }
    files: list[DesiredFile] = []
    if paths.profile:
        files.append(DesiredFile(paths.profile, render("profile.sh.j2", **common), "0644", "env"))
    if paths.environment:
        files.append(DesiredFile(paths.environment, render("environment.j2", **common), "0644", "env"))
    launcher = _launcher_context(loaded, host)
    if paths.launcher and launcher is not None:
        options = launcher_options(launcher["rdzv_backend"], torch_names.spelling(facts).underscore_flags)
        content = render(
            "mgpu-torchrun.j2", profile_path=paths.profile, torchrun=options, **common, **launcher
        )
        files.append(DesiredFile(paths.launcher, content, "0755", "env"))
    x_config = sli.snippet_context(host, rig, facts)
    if paths.xorg and x_config is not None:
        files.append(DesiredFile(paths.xorg, render("xorg-sli.conf.j2", **x_config, **common), "0644", "sli"))
    return files


def unwanted_files(loaded: LoadedRig, host: Host) -> list[str]:
    """Managed files that must not exist: the X config snippet under SLI Off (the driver default)."""
    xorg = _paths(loaded, host).xorg
    rig = loaded.rig_of(host)
    return [xorg] if xorg and rig.sli is not None and rig.sli.mode == "Off" else []


def _lines(text: str) -> list[str]:
    # Lines as sh and systemd see them: only "\n" ends one (str.splitlines would also split at a CR or
    # U+2028 inside a value and misnumber the diff).
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _unified(old: str, new: str, path: str, old_label: str) -> str:
    lines = difflib.unified_diff(_lines(old), _lines(new), fromfile=old_label, tofile=path)
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
    # The content where the node sent it (for the diff), else the digest as a node that judges itself would.
    same_content = (
        have.content == want.content if have.content is not None else same_digest(have.sha256, want.sha256)
    )
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


def diff_unwanted(
    paths: list[str], facts: Facts, why: str = "SLI Off is the driver default", phase: Phase = "sli"
) -> list[Change]:
    """Delete Changes for the unwanted files the node reports as existing; nothing for those already gone."""
    return [
        Change(
            f"file:{path}",
            "delete",
            f"remove {path} ({why})",
            _describe(have.mode, have.sha256),
            None,
            agent_step=protocol.remove_step(path),
            phase=phase,
        )
        for path in paths
        if (have := facts.file(path)) is not None and have.exists
    ]
