"""The NVIDIA driver: installed at the rig's exact version or branch, and loaded (which may take a reboot).

A new driver only takes effect once its kernel module is loaded, so every install comes with a reboot Change:
with `reboot: allowed` apply carries it out (resource "reboot", phase "reboot", carried out by the agent's
`reboot` verb rather than `apply`); with `reboot: never` it is a manual step saying so.
A box where the right driver is installed but another module runs, or none at all (nouveau bound, a refused
reboot), gets the same reboot Change alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import protocol
from ...catalog import families, names, sources
from ...facts import HostInfo
from ...judge import driver as judge
from ...rig.cards import nvlink5_hgx, open_modules_only
from ...typing_lite import NamedTuple
from ..change import Action, Change, HostContext, check_failed

if TYPE_CHECKING:
    from ...rig.models import Driver, Host, Rig


class Source(NamedTuple):
    """Where a host's driver comes from: the rig's choice, else the one its os-release suggests."""

    name: str | None  # None for runfile installs
    method: str
    flavor: str | None
    problem: str | None = None  # why this host cannot be installed as asked (a manual step says it)

    @property
    def label(self) -> str:
        return f"{self.name} packages with {self.method}" if self.name else "runfile"


def resolve(want: Driver, host: HostInfo, model: str) -> Source:
    """Source, method and flavor for this host; a rig without `flavor` gets NVIDIA's default module type
    for its branch on `model` (the rig's GPU): open from 560 on Turing and later."""
    if want.method == "runfile":
        return Source(None, "runfile", want.flavor)
    family = family_of(host)
    name = want.source or family.source
    method = want.method or family.method or "apt"
    if name is None:
        return Source(None, method, want.flavor, family.problem)
    flavor = want.flavor or sources.default_flavor(name, model, branch_of_rig(want))
    problem = families.method_problem(family, method, name) or _source_problem(want, name, flavor, model)
    return Source(name, method, flavor, problem)


# The sources served from NVIDIA's repositories (developer.download.nvidia.com/compute/cuda/repos).
NVIDIA_SOURCES = ("cuda", "rhel")


def asks_nvidia_repository(rig: Rig, host: Host) -> bool:
    """Whether facts look for NVIDIA's repository on `host`: a package install that may come from it (the
    rig's source, or the one os-release suggests) without the rig's own mirror."""
    want = rig.driver
    if want is None or host.os != "linux" or want.method == "runfile" or want.repo is not None:
        return False
    return want.source is None or want.source in NVIDIA_SOURCES


def family_of(host: HostInfo) -> families.Family:
    """The node's family, from its os-release (none: a family without a method, whose problem says so)."""
    return families.family_of(host.os_id, host.os_version_id, host.os_like, host.os_platform_id)


def _source_problem(want: Driver, name: str, flavor: str, model: str) -> str | None:
    if flavor not in sources.FLAVORS[name]:
        return f"the {name} source has no {flavor} flavor (it has {', '.join(sources.FLAVORS[name])})"
    if want.fabricmanager and not sources.HAS_FABRICMANAGER[name]:
        return f"the {name} source has no Fabric Manager package: set driver.source: cuda"
    if want.fabricmanager and name == "ubuntu" and nvlink5_hgx(model):
        # Validate refuses `source: ubuntu` written in the rig; this is the source an Ubuntu box suggests.
        return (
            "Ubuntu's archive has no NVLink Subnet Manager (nvlsm) nor NVSDM, without which Fabric Manager "
            f"never starts on {model}: set driver.source: cuda (NVIDIA's repository)"
        )
    return None


def diff(ctx: HostContext) -> list[Change]:
    want = ctx.rig.driver
    if want is None:
        return []
    info = ctx.facts.driver
    installed = info.installed or info.version
    desired = want.version or f"{want.branch}.x"
    judged = {finding.kind for finding in judge.driver(ctx.facts_json, ctx.expect)}
    if "not-installed" in judged:
        if want.method == "runfile" and info.nouveau and ctx.host.os == "linux":
            return _clear_nouveau(want, desired)
        install = _install(ctx, want, installed, desired)
        if install.agent_step is None:
            return [install]
        return [install, _reboot(want, desired, loaded=info.loaded)]
    if want.hold and info.unheld and want.method != "runfile":
        more = " …" if len(info.unheld) > 4 else ""
        count = f"{len(info.unheld)} package{'s' if len(info.unheld) > 1 else ''}"
        why = f"{count} not held: {', '.join(info.unheld[:4])}{more}"
        install = _install(ctx, want, installed, str(installed), why, verb="hold")
        if install.agent_step is None or "not-loaded" not in judged:
            return [install]
        return [install, _reboot(want, str(installed), loaded=info.loaded, installed=installed)]
    running = _flavor_mismatch(ctx, want)
    if running is not None:
        wanted = "open" if running == "proprietary" else "proprietary"
        if info.installed_module == wanted:  # installed, the other type still loaded: only the boot is left
            return [_reboot(want, str(installed), info.loaded, why=f"{wanted} kernel modules installed")]
        why = f"installs the {wanted} kernel modules; the {running} ones are running"
        install = _install(ctx, want, installed, str(installed), why)
        return (
            [install] if install.agent_step is None else [install, _reboot(want, str(installed), info.loaded)]
        )
    if "not-loaded" in judged:
        return [_reboot(want, str(installed), loaded=info.loaded, installed=installed)]
    return []


def _clear_nouveau(want: Driver, desired: str) -> list[Change]:
    """The runfile refuses while nouveau holds the GPU: blacklist it and reboot first, install next time."""
    summary = f"blacklist nouveau (it holds the GPU, the runfile for {desired} would refuse)"
    if want.reboot == "never":
        summary = f"{summary}: by hand (modprobe.d, new initramfs, reboot), reboot policy is never"
        return [Change("driver", "manual", summary, "nouveau", None, reboot=True, phase="driver")]
    blacklist = Change(
        "driver", "update", summary, "nouveau", None, agent_step=protocol.nouveau_step(), phase="driver"
    )
    reboot = Change(
        "reboot",
        "update",
        "reboot to unbind nouveau; the next apply installs the driver",
        "nouveau",
        None,
        reboot=True,
        agent_step=protocol.reboot_step(),
        phase="reboot",
    )
    return [blacklist, reboot]


def branch_of_rig(want: Driver) -> str:
    """The branch the rig asks for (validate makes sure it names a version or a branch)."""
    return protocol.branch_of(want.version) if want.version else str(want.branch or "0")


def _flavor_mismatch(ctx: HostContext, want: Driver) -> str | None:
    """The module type running when it is not the one the rig's flavor asks for, else None. Without a
    flavor either type is accepted, except on GPUs that run only the open modules (Blackwell, Grace)."""
    running = ctx.facts.driver.kernel_module
    if running is None or ctx.host.os != "linux":
        return None
    if want.flavor is None and want.method != "runfile" and not open_modules_only(ctx.rig.gpus.model):
        return None
    flavor = resolve(want, ctx.facts.host, ctx.rig.gpus.model).flavor or ""
    if want.method == "runfile":
        wanted = sources.runfile_module_type(
            want.flavor, ctx.rig.gpus.model, protocol.branch_of(ctx.facts.driver.installed or "0")
        )
    else:
        wanted = "open" if flavor.endswith("open") else "proprietary"
    return running if running != wanted else None


def satisfies(installed: str | None, want: Driver) -> bool:
    return judge.satisfies(installed, want.version, want.branch)


def _install(
    ctx: HostContext,
    want: Driver,
    installed: str | None,
    desired: str,
    why: str = "",
    verb: str = "reinstall",
) -> Change:
    summary = f"driver {installed} → {desired}" if installed else f"install driver {desired}"
    if why:
        summary = f"{verb} driver {desired} ({why})"
    action: Action = "update" if installed else "create"
    if ctx.host.os != "linux":
        summary = f"{summary} (by hand on {ctx.host.os})"
        return Change("driver", "manual", summary, installed, desired, reboot=True, phase="driver")
    source = resolve(want, ctx.facts.host, ctx.rig.gpus.model)
    missing = ctx.facts.nvidia_repository_missing
    if source.name in NVIDIA_SOURCES and missing and want.repo is None and not source.problem:
        return check_failed("driver", f"{summary} ({source.label}): {missing}", installed, desired)
    if source.problem == families.NO_OS_RELEASE:  # nothing a person does by hand on the box would be right
        return check_failed("driver", f"{summary}: {source.problem}", installed, desired)
    if source.problem:
        summary = f"{summary}: {source.problem}"
        return Change("driver", "manual", summary, installed, desired, reboot=True, phase="driver")
    branch = branch_of_rig(want)
    if source.method == "runfile":
        module = sources.runfile_module_type(want.flavor, ctx.rig.gpus.model, branch)
        summary = f"{summary} (runfile, {module} kernel modules)"
        step = protocol.driver_step(
            "runfile", None, source.flavor, branch, want.version, want.hold, want.fabricmanager,
            runfile=want.runfile_url, sha256=want.runfile_sha256, kernel_module_type=module,
        )  # fmt: skip
    else:
        summary = f"{summary} ({source.label})"
        packages = _package_set(ctx, want, source, branch)
        step = protocol.driver_step(
            source.method, source.name, source.flavor, branch, want.version, want.hold, want.fabricmanager,
            packages=packages, modules=family_of(ctx.facts.host).modules,
            repo=ctx.driver_repo,
            prebuilt=ubuntu_server_set(source, branch, packages),
        )  # fmt: skip
    return Change("driver", action, summary, installed, desired, reboot=True, agent_step=step, phase="driver")


def _package_set(ctx: HostContext, want: Driver, source: Source, branch: str) -> protocol.PackageSet:
    """The packages the source's method installs for the rig's driver on this host."""
    assert source.name is not None and source.flavor is not None  # resolve() says a problem otherwise
    nvlink5 = nvlink5_hgx(ctx.rig.gpus.model)
    if source.method == "apt":
        return sources.apt_set(
            source.name, branch, source.flavor, want.fabricmanager, want.packages,
            debian_family=debian_family(ctx.facts.host), nvlink5=nvlink5,
        )  # fmt: skip
    if source.method == "zypper":  # every name at the version in one transaction, each locked
        return sources.zypper_set(branch, source.flavor, want.fabricmanager, nvlink5)
    # dnf, yum: one transaction, nothing to pin first or hold by pattern (versionlock does)
    exact = want.version is not None
    rpms = sources.dnf_packages(branch, source.flavor, exact, want.fabricmanager, nvlink5)
    return protocol.PackageSet([], rpms, [])


def ubuntu_server_set(source: Source, branch: str, packages: protocol.PackageSet) -> bool:
    """Whether apt installs Ubuntu's server driver as the source names it (not the rig's own packages, no
    Fabric Manager's): the set Canonical also builds signed prebuilt modules of, which the node takes for
    its running kernel where the archive has them."""
    flavor = source.flavor or ""
    if source.method != "apt" or source.name != "ubuntu" or not flavor.startswith("server"):
        return False
    return packages.install == names.driver_set("ubuntu", int(branch), flavor)[1]


def debian_family(host: HostInfo) -> bool:
    """A Debian node (not Ubuntu): NVIDIA's repository for it names the driver's libraries without the
    branch."""
    return family_of(host).source == "debian"


def _reboot(
    want: Driver, version: str, loaded: str | None, installed: str | None = None, why: str = ""
) -> Change:
    if why and want.reboot == "never":
        summary = f"{why}, the running ones are the other type: reboot required to load them (policy: never)"
        return Change("reboot", "manual", summary, loaded, version, reboot=True, phase="reboot")
    if want.reboot == "never":
        if installed == version and loaded is None:
            summary = f"installed {version}, no kernel module loaded: reboot required (policy: never)"
        else:
            summary = f"reboot required to load driver {version} (policy: never)"
        return Change(
            "reboot",
            "manual",
            summary,
            loaded,
            version,
            reboot=True,
            phase="reboot",
        )
    return Change(
        "reboot",
        "update",
        f"reboot to load driver {version} ({why}; running: {loaded or 'none'})"
        if why
        else f"reboot to load driver {version} (running: {loaded or 'none'})",
        loaded,
        version,
        reboot=True,
        agent_step=protocol.reboot_step(),
        phase="reboot",
    )
