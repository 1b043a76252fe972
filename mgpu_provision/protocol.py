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

from .typing_lite import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

INSTALLED_FILE_KEYS = ("role", "path", "content", "mode")
# The systemd unit apply writes to set compute mode and power limit at every boot (NVML forgets both when the
# driver unloads); named here because the simulated reboot must know it as well as the plan.
GPU_SETTINGS_UNIT = "mgpu-provision-gpu-settings"
# A node whose agent sees this variable (set by its sshd, or passed on by the login shell) is simulated: its
# NVIDIA layer is the twin file the variable names.
SIMULATE_ENV = "MGPU_PROVISION_SIMULATE"


# The kinds of an error reply (`{"ok": false, "error": {"kind", "message"}}`): the node sends no other (the
# door turns an undeclared one into `internal`) and the control side reads no other (it names the kind).
ERROR_KINDS = (
    "bad-request",  # an argument or step missing or of the wrong type, named; or not possible as asked
    "twin",  # the twin file or its state cannot be read or says something impossible
    "locked",  # another apply (or check) holds the host lock
    "lock",  # the host lock cannot be taken (its folder)
    "refused",  # not the node it was planned as (simulated or real), or not the planned agent
    "pid-namespace",  # reclaim with real NVML outside the initial pid namespace
    "driver",  # installing or checking the driver, its packages or its mirror
    "fabricmanager",  # installing Fabric Manager or IMEX
    "nouveau",  # blacklisting nouveau (a new initramfs)
    "persistence",  # nvidia-persistenced
    "service",  # enabling, starting or stopping a unit
    "restart",  # the restart step's command (slurmd after gres.conf)
    "slurm",  # scontrol or srun
    "container-toolkit",  # installing the NVIDIA Container Toolkit's packages
    "cdi",  # nvidia-ctk cdi generate (NVML unavailable, the toolkit missing)
    "runtime",  # nvidia-ctk runtime configure (a runtime's config it cannot read)
    "nvml",  # NVML cannot be opened or refuses a setting
    "internal",  # a bug in the agent: the traceback is on stderr
)


class BadRequest(Exception):
    """A request the agent refuses before any verb runs; the dispatcher answers it as kind `bad-request`."""


class Arg(NamedTuple):
    expected: str  # what the value must be, in words: "{verb}: `{name}` must be {expected}"
    ok: Callable[[Any], bool]
    required: bool = False
    default: Any = None  # an argument or step field left out: the door fills this in


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


def flag(required: bool = False) -> Arg:
    return Arg("true or false", lambda v: isinstance(v, bool), required)


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


MIRROR_KEYS = ("url", "key", "suite", "components")


def _is_mirror(value: Any) -> bool:
    if not isinstance(value, dict) or set(value) - set(MIRROR_KEYS) or not {"url", "key"} <= set(value):
        return False
    key = value["key"]  # an armored key with its signatures outgrows _is_text's bound
    small = all(_is_text(v) for k, v in value.items() if k != "key")
    return small and line().ok(value["url"]) and isinstance(key, str) and "\0" not in key and len(key) < 65536


def apt_mirror() -> Arg:
    """An apt mirror of the driver (`driver.repo`): url and ASCII-armored key, suite and components."""
    words = "null or a mapping of url, key (and suite, components) to strings"
    return Arg(words, lambda v: v is None or _is_mirror(v))


def pids() -> Arg:
    ok = lambda v: isinstance(v, list) and all(_is_int(x) and x >= 1 for x in v)  # noqa: E731
    return Arg("a list of pids (integers >= 1)", ok)


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


def _is_baseline_record(value: Any) -> bool:
    entry = value.get("entry") if isinstance(value, dict) else None
    return isinstance(entry, dict) and _is_text(value.get("key")) and isinstance(value.get("node", {}), dict)


def baseline_record(required: bool = False) -> Arg:
    """One group's smoke baseline: its key, its entry (an object) and this node's entry (an object)."""
    words = "an object with the string `key` and the objects `entry` and `node`"
    return Arg(words, _is_baseline_record, required)


def _is_facts_after(value: Any) -> bool:
    if value is None:
        return True
    return (
        isinstance(value, dict)
        and isinstance(value.get("args"), dict)
        and positive().ok(value.get("timeout_s"))
    )


def facts_after() -> Arg:
    """apply's `then_facts`: the facts arguments to read once the steps are done, and how long it may take."""
    words = "null or an object with the facts arguments `args` and a positive `timeout_s`"
    return Arg(words, _is_facts_after)


def user_name() -> Arg:
    ok = lambda v: v is None or (_is_text(v) and v != "" and not any(c.isspace() or c in ":/" for c in v))  # noqa: E731
    return Arg("a user name or null", ok)


# The runtimes a rig may name (`containers.runtimes`); nvidia-ctk configures all but podman, which reads CDI.
CONTAINER_RUNTIMES = ("docker", "containerd", "cri-o", "podman")
CONFIGURED_RUNTIMES = ("docker", "containerd", "cri-o")


def runtime_list() -> Arg:
    ok = lambda v: v is None or (isinstance(v, list) and all(x in CONTAINER_RUNTIMES for x in v))  # noqa: E731
    return Arg("null or a list of " + ", ".join(CONTAINER_RUNTIMES), ok)


def with_default(arg: Arg, default: Any) -> Arg:
    """`arg` that a request or step may leave out, the door then filling in `default` (a list or mapping
    is copied for each request)."""
    return arg._replace(required=False, default=default)


RECLAIM_POLICIES = ("never", "orphans", "orphans+patterns")
MAX_GRACE_S = 600.0
LOCK_WAIT_S = 10.0  # how long apply and reboot wait for the host lock when the request does not say

VERB_ARGS: Dict[str, Dict[str, Arg]] = {
    "facts": {
        "files": with_default(texts(), []),
        "include_content": with_default(flag(), False),
        "python": optional_text(),  # null: no torch probe
        "xorg_paths": with_default(texts(), []),
        "xorg_layout_paths": with_default(texts(), []),
        "units": with_default(texts(), []),
        "driver_repo": apt_mirror(),  # checked: does the driver's set resolve from this mirror alone
        "driver_packages": with_default(texts(), []),
        "nvidia_repository": with_default(flag(), False),  # is one of NVIDIA's repositories configured
        "state_dir": optional_text(),  # where the node keeps its previous health counter sample
        "slurm": with_default(flag(), False),
        "containers": runtime_list(),  # null: no containers section; else the runtimes to read
    },
    "apply": {
        "lock": line(required=True),
        "lock_wait_s": with_default(number(), LOCK_WAIT_S),
        "steps": with_default(objects(), []),
        "simulated": flag(),  # null: not checked
        # null: none; else the reply's `facts` is the reply of a `facts` call with these arguments, made by a
        # new agent process once the steps are done and the lock released (one login fewer a host)
        "then_facts": facts_after(),
    },
    # lock null: no lock is waited for
    "reboot": {"lock": line(), "lock_wait_s": with_default(number(), LOCK_WAIT_S), "simulated": flag()},
    "reclaim": {
        "policy": with_default(choice(*RECLAIM_POLICIES), "orphans"),
        "patterns": with_default(texts(), []),
        "grace_s": with_default(number(0, MAX_GRACE_S), 10.0),
        "dry_run": with_default(flag(), True),
        "user": user_name(),  # null: anyone's processes
        "pids": with_default(pids(), []),  # `reclaim --pid`: end exactly these, whatever their classification
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
        "run_id": line(),  # null: the rdzv_id
        "timeout_s": positive(required=True),
        "batch_size": integer(1, required=True),
        "sizes_mib": with_default(positives(), []),  # none: sizes that suit the backend (node/verbs/smoke.py)
        "iters": integer(1),  # null: what suits the backend
        "env": with_default(text_mapping(), {}),
        "path_prepend": with_default(text_lists_mapping(), {}),  # what the env files put before PATH and such
        "node": line(),  # null: the node's hostname
        "launcher": optional_text(),  # the installed mgpu-torchrun; null: smoke runs torchrun itself
        "files": with_default(installed_files(), []),  # checked before any rank starts
        "interconnect": choice("nvlink", "nvswitch", "pcie"),  # what joins the GPUs: sizes, NCCL transport
        "state_dir": optional_text(),  # where the box keeps its smoke baseline, sent back in the answer
    },
    "smoke-cleanup": {"run_id": line(required=True), "node_rank": integer(0, required=True)},
    # a passing group's figures, into each node's baseline (node/verbs/smoke_baseline.py)
    "smoke-baseline": {"state_dir": line(required=True), "record": baseline_record(required=True)},
    # apply --drain slurm: the node's line at the controller; drain it, or resume a drain of this reason
    "slurm-node": {"action": choice("show", "drain", "resume", required=True), "reason": line()},
}
# smoke --via srun: smoke's arguments, and which part of the srun step (node/verbs/slurm_smoke.py)
VERB_ARGS["slurm-smoke"] = {
    **VERB_ARGS["smoke"],
    "action": choice("prepare", "run", "collect", required=True),
    "nodes": with_default(texts(), []),  # `run`: the group's Slurm node names, for srun -w
    # `run`: what the step asks Slurm for (GPUs, CPUs, partition, ...)
    "srun_options": with_default(texts(), []),
}


def _default(arg: Arg) -> Any:
    """The default the door fills in, a fresh copy of a list or mapping for each request."""
    return type(arg.default)(arg.default) if isinstance(arg.default, (list, dict)) else arg.default


def check_args(verb: str, args: Dict[str, Any]) -> Dict[str, Any]:
    """The verb's arguments with every declared default filled in (unknown keys kept: an older agent
    answers a newer control side); BadRequest naming the first one missing or of the wrong kind."""
    filled = dict(args)
    for name, arg in VERB_ARGS.get(verb, {}).items():
        if name not in args:
            if arg.required:
                raise BadRequest("{}: `{}` is missing; it must be {}".format(verb, name, arg.expected))
            filled[name] = _default(arg)
        elif not arg.ok(args[name]):
            raise BadRequest("{}: `{}` must be {}, got {!r}".format(verb, name, arg.expected, args[name]))
    return filled


def check_request(verb: str, request: Dict[str, Any]) -> None:
    """The whole request's check: the twin path, the verb's arguments, then every apply step's fields.
    `request["args"]` is replaced by the checked arguments, defaults filled in (each apply step's too): the
    node reads each of them without a fallback."""
    if not optional_text().ok(request.get("simulate")):
        raise BadRequest("`simulate` must be a twin file path or null")
    args = check_args(verb, request.get("args") or {})
    if verb == "apply":
        args["steps"] = [check_step(index, step) for index, step in enumerate(args["steps"])]
        if args["then_facts"] is not None:
            try:
                then = args["then_facts"]
                args["then_facts"] = dict(then, args=check_args("facts", then["args"]))
            except BadRequest as exc:
                raise BadRequest("apply: `then_facts`: {}".format(exc)) from None
    request["args"] = args


# --- the facts request -------------------------------------------------------------------------------


def facts_request(
    files: Sequence[str] = (),
    include_content: bool = False,
    python: Optional[str] = None,
    xorg_paths: Sequence[str] = (),
    xorg_layout_paths: Sequence[str] = (),
    units: Sequence[str] = (),
    driver_repo: Optional[Dict[str, str]] = None,
    driver_packages: Sequence[str] = (),
    nvidia_repository: bool = False,
    state_dir: Optional[str] = None,
    slurm: bool = False,
    containers: Optional[Sequence[str]] = None,
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
        # the rig's driver mirror and the set to install from it: facts simulate the install there
        "driver_repo": driver_repo,
        "driver_packages": list(driver_packages),
        # whether the box's package manager has one of NVIDIA's repositories (a rig installing its packages)
        "nvidia_repository": nvidia_repository,
        # the node's state folder: health counters are judged as their change since the previous sample
        "state_dir": state_dir,
        # what slurmd would register and what the controller holds, and every CPU's place (`machine`), for a
        # rig with a `slurm` section
        "slurm": slurm,
        # the toolkit, the CDI specs and these runtimes' configs (a rig with a `containers` section)
        "containers": None if containers is None else list(containers),
    }


# --- apply steps: what the `apply` verb carries out, one kind each ---------------------------------------

FILE, DRIVER, PERSISTENCE = "file", "driver", "persistence"
COMPUTE_MODE, POWER_LIMIT = "compute-mode", "power-limit"
FABRICMANAGER, PERSISTENCED, SERVICE, NOUVEAU = "fabricmanager", "persistenced", "service", "nouveau"
REMOVE = "remove"
AGENT = "agent"  # the running agent's own zipapp, copied to where the node check runs it from
RESTART = "restart"  # a daemon that reads a managed file only when it starts (slurmd and gres.conf)
# The NVIDIA Container Toolkit: its packages, `nvidia-ctk cdi generate`, `nvidia-ctk runtime configure`.
CONTAINER_TOOLKIT, CDI_GENERATE, RUNTIME_CONFIGURE = "container-toolkit", "cdi-generate", "runtime-configure"
# Not an `apply` step: carried out by the `reboot` verb between two facts reads.
REBOOT = "reboot"
COMPUTE_MODES = ("default", "exclusive_process", "prohibited")
# The package managers (node/packages/families.py picks one per distribution) and NVIDIA's installer.
PACKAGE_METHODS = ("apt", "dnf", "yum", "zypper")
DRIVER_METHODS = (*PACKAGE_METHODS, "runfile")
FABRICMANAGER_UNIT = "nvidia-fabricmanager"
PERSISTENCED_UNIT = "nvidia-persistenced"


def branch_of(version: str) -> str:
    """A dotted version's leading number: a driver's branch ("550.54.15" -> "550"), a release's major ("9.4"
    -> "9"). The one place either side derives it."""
    return version.split(".", 1)[0]


def _is_gpu_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(x) and x >= 0 for x in value)


def gpu_list(required: bool = False) -> Arg:
    return Arg("a list of GPU indices", _is_gpu_list, required, [])


# recover: reset these GPUs (`together`: every GPU of an NVSwitch box) once no process holds them; declared
# here, after the GPU list it takes.
VERB_ARGS["gpu-reset"] = {
    "gpus": gpu_list(required=True),
    "together": with_default(flag(), False),
    "wait_s": with_default(number(0, 86400), 300.0),  # how long processes may still hold the GPUs
    "state_dir": optional_text(),  # where the reset is recorded: the node check judges Xids after it
    "lock": line(),
    "lock_wait_s": with_default(number(), LOCK_WAIT_S),
}


def octal_mode() -> Arg:
    ok = lambda v: _is_text(v) and v.isdigit() and set(v) <= set("01234567") and int(v, 8) <= 0o7777  # noqa: E731
    return Arg("an octal permission like 0644", ok, False, "0644")


def digits(required: bool = False) -> Arg:
    return Arg("a string of digits", lambda v: _is_text(v) and v.isdigit(), required)


def optional_line() -> Arg:
    return Arg("a one-line string or null", lambda v: v is None or line().ok(v))


def optional_watts() -> Arg:
    ok = lambda v: v is None or (_is_int(v) and v >= 1)  # noqa: E731
    return Arg("a whole number of watts (1 or more) or null", ok, True)


def optional_choice(*values: str) -> Arg:
    return Arg("one of " + ", ".join(values) + " or null", lambda v: v is None or v in values)


# The package set the plan resolved (PackageSet: `packages` are its `install`, `hold_patterns` its `hold`).
_PACKAGE_SET = {
    "packages": with_default(texts(), []),  # installed at the pinned version
    "pinning": with_default(texts(), []),  # installed first: NVIDIA's branch-locking package
    "hold_patterns": with_default(texts(), []),  # every installed package these match is held
}
# Every step kind's fields, checked (and defaults filled in) at the agent's door like VERB_ARGS.
STEP_FIELDS: Dict[str, Dict[str, Arg]] = {
    FILE: {"path": line(required=True), "content": text(required=True), "mode": octal_mode()},
    REMOVE: {"path": line(required=True)},
    DRIVER: dict(
        {
            "method": choice(*DRIVER_METHODS, required=True),
            "source": Arg("a driver source or null", optional_line().ok, True),  # null: the runfile
            "flavor": Arg("a driver flavor or null", optional_line().ok, True),
            "branch": digits(required=True),
            "version": with_default(optional_line(), None),  # null: the newest of the branch
            "hold": with_default(flag(), False),
            "fabricmanager": with_default(flag(), False),  # with its packages (dnf: in one transaction)
            "modules": with_default(flag(), True),  # dnf: the branch's module stream exists
            "runfile": with_default(optional_text(), None),  # runfile: the installer's path or https URL
            "sha256": with_default(optional_line(), None),
            "kernel_module_type": with_default(optional_choice("open", "proprietary"), None),
            "repo": with_default(apt_mirror(), None),  # configure this mirror and install from it
            # apt on Ubuntu: `packages` is the server set, so Canonical's signed prebuilt modules for the
            # running kernel replace it where the archive has them (else DKMS builds the modules)
            "prebuilt": with_default(flag(), False),
        },
        **_PACKAGE_SET,
    ),
    FABRICMANAGER: dict(
        {
            "version": line(required=True),
            "branch": digits(required=True),
            "source": line(required=True),
            "method": choice(*PACKAGE_METHODS, required=True),
            "unit": line(required=True),
            "hold": with_default(flag(), False),
            "start": with_default(flag(), False),
        },
        **_PACKAGE_SET,
    ),
    PERSISTENCED: {
        "enabled": flag(required=True),
        "start": flag(required=True),
        "unit": line(required=True),
        "package": with_default(optional_line(), None),  # where it is a package of its own
        "method": with_default(optional_choice(*PACKAGE_METHODS), None),  # what installs `package`
    },
    SERVICE: {
        "unit": line(required=True),
        "enable": flag(required=True),
        "start": flag(required=True),
        "restart": with_default(flag(), False),  # started again though it runs: it read a changed file
    },
    NOUVEAU: {},
    RESTART: {"command": Arg("a non-empty list of strings", lambda v: texts().ok(v) and bool(v), True)},
    PERSISTENCE: {"gpus": gpu_list(), "enabled": flag(required=True)},  # gpus []: every GPU
    COMPUTE_MODE: {"gpus": gpu_list(), "mode": choice(*COMPUTE_MODES, required=True)},
    POWER_LIMIT: {"gpus": gpu_list(), "watts": optional_watts()},  # watts null: each GPU's default
    AGENT: {"path": line(required=True), "sha256": line(required=True)},  # sha256: of the planned agent
    CONTAINER_TOOLKIT: {
        "version": line(required=True),
        "method": choice(*PACKAGE_METHODS, required=True),
        "hold": with_default(flag(), False),
        "packages": with_default(texts(), []),  # installed at the version, in one transaction
    },
    CDI_GENERATE: {
        "output": line(required=True),
        "driver_root": with_default(line(), "/"),
        "hook_path": with_default(line(), "/usr/bin/nvidia-cdi-hook"),
    },
    RUNTIME_CONFIGURE: {"runtime": choice(*CONFIGURED_RUNTIMES, required=True)},
}
STEP_KINDS = tuple(STEP_FIELDS)


def check_step(index: int, step: Any) -> Dict[str, Any]:
    """The step with its defaults filled in; BadRequest naming the step's index, kind and field otherwise."""
    if not isinstance(step, dict) or step.get("kind") not in STEP_FIELDS:
        kind = step.get("kind") if isinstance(step, dict) else step
        raise BadRequest(
            "apply: step {}: unknown kind {!r}; kinds are {}".format(index, kind, ", ".join(STEP_KINDS))
        )
    kind = step["kind"]
    fields = STEP_FIELDS[kind]
    where = "apply: step {} ({})".format(index, kind)
    unknown = sorted(name for name in step if name != "kind" and name not in fields)
    if unknown:
        fields_are = ", ".join(fields) if fields else "none"
        raise BadRequest("{}: unknown field `{}`; its fields are {}".format(where, unknown[0], fields_are))
    filled = {"kind": kind}
    for name, arg in fields.items():
        if name not in step:
            if arg.required:
                raise BadRequest("{}: `{}` is missing; it must be {}".format(where, name, arg.expected))
            filled[name] = _default(arg)
        elif not arg.ok(step[name]):
            raise BadRequest("{}: `{}` must be {}, got {!r}".format(where, name, arg.expected, step[name]))
        else:
            filled[name] = step[name]
    return filled


def file_step(path: str, content: str, mode: str) -> Dict[str, Any]:
    """Make `path` hold `content` with permission bits `mode` (octal text such as "0644"), atomically."""
    return {"kind": FILE, "path": path, "content": content, "mode": mode}


def remove_step(path: str) -> Dict[str, Any]:
    """Make sure `path` does not exist (a managed file the rig no longer wants); a backup keeps its text."""
    return {"kind": REMOVE, "path": path}


def agent_step(path: str, sha256: str) -> Dict[str, Any]:
    """Install the agent that carries the step out at `path`, when its zipapp's digest is `sha256` (the one
    the plan was made with: the facts report it)."""
    return {"kind": AGENT, "path": path, "sha256": sha256}


def restart_step(command: List[str]) -> Dict[str, Any]:
    """Run `command` (e.g. systemctl restart slurmd); its failure fails the step with its output."""
    return {"kind": RESTART, "command": list(command)}


def persistence_step(gpus: List[int], enabled: bool) -> Dict[str, Any]:
    return {"kind": PERSISTENCE, "gpus": list(gpus), "enabled": enabled}


def compute_mode_step(gpus: List[int], mode: str) -> Dict[str, Any]:
    """Set the compute mode ("default", "exclusive_process" or "prohibited") of `gpus`."""
    return {"kind": COMPUTE_MODE, "gpus": list(gpus), "mode": mode}


def power_limit_step(gpus: List[int], watts: Optional[int]) -> Dict[str, Any]:
    """Set the power limit of `gpus` to `watts`, or with None to each GPU's default limit."""
    return {"kind": POWER_LIMIT, "gpus": list(gpus), "watts": watts}


class PackageSet(NamedTuple):
    """What a driver or Fabric Manager install puts on a node, as the plan resolved it from the source
    (node/packages/sources.py names the packages of each)."""

    pinning: List[str]  # installed first: NVIDIA's branch-locking package (CUDA repository, 590 and later)
    install: List[str]  # installed at the pinned version
    hold: List[str]  # fnmatch patterns: every installed package they match is held afterwards (apt)


NO_PACKAGES = PackageSet([], [], [])


def driver_step(
    method: str,
    source: Optional[str],
    flavor: Optional[str],
    branch: str,
    version: Optional[str],
    hold: bool,
    fabricmanager: bool,
    *,
    packages: PackageSet = NO_PACKAGES,
    modules: bool = True,
    runfile: Optional[str] = None,
    sha256: Optional[str] = None,
    kernel_module_type: Optional[str] = None,
    repo: Optional[Dict[str, str]] = None,
    prebuilt: bool = False,
) -> Dict[str, Any]:
    """Install a driver at `version` (None: the newest of `branch`) with `method` from `source` (None for
    the runfile): apt or dnf installs `packages`, dnf following the branch's module stream where `modules`,
    apt taking Ubuntu's prebuilt modules for the running kernel instead where `prebuilt` and the archive
    has them; the runfile installs `runfile` (checked against `sha256`) with `kernel_module_type` modules."""
    return {
        "kind": DRIVER,
        "method": method,
        "source": source,
        "flavor": flavor,
        "branch": branch,
        "version": version,
        "hold": hold,
        "fabricmanager": fabricmanager,
        "packages": list(packages.install),
        "pinning": list(packages.pinning),
        "hold_patterns": list(packages.hold),
        "modules": modules,
        "runfile": runfile,
        "sha256": sha256,
        "kernel_module_type": kernel_module_type,
        "repo": repo,
        "prebuilt": prebuilt,
    }


def fabricmanager_step(
    version: str, source: str, method: str, packages: PackageSet, hold: bool, start: bool, unit: str = ""
) -> Dict[str, Any]:
    """Fabric Manager and NSCQ (`packages`) at exactly `version`, held when `hold`, its unit enabled;
    started when `start`. `unit` nvidia-imex: the same install for IMEX, also at the driver's version."""
    return {
        "kind": FABRICMANAGER,
        "version": version,
        "branch": branch_of(version),
        "source": source,
        "method": method,
        "unit": unit or FABRICMANAGER_UNIT,
        "hold": hold,
        "start": start,
        "packages": list(packages.install),
        "pinning": list(packages.pinning),
        "hold_patterns": list(packages.hold),
    }


def service_step(unit: str, enable: bool, start: bool, restart: bool = False) -> Dict[str, Any]:
    """Enable (and start, when the driver's module is loaded) or disable and stop a unit (an NVIDIA service
    or the unit apply writes); `restart` starts a running one again (nvidia-imex after nodes_config.cfg)."""
    return {"kind": SERVICE, "unit": unit, "enable": enable, "start": start, "restart": restart}


def persistenced_step(
    enabled: bool, start: bool, package: Optional[str] = None, method: Optional[str] = None
) -> Dict[str, Any]:
    """nvidia-persistenced enabled (and started) or turned off; `package` installed with `method` where it
    is a package of its own that may need installing."""
    return {
        "kind": PERSISTENCED,
        "enabled": enabled,
        "start": start,
        "unit": PERSISTENCED_UNIT,
        "package": package,
        "method": method,
    }


def container_toolkit_step(version: str, method: str, hold: bool, packages: List[str]) -> Dict[str, Any]:
    """The toolkit's `packages` at exactly `version` with `method`, held when `hold`."""
    return {"kind": CONTAINER_TOOLKIT, "version": version, "method": method, "hold": hold,
            "packages": packages}  # fmt: skip


def cdi_generate_step(output: str, driver_root: str, hook_path: str) -> Dict[str, Any]:
    """`nvidia-ctk cdi generate --output=<output>` for the loaded driver, written atomically."""
    return {"kind": CDI_GENERATE, "output": output, "driver_root": driver_root, "hook_path": hook_path}


def runtime_configure_step(runtime: str) -> Dict[str, Any]:
    """`nvidia-ctk runtime configure --runtime=<runtime>`: the nvidia runtime in its config."""
    return {"kind": RUNTIME_CONFIGURE, "runtime": runtime}


def nouveau_step() -> Dict[str, Any]:
    """Blacklist nouveau (modprobe.d and a new initramfs): it leaves at the next boot."""
    return {"kind": NOUVEAU}


def reboot_step() -> Dict[str, Any]:
    return {"kind": REBOOT}


# --- the other verbs' requests --------------------------------------------------------------------------


def apply_request(
    lock: str,
    lock_wait_s: float,
    steps: List[Dict[str, Any]],
    simulated: bool,
    then_facts: Optional[Dict[str, Any]] = None,
    facts_timeout_s: float = 60.0,
) -> Dict[str, Any]:
    """Carry out `steps` in order under the host lock `lock`, waiting up to `lock_wait_s` for it; only on a
    node that is (`simulated`) what its facts said it is. With `then_facts` (facts arguments), the reply
    also holds the facts read afterwards by a new agent process, within `facts_timeout_s`."""
    then = None if then_facts is None else {"args": then_facts, "timeout_s": facts_timeout_s}
    return {
        "lock": lock, "lock_wait_s": lock_wait_s, "steps": steps, "simulated": simulated, "then_facts": then,
    }  # fmt: skip


def gpu_reset_request(
    gpus: Sequence[int],
    together: bool,
    wait_s: float,
    state_dir: Optional[str],
    lock: str,
    lock_wait_s: float,
) -> Dict[str, Any]:
    """Reset `gpus` (or every GPU, `together`) once no process holds them, waiting up to `wait_s`; record
    the reset in `state_dir`; under the host lock `lock`."""
    return {
        "gpus": list(gpus),
        "together": together,
        "wait_s": wait_s,
        "state_dir": state_dir,
        "lock": lock,
        "lock_wait_s": lock_wait_s,
    }


def reboot_request(lock: str, lock_wait_s: float, simulated: bool) -> Dict[str, Any]:
    """Reboot once the host lock is free (a reboot must not land in the middle of another apply)."""
    return {"lock": lock, "lock_wait_s": lock_wait_s, "simulated": simulated}


def reclaim_request(
    policy: str,
    patterns: Sequence[str],
    grace_s: float,
    dry_run: bool,
    user: Optional[str] = None,
    pids: Sequence[int] = (),
) -> Dict[str, Any]:
    """`user`: end only that user's processes (None: anyone's); `pids`: end exactly these (none: what the
    policy selects)."""
    return {
        "policy": policy,
        "patterns": list(patterns),
        "grace_s": grace_s,
        "dry_run": dry_run,
        "user": user,
        "pids": list(pids),
    }


# The smoke verb's DataParallel process: a torch import and one step on the node's GPUs (node side), and what
# the control side's call waits beyond the DDP deadline for it (jobs/smoke.py).
DATA_PARALLEL_TIMEOUT_S = 60.0


def smoke_request(
    node: str,
    python: str,
    nnodes: int,
    node_rank: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
    backend: str,
    rdzv_backend: str,
    rdzv_id: str,
    run_id: str,
    timeout_s: float,
    batch_size: int,
    launcher: Optional[str],
    sizes_mib: Sequence[float] = (),
    interconnect: Optional[str] = None,
) -> Dict[str, Any]:
    """One node's part of a smoke run, before the node's facts add `env`, `path_prepend` and `files`.
    `launcher`: the installed launcher to run (None: torchrun from `python`); `sizes_mib` empty: the node
    picks sizes that suit the backend its ranks run and `interconnect` (nvlink, nvswitch or pcie: what
    joins the rig's GPUs), which also decides the transport NCCL must use."""
    args: Dict[str, Any] = {
        "node": node,
        "python": python,
        "nnodes": nnodes,
        "node_rank": node_rank,
        "nproc_per_node": nproc_per_node,
        "master_addr": master_addr,
        "master_port": master_port,
        "backend": backend,
        "rdzv_backend": rdzv_backend,
        "rdzv_id": rdzv_id,
        "run_id": run_id,
        "timeout_s": timeout_s,
        "batch_size": batch_size,
        "launcher": launcher,
    }
    if sizes_mib:
        args["sizes_mib"] = list(sizes_mib)
    if interconnect is not None:
        args["interconnect"] = interconnect
    return args


def torchrun_options(rdzv_backend: str) -> List[Tuple[str, str]]:
    """torchrun's options for one node's part of a DDP group, the one spelling of that command line: each a
    flag and its value as a template over the rendezvous settings (`{nnodes}`, `{master_addr}`, ...), which
    the launcher (templates/mgpu-torchrun.j2: its shell variables) and smoke without a launcher (the
    values) fill in."""
    options = [("--nnodes", "{nnodes}"), ("--nproc-per-node", "{nproc_per_node}")]
    if rdzv_backend == "static":
        options += [
            ("--node-rank", "{node_rank}"),
            ("--master-addr", "{master_addr}"),
            ("--master-port", "{master_port}"),
        ]
    else:  # elastic: torchrun assigns the node ranks
        options += [("--rdzv-backend", "{rdzv_backend}"), ("--rdzv-endpoint", "{master_addr}:{master_port}")]
    return [*options, ("--rdzv-id", "{rdzv_id}")]


def smoke_baseline_request(
    state_dir: str, key: str, entry: Dict[str, Any], node: Dict[str, Any]
) -> Dict[str, Any]:
    return {"state_dir": state_dir, "record": {"key": key, "entry": entry, "node": node}}


def smoke_cleanup_request(run_id: str, node_rank: int) -> Dict[str, Any]:
    """End one node's leftovers of a smoke run, for when that node's `smoke` call died."""
    return {"run_id": run_id, "node_rank": node_rank}
