"""Entry point of the node agent: `python3 agent.pyz VERB`, a JSON request on stdin, one JSON reply on stdout.

The envelope is the protocol of docs/ARCHITECTURE.md. Verbs import their modules only when called, so a
`facts` call on a slow node does not pay for the code of `smoke` or `reclaim`; so do the rare paths here
(unpacking, a bug's traceback), since every call pays for each module imported at the top. Anything a verb
cannot do is an error envelope with a kind and a plain message (exit 0); a non-zero exit means the agent
itself broke.

Python never caches bytecode for modules imported from a zip, so every call from the zipapp would compile
the agent again. The first run from `agent-<hash>.pyz` therefore unpacks it beside itself into
`agent-<hash>/`, which the control side's command runs from then on (Python writes `__pycache__` there).
"""

from __future__ import annotations

import json
import os
import sys

from .. import __version__
from ..protocol import ERROR_KINDS, BadRequest, check_request
from ..typing_lite import TYPE_CHECKING
from .core.archive import record_digest
from .core.errors import AgentFailure
from .nvidia.backend import Backend
from .nvidia.select import select_backend, simulation_target, state_folder

if TYPE_CHECKING:
    from typing import IO, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    BackendFactory = Callable[[], Backend]
if TYPE_CHECKING:
    VerbOutcome = Tuple[Any, Optional[Callable[[], None]]]


def _facts(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.facts import collect

    return collect(args, backend()), None


def _apply(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.apply import apply

    return apply(args, backend()), None


def _reboot(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.apply import reboot

    return reboot(args, backend())


def _reclaim(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.reclaim import run

    return run(args, backend()), None


def _smoke(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.smoke import run

    chosen = backend()
    return run(args, simulated=chosen.simulated, backend=chosen), None


def _smoke_cleanup(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.smoke import cleanup

    return cleanup(args), None


def _smoke_baseline(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.smoke_baseline import record

    return record(args), None


def _slurm_node(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.slurm_drain import run

    return run(args), None


def _gpu_reset(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.gpu_reset import run

    return run(args, backend()), None


def _slurm_smoke(args: Dict[str, Any], backend: BackendFactory) -> VerbOutcome:
    from .verbs.slurm_smoke import run

    return run(args, simulated=backend().simulated), None


VERBS: Dict[str, Callable[[Dict[str, Any], BackendFactory], VerbOutcome]] = {
    "facts": _facts,
    "apply": _apply,
    "reboot": _reboot,
    "reclaim": _reclaim,
    "smoke": _smoke,
    "smoke-cleanup": _smoke_cleanup,
    "smoke-baseline": _smoke_baseline,
    "slurm-node": _slurm_node,
    "slurm-smoke": _slurm_smoke,
    "gpu-reset": _gpu_reset,
}


def handle(
    verb: Optional[str], raw_request: str, login_simulate: Optional[str] = None
) -> Tuple[Dict[str, Any], Optional[Callable[[], None]]]:
    """The reply envelope for one call, and what must run after it has been sent."""
    try:
        if verb not in VERBS:
            raise AgentFailure("bad-request", f"unknown verb {verb!r}; verbs are {', '.join(VERBS)}")
        try:
            request = json.loads(raw_request) if raw_request.strip() else {}
        except ValueError as exc:
            raise AgentFailure("bad-request", f"the request on stdin is not JSON: {exc}") from None
        if not isinstance(request, dict) or not isinstance(request.get("args", {}), dict):
            raise AgentFailure("bad-request", 'the request must be {"args": {...}, "simulate": path or null}')
        try:
            check_request(verb, request)
        except BadRequest as exc:
            raise AgentFailure("bad-request", str(exc)) from None
        twin = simulation_target(request.get("simulate"), login_simulate)
        state = state_folder(request)
        result, after = VERBS[verb](request.get("args") or {}, lambda: select_backend(twin, state))
        then = request["args"].get("then_facts") if verb == "apply" else None
        if then is not None:
            result = dict(result, facts=facts_in_a_new_agent(then["args"], twin, then["timeout_s"]))
        return {"ok": True, "agent_version": __version__, "result": result}, after
    except AgentFailure as exc:
        return _error(exc.kind, exc.message), None
    except Exception as exc:  # a bug in a verb: reported in the envelope, the traceback goes to stderr
        import traceback

        traceback.print_exc()
        return _error("internal", f"{type(exc).__name__}: {exc}"), None


def facts_in_a_new_agent(args: Dict[str, Any], twin: Optional[str], timeout_s: float) -> Dict[str, Any]:
    """The reply envelope of a `facts` call with `args`, made by a new agent process as the control side's
    own call would be: a driver that apply just installed is read as a new process reads it (this one may
    hold the old NVML library), never from this process's state. The agent is this file's package root, run
    by this interpreter with its flags (`-S -I`)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    flags = [flag for flag, on in (("-S", sys.flags.no_site), ("-I", sys.flags.isolated)) if on]
    request = json.dumps({"args": args, "simulate": twin})
    try:
        done = subprocess.run(
            [sys.executable, *flags, root, "facts"],
            input=request,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            universal_newlines=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return _error("internal", "facts after apply took longer than {:g} s".format(timeout_s))
    except OSError as exc:
        return _error("internal", "facts after apply could not start: {}".format(exc))
    try:
        reply = json.loads(done.stdout)
    except ValueError:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        last = said[-1].strip() if said else "no error output"
        return _error("internal", "facts after apply exited {}: {}".format(done.returncode, last))
    return reply if isinstance(reply, dict) else _error("internal", "facts after apply answered no object")


def _error(kind: str, message: str) -> Dict[str, Any]:
    if kind not in ERROR_KINDS:  # a kind the control side could not read: a bug here, said as one
        kind, message = "internal", "undeclared error kind {!r}: {}".format(kind, message)
    return {"ok": False, "agent_version": __version__, "error": {"kind": kind, "message": message}}


def unpack_beside(archive: str) -> Optional[str]:
    """Unpack the zipapp `x/agent-H.pyz` to `x/agent-H/` once; the folder, or None where that is impossible.

    It appears whole or not at all (unpacked in a temporary folder, then renamed), so concurrent first runs
    are safe: the loser of the rename drops its copy. Under `sudo` the folder is given to the owner of the
    archive, so that the login user's command can find it. A read-only home leaves the zipapp in use.
    """
    if not archive.endswith(".pyz"):
        return None
    final = archive[: -len(".pyz")]
    if os.path.isdir(final):
        return final
    import shutil  # these only on the first run of a version
    import tempfile
    import zipfile

    try:
        partial = tempfile.mkdtemp(prefix=".unpack-", dir=os.path.dirname(archive))
    except OSError:
        return None
    try:
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(partial)
        record_digest(archive, partial)
        _give_to_owner_of(archive, partial)
        os.rename(partial, final)
    except (OSError, zipfile.BadZipFile):
        shutil.rmtree(partial, ignore_errors=True)
        return final if os.path.isdir(final) else None
    return final


def _give_to_owner_of(archive: str, folder: str) -> None:
    """Under `sudo`, the unpacked folder goes to the archive's owner, whose command runs it next."""
    owner = os.stat(archive)
    if os.geteuid() != 0 or owner.st_uid == 0:
        return
    for parent, _, names in os.walk(folder):
        for path in [parent] + [os.path.join(parent, n) for n in names]:
            # Not following links: nothing in the archive is one, and a swapped-in link must not hand
            # its target to the owner.
            os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


def main(argv: List[str], stdin: IO[str], stdout: IO[str]) -> int:
    # argv: agent VERB [the login shell's MGPU_PROVISION_SIMULATE, passed on through sudo]
    verb, login_simulate = [*argv[1:], None, None][:2]
    reply, after = handle(verb, stdin.read(), login_simulate)
    stdout.write(json.dumps(reply) + "\n")
    stdout.flush()
    if after is not None:
        after()
    return 0


if __name__ == "__main__":
    zipapp = getattr(globals().get("__loader__"), "archive", None)  # set when imported from a zip
    if zipapp:
        unpack_beside(zipapp)
    sys.exit(main(sys.argv, sys.stdin, sys.stdout))
