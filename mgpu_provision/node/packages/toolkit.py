"""The NVIDIA Container Toolkit on a real node: its packages at one version (held), and `nvidia-ctk` itself
for CDI specs and runtime configs.

The packages (catalog/containers.py: the plan names them in the step) come from NVIDIA's
libnvidia-container repository, all at one version; apt looks the version up first, so one the sources lack
fails before anything changes.
"""

from __future__ import annotations

import os
import re

from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.errors import AgentFailure
from .common import Command, installed_debs, installed_rpms, resolve_version, run_all, upstream

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

NVIDIA_CTK = "nvidia-ctk"
_VERSION = re.compile(r"version (\d+\.\d+\.\d+)")


def installed_version() -> Optional[str]:
    """The version `nvidia-ctk --version` reports ("NVIDIA Container Toolkit CLI version 1.17.8"), None
    when it is not installed."""
    result = system.run([NVIDIA_CTK, "--version"], timeout=30)  # exit 127 where it is not installed
    found = _VERSION.search(result.stdout) if result.returncode == 0 else None
    return found.group(1) if found else None


def install_commands(step: Dict[str, Any], target: str) -> List[Command]:
    """Lift the holds, install every package at `target` in one transaction, hold them again."""
    method, packages, hold = step["method"], step["packages"], step["hold"]
    if method == "apt":
        install = ["apt-get", "install", "-y", "--no-install-recommends", "--allow-downgrades"]
        commands = [Command(["apt-mark", "unhold", *packages], check=False)]
        commands.append(Command(install + ["{}={}".format(p, target) for p in packages]))
        return commands + ([Command(["apt-mark", "hold", *packages])] if hold else [])
    if method == "zypper":
        commands = [Command(["zypper", "--non-interactive", "removelock", *packages], check=False)]
        wanted = ["{}={}".format(p, target) for p in packages]
        commands.append(Command(["zypper", "--non-interactive", "install", "--oldpackage", *wanted]))
        return commands + ([Command(["zypper", "--non-interactive", "addlock", *packages])] if hold else [])
    commands = [Command([method, "versionlock", "delete", *packages], check=False)]
    commands.append(Command([method, "install", "-y", *["{}-{}".format(p, target) for p in packages]]))
    return commands + ([Command([method, "versionlock", "add", *packages])] if hold else [])


def install(step: Dict[str, Any]) -> Tuple[bool, str]:
    """The toolkit at the step's version; nothing when every package is there already."""
    version, method, packages = step["version"], step["method"], step["packages"]
    have = _installed(method, packages)
    if packages and all(upstream(have.get(p, "")) == version for p in packages):
        return False, "NVIDIA Container Toolkit {} already installed".format(version)
    if method == "apt":
        run_all([Command(["apt-get", "update", "-q"])], "container-toolkit")
        from .apt import _offered

        target = resolve_version(packages, _offered, version, version, "the apt sources")
    else:
        target = version
    run_all(install_commands(step, target), "container-toolkit")
    return True, "installed NVIDIA Container Toolkit {} with {}{}".format(
        version, method, ", held" if step["hold"] else ""
    )


def _installed(method: str, packages: List[str]) -> Dict[str, str]:
    if method == "apt":
        return {name: deb for name, (deb, _) in installed_debs(tuple(packages)).items()}
    return installed_rpms(packages)


def generate(step: Dict[str, Any]) -> Tuple[bool, str]:
    """`nvidia-ctk cdi generate` into a file beside the output, then renamed over it: a runtime never reads
    half a spec, and an unchanged spec is left as it was."""
    output = step["output"]
    fmt = "json" if output.endswith(".json") else "yaml"
    temporary = "{}.mgpu-provision.tmp".format(output)  # no .yaml/.json: runtimes do not read it
    os.makedirs(os.path.dirname(output), exist_ok=True)
    argv = [NVIDIA_CTK, "cdi", "generate", "--output={}".format(temporary), "--format={}".format(fmt),
            "--driver-root={}".format(step["driver_root"]),
            # The flag every release takes: 1.12-1.15 call it so, 1.16+ keep it as the alias of
            # --nvidia-cdi-hook-path (cmd/nvidia-ctk/cdi/generate/generate.go at v1.15.0, v1.16.0).
            "--nvidia-ctk-path={}".format(step["hook_path"])]  # fmt: skip
    result = system.run(argv, timeout=300)
    if result.returncode != 0:
        if os.path.exists(temporary):
            os.unlink(temporary)
        said = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise AgentFailure(
            "cdi", "nvidia-ctk cdi generate failed (exit {}): {}".format(result.returncode, said[0])
        )
    return replace_if_changed(temporary, output)


def replace_if_changed(temporary: str, output: str) -> Tuple[bool, str]:
    with open(temporary, "rb") as handle:
        new = handle.read()
    if system.read_text(output) == new.decode("utf-8", "replace"):
        os.unlink(temporary)
        return False, "{} is up to date".format(output)
    os.replace(temporary, output)
    return True, "generated {}".format(output)


def configure_runtime(runtime: str) -> Tuple[bool, str]:
    """`nvidia-ctk runtime configure --runtime=<runtime>`; the runtime reads it at its next start."""
    result = system.run([NVIDIA_CTK, "runtime", "configure", "--runtime={}".format(runtime)], timeout=120)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise AgentFailure("runtime", "nvidia-ctk runtime configure failed: {}".format(said[0]))
    return True, "configured the nvidia runtime for {}; restart {} to load it".format(runtime, runtime)
