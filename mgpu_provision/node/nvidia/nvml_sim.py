"""The simulated NVIDIA layer: NVML answers, driver installs and reboots taken from a twin file.

It behaves like a real box in the ways the control side can observe: NVML refuses to start with the same
statuses and messages (no driver, module not loaded, version mismatch after an install until a reboot),
links come and go as the twin's matrix and `nvlink_down` say, and a reboot yields a new boot id.
"""

from __future__ import annotations

import json
import os

from ...catalog import persistenced
from ...catalog.topology import nvlink_count
from ...protocol import FABRICMANAGER_UNIT, GPU_SETTINGS_UNIT, PERSISTENCED_UNIT, branch_of
from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.errors import AgentFailure
from ..packages.driver import version_key
from ..packages.imex import imex_domain
from .backend import P2P_NVLINK, REMOTE_GPU, REMOTE_SWITCH, Backend, NoSuchLink, NvmlUnavailable, nvml_message
from .sim_health import SimulatedHealth
from .twin import Twin, link_plan

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

_PCIE_LEVELS = {"PIX": 10, "PSB": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50, "SOC": 50}
_P2P_OK, _P2P_NOT_SUPPORTED = 0, 5
_SWITCH_BUSES = 4
IMEX = "nvidia-imex"


class SimulatedBackend(SimulatedHealth, Backend):
    simulated = True
    # The twin's pids are processes as the agent sees them (schemas/twin.schema.json).
    reports_host_pids = False

    def __init__(self, twin_path: str, state_dir: Optional[str] = None) -> None:
        self.twin = Twin(twin_path, state_dir)
        self._links = link_plan(self.twin)

    # --- outside NVML ---
    def loaded_version(self) -> Optional[str]:
        return self.twin.loaded_version() if self.twin.driver_version() else None

    def installed_version(self) -> Optional[str]:
        return self.twin.driver_version()

    def fabric_manager(self) -> Optional[Dict[str, Any]]:
        version = self.twin.fabricmanager_version()
        if version is None and not self.twin.nvswitch:
            return None
        if version is None:
            return {"version": None, "service": "absent", "enabled": False}
        return self._versioned_daemon(FABRICMANAGER_UNIT, version)

    def persistence_daemon(self) -> Dict[str, Any]:
        # It comes with the driver's packages, and runs only while the driver's module is loaded.
        if self.twin.driver_version() is None:
            return {"service": "absent", "enabled": False}
        unit = self.twin.service(PERSISTENCED_UNIT)
        running = unit["running"] and self.loaded_version() == self.twin.driver_version()
        service = "active" if running else "inactive"
        command = self.twin.exec_start(PERSISTENCED_UNIT)
        return {"service": service, "enabled": unit["enabled"], "exec_start": command}

    def imex(self) -> Optional[Dict[str, Any]]:
        # The twin's `imex:` is the installed package's version (schemas/twin.schema.json).
        version = self.twin.state.get("imex", self.twin.imex)
        if version is None:  # not installed
            return None
        daemon = self._versioned_daemon(IMEX, version)
        # Read only from a running daemon, as nvidia-imex-ctl reaches it (its command service).
        domain = imex_domain(json.dumps(self.twin.imex_domain)) if daemon["service"] == "active" else None
        return dict(daemon, channels=self.twin.imex_channels, domain=domain)

    def _versioned_daemon(self, unit_name: str, version: str) -> Dict[str, Any]:
        # Fabric Manager and IMEX refuse to start unless they match the loaded driver exactly.
        unit = self.twin.service(unit_name)
        matches = version == self.loaded_version()
        service = "inactive" if not unit["running"] else "active" if matches else "failed"
        return {"version": version, "service": service, "enabled": unit["enabled"]}

    def kernel_module(self) -> Optional[str]:
        # Only tracked when the twin says which modules run (driver.kernel_module); an install of the other
        # flavor switches it at the next boot.
        if self.loaded_version() is None:
            return None
        module = self.twin.state.get("kernel_module", self.twin.driver.get("kernel_module"))
        return None if module is None else str(module)

    def nouveau_loaded(self) -> bool:
        return self.twin.nouveau and not self.twin.state.get("nouveau_blacklisted_at_boot")

    def install_fabric_manager(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        version, unit = str(step["version"]), step["unit"]
        key, what = ("imex", unit) if unit == IMEX else ("fabricmanager", "Fabric Manager")
        imex = self.twin.state.get("imex", self.twin.imex)
        changed = (imex if key == "imex" else self.twin.fabricmanager_version()) != version
        if changed:
            # Saved here: switch_service saves only when the unit changes, and it was often enabled already.
            self.twin.state[key] = version
            self.twin.save_state()
        started, message = self.switch_service(unit, True, step["start"])
        return changed or started, f"installed {what} {version}; {message}" if changed else message

    def set_persistence_daemon(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        if self.twin.driver_version() is None:
            raise AgentFailure(
                "persistence", f"{PERSISTENCED_UNIT} is not installed; it comes with the driver's packages"
            )
        command = self.twin.exec_start(PERSISTENCED_UNIT)
        dropped = step["enabled"] and command is not None and not persistenced.persistence_on(command)
        if dropped and command is not None:  # as the real agent's drop-in does
            override = persistenced.exec_start_of([persistenced.drop_in(command)])
            self.twin.set_exec_start(PERSISTENCED_UNIT, override or command)
            self.twin.save_state()
        changed, message = self.switch_service(step["unit"], step["enabled"], step["start"])
        return changed or dropped, (f"drop-in with {persistenced.ON}; " if dropped else "") + message

    def unit_state(self, unit: str) -> Dict[str, Any]:
        found = self.twin.service(unit)
        return {"service": "active" if found["running"] else "inactive", "enabled": found["enabled"]}

    def switch_service(self, unit: str, enable: bool, start: bool, restart: bool = False) -> Tuple[bool, str]:
        before = self.twin.service(unit)
        after = {"enabled": enable, "running": (before["running"] or start) if enable else False}
        if restart and enable and start and before["running"]:
            self.twin.restarted(unit)
            self.twin.save_state()
            return True, f"{unit} restarted (simulated: in the twin's state, not systemd)"
        if after == before:
            return False, f"{unit} already {'enabled' if enable else 'disabled'}"
        self.twin.set_service(unit, **after)
        self.twin.save_state()
        # Said as what it is: the twin's state changed; systemctl on the node still says what it said.
        return True, f"{unit} {'enabled' if enable else 'disabled'}" + (
            " and started" if start and enable else ""
        ) + " (simulated: in the twin's state, not systemd)"

    def nvidia_repository_missing(self) -> Optional[str]:
        # The twin's `nvidia_repository: false` is a box whose package manager knows none of NVIDIA's.
        if self.twin.nvidia_repository:
            return None
        from ..packages import common

        release = dict(self.twin.os_release, os_platform_id=None)
        family = common.release_family(release)
        return None if family.method is None else common.repository_step(family.method, release)

    def blacklist_nouveau(self) -> Tuple[bool, str]:
        if self.twin.state.get("nouveau_blacklisted"):
            return False, "nouveau already blacklisted"
        self.twin.state["nouveau_blacklisted"] = True
        self.twin.save_state()
        return True, "blacklisted nouveau; reboot to unbind it"

    def distribution(self) -> Optional[Dict[str, object]]:
        return self.twin.os_release

    def machine(self) -> Optional[Dict[str, Any]]:
        return self.twin.machine

    def board(self) -> Dict[str, Optional[str]]:
        if self.twin.board:
            return {"vendor": self.twin.board.get("vendor"), "model": self.twin.board.get("model")}
        return system.dmi_board()

    def boot_id(self) -> str:
        return str(self.twin.state.get("boot_id") or self.twin.boot_id or system.boot_id())

    def install_driver(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        target = self._target_version(step)
        changed = False
        messages = []
        if self.twin.driver_version() != target:
            self.twin.state["driver_version"] = target
            changed = True
            # Says how a real node of the twin's distribution would have installed it (the plan chose).
            messages.append(f"installed driver {target} with {step['method']}")
        if step["fabricmanager"] and self.twin.fabricmanager_version() != target:
            self.twin.state["fabricmanager"] = target
            changed = True
            messages.append(f"installed Fabric Manager {target}")
        if self.twin.driver.get("kernel_module") and step["flavor"]:
            module = "open" if str(step["flavor"]).endswith("open") else "proprietary"
            changed = changed or module != self.kernel_module()
            self.twin.state["next_kernel_module"] = module
        if changed:
            self.twin.save_state()
            self._driver_files(target)
        if self.twin.loaded_version() != target:
            messages.append("reboot required to load it")
        return changed, "; ".join(messages) or f"driver {target} already installed"

    def _driver_files(self, version: str) -> None:
        """The installed driver's stand-in libraries under the twin's `containers.driver_root`, as a package
        install replaces them: the new version's files in, the old one's out."""
        from ..core.atomic import atomic_write  # only an install writes: facts must not load it
        from . import ctk_sim

        folder = self.twin.driver_root.rstrip("/") + ctk_sim.LIB_DIR if self.twin.driver_root else None
        if folder is None or not os.path.isdir(folder):
            return
        for name in os.listdir(folder):
            if name.startswith(ctk_sim.LIBRARIES) and not name.endswith("." + version):
                os.unlink(os.path.join(folder, name))
        for library in ctk_sim.LIBRARIES:
            path = os.path.join(folder, "{}.{}".format(library, version))
            if not os.path.exists(path):
                atomic_write(path, b"", 0o755)

    # --- the NVIDIA Container Toolkit: nvidia-ctk stands in as ctk_sim writes it ---
    def container_toolkit(self) -> Optional[str]:
        return self.twin.toolkit_version()

    def install_container_toolkit(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        version = str(step["version"])
        if self.twin.toolkit_version() == version:
            return False, "NVIDIA Container Toolkit {} already installed".format(version)
        self.twin.state["container_toolkit"] = version
        self.twin.save_state()
        return True, "installed NVIDIA Container Toolkit {} with {}".format(version, step["method"])

    def generate_cdi(self, step: Dict[str, Any]) -> Tuple[bool, str]:
        from . import ctk_sim

        if self.twin.toolkit_version() is None:
            raise AgentFailure("cdi", "nvidia-ctk: command not found (the toolkit is not installed)")
        try:  # nvidia-ctk's nvml mode needs NVML: it fails before the reboot that loads a new driver
            self.open()
        except NvmlUnavailable as exc:
            raise AgentFailure("cdi", "nvidia-ctk cdi generate failed: {}".format(exc.message)) from None
        # A GPU in MIG mode gets no whole-GPU device (pkg/nvcdi/lib-nvml.go); the twin has no MIG instances.
        gpus = [(index, str(gpu["uuid"]), int(gpu["minor"])) for index, gpu in enumerate(self.twin.gpus)
                if not (self.mig_mode(index) or (False, False))[0]]  # fmt: skip
        data = ctk_sim.spec(self.driver_version(), gpus, step["driver_root"], step["hook_path"])
        return ctk_sim.write_spec(step["output"], data)

    def configure_runtime(self, runtime: str) -> Tuple[bool, str]:
        from . import ctk_sim

        if self.twin.toolkit_version() is None:
            raise AgentFailure("runtime", "nvidia-ctk: command not found (the toolkit is not installed)")
        return ctk_sim.configure_runtime(runtime)

    def _target_version(self, step: Dict[str, Any]) -> str:
        if step["version"]:
            return str(step["version"])
        branch = step["branch"]
        current = self.twin.driver_version()
        if current and branch_of(current) == branch:
            return current
        candidates = [v for v in self.twin.available_drivers if branch_of(v) == branch]
        if not candidates:
            raise AgentFailure(
                "driver", f"no driver of branch {branch!r} is available (simulated: twin available_drivers)"
            )
        return max(candidates, key=version_key)

    def reboot(self) -> Optional[Callable[[], None]]:
        # A boot loads the installed driver, starts the enabled services and forgets NVML's settings.
        self.twin.state["loaded"] = self.twin.driver_version()
        self.twin.state.pop("persistence", None)
        if "next_kernel_module" in self.twin.state:
            self.twin.state["kernel_module"] = self.twin.state.pop("next_kernel_module")
        for unit in (FABRICMANAGER_UNIT, PERSISTENCED_UNIT, GPU_SETTINGS_UNIT):
            self.twin.set_service(unit, running=self.twin.service(unit)["enabled"])
        if not self.twin.service(GPU_SETTINGS_UNIT)["enabled"]:
            self.forget_gpu_settings()
        # else the unit ran at boot and set again what apply had set: the overlay keeps those values
        if self.twin.state.get("nouveau_blacklisted"):
            self.twin.state["nouveau_blacklisted_at_boot"] = True
        self.reboot_health()
        import uuid  # only a simulated reboot needs it (and it loads `platform`)

        self.twin.state["boot_id"] = str(uuid.uuid4())
        self.twin.save_state()
        return None

    # --- NVML ---
    def open(self) -> None:
        installed, loaded = self.twin.driver_version(), self.twin.loaded_version()
        if installed is None:
            raise NvmlUnavailable("no-driver", nvml_message("no-driver"))
        if loaded is None:
            raise NvmlUnavailable("driver-not-loaded", nvml_message("driver-not-loaded"))
        if loaded != installed:
            raise NvmlUnavailable("version-mismatch", nvml_message("version-mismatch"))

    def close(self) -> None:
        """Nothing to release: the twin was read when the backend was made."""

    def driver_version(self) -> str:
        return str(self.twin.driver_version())

    def cuda_driver_version(self) -> Optional[int]:
        cuda = self.twin.driver.get("cuda")
        if cuda is None:
            return None
        major, _, minor = str(cuda).partition(".")
        return int(major) * 1000 + int(minor or 0) * 10

    def device_count(self) -> int:
        return len(self.twin.gpus)

    def name(self, gpu: int) -> str:
        hang = self.twin.gpus[gpu]["nvml_hang_s"]
        if hang:  # as NVML does on a GPU that fell off the bus: the first call about it does not return
            import time

            time.sleep(hang)
        self.alive(gpu)
        return str(self.twin.gpus[gpu]["name"])

    def uuid(self, gpu: int) -> str:
        return str(self.twin.gpus[gpu]["uuid"])

    def pci_bus_id(self, gpu: int) -> str:
        return str(self.twin.gpus[gpu]["pci_bus_id"])

    def memory_total_bytes(self, gpu: int) -> int:
        return int(self.twin.gpus[gpu]["memory_mib"]) * 1024 * 1024

    def minor_number(self, gpu: int) -> Optional[int]:
        return int(self.twin.gpus[gpu]["minor"])

    def cpu_affinity(self, gpu: int) -> Optional[str]:
        given = self.twin.gpus[gpu].get("cpu_affinity")
        if given is not None:
            return str(given)
        matrix = self.twin.topology
        row = None if matrix is None else matrix.rows.get("GPU{}".format(gpu))
        return None if row is None or row.cpu_affinity in (None, "N/A") else row.cpu_affinity

    def persistence_mode(self, gpu: int) -> Optional[bool]:
        # The daemon keeps every GPU in persistence mode while it runs; else NVML's legacy setting counts.
        return self.persistence_daemon()["service"] == "active" or self.twin.persistence(gpu)

    def set_persistence_mode(self, gpu: int, enabled: bool) -> None:
        self.twin.state.setdefault("persistence", {})[str(gpu)] = enabled
        self.twin.save_state()

    def pcie_link(self, gpu: int) -> Dict[str, Optional[int]]:
        pcie = self.twin.gpus[gpu]["pcie"]
        return {key: pcie.get(key) for key in ("gen", "width", "max_gen", "max_width")}

    def nvlink_active(self, gpu: int, link: int) -> bool:
        entry = self._links.get((gpu, link))
        if entry is None:
            raise NoSuchLink()
        return entry[1]

    def nvlink_remote_type(self, gpu: int, link: int) -> Optional[int]:
        remote = self._links[(gpu, link)][0]
        return REMOTE_SWITCH if remote is None else REMOTE_GPU

    def nvlink_remote_bus_id(self, gpu: int, link: int) -> Optional[str]:
        remote = self._links[(gpu, link)][0]
        if remote is None:
            return f"00000000:{5 + link % _SWITCH_BUSES:02X}:00.0"
        return self.pci_bus_id(remote)

    def common_ancestor(self, a: int, b: int) -> Optional[int]:
        matrix = self.twin.topology
        return None if matrix is None else _PCIE_LEVELS.get(matrix.gpu_cell(a, b))

    def p2p_status(self, a: int, b: int, index: int) -> Optional[int]:
        if index != P2P_NVLINK:
            return self.p2p_read_status(a, b)
        matrix = self.twin.topology
        linked = matrix is not None and nvlink_count(matrix.gpu_cell(a, b)) > 0
        return _P2P_OK if linked else _P2P_NOT_SUPPORTED

    def processes(self, gpu: int) -> List[Tuple[int, Optional[int]]]:
        return self._running(gpu, mps_clients=False)

    def mps_processes(self, gpu: int) -> List[Tuple[int, Optional[int]]]:
        return self._running(gpu, mps_clients=True)

    def _running(self, gpu: int, mps_clients: bool) -> List[Tuple[int, Optional[int]]]:
        """The twin's holders on a GPU: MPS clients (`mps_client: true`) apart, as NVML lists them."""
        return [
            (int(p["pid"]), int(p["used_mib"]) * 1024 * 1024 if p.get("used_mib") is not None else None)
            for p in self.twin.processes
            if int(p.get("gpu", 0)) == gpu and bool(p.get("mps_client", False)) == mps_clients
        ]

    def holds_gpu(self, pid: int) -> Optional[bool]:
        # There is no /dev/nvidia* here: a process holds the simulated GPU while the twin, as it is now,
        # lists it.
        return any(int(p["pid"]) == pid for p in Twin(self.twin.path).processes)
