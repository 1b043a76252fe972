"""The agent protocol, defined once: each verb's arguments, the facts request, and the apply steps.

Both ends read this module: it ships to nodes inside the agent (Python 3.8, standard library only) and the
control side builds its requests with the functions below. The agent checks every request against
`VERB_ARGS` at its door, so a mistyped or missing value is a `bad-request` that names the argument, never a
traceback from deep inside a verb; verbs then read their arguments without checking types again. Unknown
keys are left alone, so an older agent answers a newer control side. The envelope around a request is
described in docs/ARCHITECTURE.md ("The agent protocol").
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

INSTALLED_FILE_KEYS = ("role", "path", "content", "mode")
# The systemd unit apply writes to set compute mode and power limit at every boot (NVML forgets both when the
# driver unloads); named here because the simulated reboot must know it as well as the plan.
GPU_SETTINGS_UNIT = "mgpu-provision-gpu-settings"
# A node whose agent sees this variable (set by its sshd, or passed on by the login shell) is simulated: its
# NVIDIA layer is the twin file the variable names.
SIMULATE_ENV = "MGPU_PROVISION_SIMULATE"


class BadRequest(Exception):
    """A request the agent refuses before any verb runs; the dispatcher answers it as kind `bad-request`."""


class Arg(NamedTuple):
    expected: str  # what the value must be, in words: "{verb}: `{name}` must be {expected}"
    ok: Callable[[Any], bool]
    required: bool = False


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and "\0" not in value and len(value) <= 4096


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text(required: bool = False) -> Arg:
    return Arg("a string", _is_text, required)


def line(required: bool = False) -> Arg:
    return Arg("a non-empty one-line string", lambda v: _is_text(v) and v != "" and "\n" not in v, required)


def optional_text() -> Arg:
    return Arg("a string or null", lambda v: v is None or _is_text(v))


def number(low: float = 0, high: float = math.inf, required: bool = False) -> Arg:
    words = "a number of {:g} or more".format(low) if high == math.inf else "a number from {:g} to {:g}"
    return Arg(words.format(low, high), lambda v: _is_number(v) and low <= v <= high, required)


def positive(required: bool = False) -> Arg:
    return Arg("a positive number", lambda v: _is_number(v) and v > 0, required)


def integer(low: int, high: Optional[int] = None, required: bool = False) -> Arg:
    words = "an integer >= {}".format(low) if high is None else "an integer from {} to {}".format(low, high)
    return Arg(words, lambda v: _is_int(v) and v >= low and (high is None or v <= high), required)


def flag() -> Arg:
    return Arg("true or false", lambda v: isinstance(v, bool))


def choice(*values: str, required: bool = False) -> Arg:
    return Arg("one of " + ", ".join(values), lambda v: v in values, required)


def texts() -> Arg:
    return Arg("a list of strings", lambda v: isinstance(v, list) and all(_is_text(x) for x in v))


def objects(required: bool = False) -> Arg:
    ok = lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v)  # noqa: E731
    return Arg("a list of objects", ok, required)


def positives(required: bool = False) -> Arg:
    ok = lambda v: isinstance(v, list) and all(_is_number(x) and x > 0 for x in v)  # noqa: E731
    return Arg("a list of positive numbers", ok, required)


def _is_installed_file(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(value.get(k), str) for k in INSTALLED_FILE_KEYS)


def installed_files() -> Arg:
    """Files a node must hold as apply writes them: role (for messages), path, content, mode ("0755")."""
    ok = lambda v: isinstance(v, list) and all(_is_installed_file(x) for x in v)  # noqa: E731
    return Arg("a list of objects with the strings " + ", ".join(INSTALLED_FILE_KEYS), ok)


def text_mapping() -> Arg:
    ok = lambda v: isinstance(v, dict) and all(_is_text(k) and _is_text(x) for k, x in v.items())  # noqa: E731
    return Arg("a mapping of names to strings", ok)


def text_lists_mapping() -> Arg:
    ok = lambda v: isinstance(v, dict) and all(  # noqa: E731
        _is_text(k) and isinstance(x, list) and all(_is_text(e) for e in x) for k, x in v.items()
    )
    return Arg("a mapping of names to lists of strings", ok)


def user_name() -> Arg:
    ok = lambda v: v is None or (_is_text(v) and v != "" and not any(c.isspace() or c in ":/" for c in v))  # noqa: E731
    return Arg("a user name or null", ok)


RECLAIM_POLICIES = ("never", "orphans", "orphans+patterns")
MAX_GRACE_S = 600.0

VERB_ARGS: Dict[str, Dict[str, Arg]] = {
    "facts": {
        "files": texts(),
        "include_content": flag(),
        "python": optional_text(),
        "xorg_paths": texts(),
        "xorg_layout_paths": texts(),
        "units": texts(),
        "state_dir": optional_text(),  # where the node keeps its previous health counter sample
    },
    "apply": {"lock": line(required=True), "lock_wait_s": number(), "steps": objects(), "simulated": flag()},
    "reboot": {"lock": line(), "lock_wait_s": number(), "simulated": flag()},
    "reclaim": {
        "policy": choice(*RECLAIM_POLICIES),
        "patterns": texts(),
        "grace_s": number(0, MAX_GRACE_S),
        "dry_run": flag(),
        "user": user_name(),
    },
    "smoke": {
        "python": line(required=True),
        "nnodes": integer(1, required=True),
        "node_rank": integer(0, required=True),
        "nproc_per_node": integer(1, required=True),
        "master_addr": line(required=True),
        "master_port": integer(1, 65535, required=True),
        "backend": choice("nccl", "gloo", required=True),
        "rdzv_backend": choice("static", "c10d", required=True),
        "rdzv_id": line(required=True),
        "run_id": line(),
        "timeout_s": positive(required=True),
        "batch_size": integer(1, required=True),
        "sizes_mib": positives(),  # none: sizes that suit the backend (node/verbs/smoke.py)
        "iters": integer(1),
        "env": text_mapping(),
        "path_prepend": text_lists_mapping(),  # what the env files put in front of PATH and the like
        "node": line(),
        "launcher": optional_text(),  # the installed mgpu-torchrun; null: smoke runs torchrun itself
        "files": installed_files(),  # checked before any rank starts
        "interconnect": choice("nvlink", "nvswitch", "pcie"),  # what joins the GPUs: sizes, NCCL transport
    },
    "smoke-cleanup": {"run_id": line(required=True), "node_rank": integer(0, required=True)},
}


def check_args(verb: str, args: Dict[str, Any]) -> None:
    """Raise BadRequest naming the first argument that is missing or of the wrong kind."""
    for name, arg in VERB_ARGS.get(verb, {}).items():
        if name not in args:
            if arg.required:
                raise BadRequest("{}: `{}` is missing; it must be {}".format(verb, name, arg.expected))
        elif not arg.ok(args[name]):
            raise BadRequest("{}: `{}` must be {}, got {!r}".format(verb, name, arg.expected, args[name]))


def check_request(verb: str, request: Dict[str, Any]) -> None:
    """The whole request's check: the twin path, then the verb's arguments."""
    if not optional_text().ok(request.get("simulate")):
        raise BadRequest("`simulate` must be a twin file path or null")
    check_args(verb, request.get("args") or {})


# --- the facts request -------------------------------------------------------------------------------


def facts_request(
    files: Sequence[str] = (),
    include_content: bool = False,
    python: Optional[str] = None,
    xorg_paths: Sequence[str] = (),
    xorg_layout_paths: Sequence[str] = (),
    units: Sequence[str] = (),
    state_dir: Optional[str] = None,
) -> Dict[str, Any]:
    """The `facts` verb's arguments. With no arguments: the minimal form, enough for GPUs, driver,
    processes and the boot id (what apply's reboot wait and reclaim's check need)."""
    return {
        "files": list(files),
        "include_content": include_content,
        "python": python,
        "xorg_paths": list(xorg_paths),
        # X config files (folders: their *.conf) whose ServerLayout sections would hide the managed snippet
        "xorg_layout_paths": list(xorg_layout_paths),
        # systemd units (by name) whose state the plan judges beyond the NVIDIA services facts always report
        "units": list(units),
        # the node's state folder: health counters are judged as their change since the previous sample
        "state_dir": state_dir,
    }


# --- apply steps: what the `apply` verb carries out, one kind each ---------------------------------------

FILE, DRIVER, PERSISTENCE = "file", "driver", "persistence"
COMPUTE_MODE, POWER_LIMIT = "compute-mode", "power-limit"
FABRICMANAGER, PERSISTENCED, SERVICE, NOUVEAU = "fabricmanager", "persistenced", "service", "nouveau"
REMOVE = "remove"
STEP_KINDS = (
    FILE, REMOVE, DRIVER, FABRICMANAGER, PERSISTENCED, SERVICE, NOUVEAU, PERSISTENCE, COMPUTE_MODE,
    POWER_LIMIT,
)  # fmt: skip
# Not an `apply` step: carried out by the `reboot` verb between two facts reads.
REBOOT = "reboot"


def file_step(path: str, content: str, mode: str) -> Dict[str, Any]:
    """Make `path` hold `content` with permission bits `mode` (octal text such as "0644"), atomically."""
    return {"kind": FILE, "path": path, "content": content, "mode": mode}


def remove_step(path: str) -> Dict[str, Any]:
    """Make sure `path` does not exist (a managed file the rig no longer wants); a backup keeps its text."""
    return {"kind": REMOVE, "path": path}


def persistence_step(gpus: List[int], enabled: bool) -> Dict[str, Any]:
    return {"kind": PERSISTENCE, "gpus": list(gpus), "enabled": enabled}


def compute_mode_step(gpus: List[int], mode: str) -> Dict[str, Any]:
    """Set the compute mode ("default", "exclusive_process" or "prohibited") of `gpus`."""
    return {"kind": COMPUTE_MODE, "gpus": list(gpus), "mode": mode}


def power_limit_step(gpus: List[int], watts: Optional[int]) -> Dict[str, Any]:
    """Set the power limit of `gpus` to `watts`, or with None to each GPU's default limit."""
    return {"kind": POWER_LIMIT, "gpus": list(gpus), "watts": watts}


def driver_step(method: str, target: Dict[str, str], **options: Any) -> Dict[str, Any]:
    """Install a driver: `target` is {"version": ...} or {"branch": ...}; options as the method needs them."""
    return dict({"kind": DRIVER, "method": method}, **target, **options)


def fabricmanager_step(version: str, **options: Any) -> Dict[str, Any]:
    """Fabric Manager (and NSCQ) at exactly `version`, held, its unit enabled; started when `start`.
    Options: source, method, flavor, hold, start."""
    return dict({"kind": FABRICMANAGER, "version": version}, **options)


def service_step(unit: str, enable: bool, start: bool) -> Dict[str, Any]:
    """Enable (and start, when the driver's module is loaded) or disable and stop a unit (an NVIDIA service
    or the unit apply writes)."""
    return {"kind": SERVICE, "unit": unit, "enable": enable, "start": start}


def persistenced_step(enabled: bool, start: bool, **package: str) -> Dict[str, Any]:
    """nvidia-persistenced enabled (and started) or turned off; `package` and `method` where it is a
    package of its own that may need installing."""
    return dict({"kind": PERSISTENCED, "enabled": enabled, "start": start}, **package)


def nouveau_step() -> Dict[str, Any]:
    """Blacklist nouveau (modprobe.d and a new initramfs): it leaves at the next boot."""
    return {"kind": NOUVEAU}


def reboot_step() -> Dict[str, Any]:
    return {"kind": REBOOT}


# --- the other verbs' requests --------------------------------------------------------------------------


def apply_request(
    lock: str, lock_wait_s: float, steps: List[Dict[str, Any]], simulated: bool
) -> Dict[str, Any]:
    """Carry out `steps` in order under the host lock `lock`, waiting up to `lock_wait_s` for it; only on a
    node that is (`simulated`) what its facts said it is."""
    return {"lock": lock, "lock_wait_s": lock_wait_s, "steps": steps, "simulated": simulated}


def reboot_request(lock: str, lock_wait_s: float, simulated: bool) -> Dict[str, Any]:
    """Reboot once the host lock is free (a reboot must not land in the middle of another apply)."""
    return {"lock": lock, "lock_wait_s": lock_wait_s, "simulated": simulated}


def reclaim_request(
    policy: str, patterns: Sequence[str], grace_s: float, dry_run: bool, user: Optional[str] = None
) -> Dict[str, Any]:
    """`user`: end only that user's processes (None: anyone's)."""
    return {
        "policy": policy,
        "patterns": list(patterns),
        "grace_s": grace_s,
        "dry_run": dry_run,
        "user": user,
    }


def smoke_cleanup_request(run_id: str, node_rank: int) -> Dict[str, Any]:
    """End one node's leftovers of a smoke run, for when that node's `smoke` call died."""
    return {"run_id": run_id, "node_rank": node_rank}
