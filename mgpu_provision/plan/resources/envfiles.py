"""The files that carry the rig's environment to every job: env files for CUDA/NCCL/Gloo and the
`mgpu-torchrun` launcher.

A training job on a multi-GPU box fails in quiet ways when its environment is wrong (CUDA and nvidia-smi
numbering GPUs differently, NCCL picking the wrong interface, a node starting with the wrong rank). The
profile.d script, the systemd EnvironmentFile and the launcher carry the rig file's answer to every node;
smoke checks that a node holds them as apply writes them (`desired`) before it runs the launcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import protocol
from ...catalog import envpath
from ...facts import Facts
from ..change import Change, HostContext, check_failed
from ..files import DesiredFile, env_quote, node_path, render
from . import gloo
from . import torch as torch_names
from .gloo import GlooInterface

if TYPE_CHECKING:
    from ...rig import LoadedRig
    from ...rig.models import Host, Rig

# What a service started by systemd sees as PATH when nothing sets it: systemd's default in its widest
# (split /usr) form; on merged-/usr systems /sbin and /bin are links to the /usr folders.
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sh_prepend(name: str, entries: list[str]) -> list[str]:
    """sh lines that do what `envpath.prepend` does to `name` (tested against it), safe under `set -u`."""
    lines = []
    for entry in reversed(entries):
        quoted = env_quote(entry)
        lines.append(
            f'case ":${{{name}-}}:" in *:{quoted}:*) ;; *) {name}={quoted}${{{name}:+":${name}"}} ;; esac'
        )
    return [*lines, f"export {name}"]


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


def checks(ctx: HostContext) -> list[Change]:
    """What keeps the env files from carrying the rig's intent on this node: a Gloo interface not resolved."""
    resolved = None if ctx.host.os == "windows" else _gloo(ctx.loaded, ctx.rig, ctx.facts)
    if resolved is None or resolved.problem is None:
        return []
    return [check_failed("ddp.ifname", resolved.problem)]


def _visible_labels(rig: Rig) -> list[str]:
    devices = rig.visible_devices or []
    return [f"nvidia-smi GPU {d}" if isinstance(d, int) else f"the GPU with UUID {d}" for d in devices]


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


def _where(loaded: LoadedRig, host: Host, path: str | None) -> str | None:
    """A `files` path on `host`; None where it is not managed (null, or a Windows host: profile.d, systemd
    and sh launchers are Linux things)."""
    return node_path(loaded, host, path) if path and host.os != "windows" else None


def profile_path(loaded: LoadedRig, host: Host) -> str | None:
    return _where(loaded, host, loaded.spec.files.profile_d)


def launcher_path(loaded: LoadedRig, host: Host) -> str | None:
    """Where apply installs `host`'s launcher; None when it installs none (`files.launcher: null`, no ddp)."""
    wanted = loaded.rig_of(host).ddp is not None
    return _where(loaded, host, loaded.spec.files.launcher) if wanted else None


def paths(loaded: LoadedRig, host: Host) -> list[str]:
    """The profile.d script, the EnvironmentFile and the launcher that apply writes on `host`."""
    found = (profile_path(loaded, host), _where(loaded, host, loaded.spec.files.environment_file))
    return [path for path in (*found, launcher_path(loaded, host)) if path]


def desired(ctx: HostContext) -> list[DesiredFile]:
    """The env files and the launcher apply writes on the host, for its facts; a path set to null in
    `files` is left alone."""
    loaded, host, rig, facts = ctx.loaded, ctx.host, ctx.rig, ctx.facts
    profile = profile_path(loaded, host)
    environment_file = _where(loaded, host, loaded.spec.files.environment_file)
    launcher = launcher_path(loaded, host)
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
    if profile:
        files.append(DesiredFile(profile, render("profile.sh.j2", **common), "0644", "env"))
    if environment_file:
        files.append(DesiredFile(environment_file, render("environment.j2", **common), "0644", "env"))
    settings = _launcher_context(loaded, host)
    if launcher and settings is not None:
        options = launcher_options(settings["rdzv_backend"], torch_names.spelling(facts).underscore_flags)
        content = render("mgpu-torchrun.j2", profile_path=profile, torchrun=options, **common, **settings)
        files.append(DesiredFile(launcher, content, "0755", "env"))
    return files
