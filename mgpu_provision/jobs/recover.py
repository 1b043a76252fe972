"""`recover`: bring back the GPUs whose findings ask for it — a GPU reset, or a reboot — and nothing else.

What to do comes from the judge (`Finding.recovery`: the Xid catalog's resolution, NVML's recovery action,
a pending memory repair), the way NVSentinel marks a GPU healthy after a successful reset and falls back
to a reboot (NVIDIA/NVSentinel PRs #669, #1240). Per host, in order, each step one line of the recap:
judge its facts; drain it in Slurm when the rig says it runs slurmd (jobs/drain.py, the `slurm-node` verb,
reason `mgpu: recover`) and wait for its jobs to end; reset the GPUs once no process holds them (the
`gpu-reset` verb: on an NVSwitch rig every GPU together), which the node records so its check judges only
the Xids after it; judge again; resume the drain only if it was this run's and the box is healthy. A reset
that fails, or a finding that asks for a reboot, is a reboot under the rig's reboot policy (`driver.reboot:
allowed`; never on the machine running this tool), judged again after it. A GPU still held when the wait
ends is reset by nothing: the host is left as it was (its drain lifted when it was this run's). Without
`--yes` it only says what it would do. The decision is a pure function (`decide`); the rest moves data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .. import protocol
from ..fleet.here import Here, address_is_here, control_machine
from ..fleet.options import FleetOptions
from ..fleet.replies import GpuResetReply
from ..fleet.session import AgentSession
from ..judge.records import FAIL, Finding
from ..judge.verdict import judge_node
from ..plan import expectation
from ..plan.files import node_path
from ..plan.host import facts_request
from ..rig.rig import LoadedRig
from .apply import LOCK_FILE, ApplySettings, reboot_and_wait
from .drain import DrainSettings, drain_host, resume_host
from .steps import ReopenableSession

if TYPE_CHECKING:
    from ..rig.models import Host

RECOVER_REASON = "mgpu: recover"
Status = Literal["healthy", "would-recover", "recovered", "failed", "unreachable"]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class RecoverSettings:
    dry_run: bool = True
    wait_s: float = 300.0  # --wait: how long processes may keep a GPU before the reset is given up
    drain_timeout_s: float = 3600.0  # --drain-timeout: how long the node's Slurm jobs may take to end
    reboot_timeout_s: float = 900.0
    poll_s: float = 5.0
    lock_wait_s: float = 60.0


@dataclass(frozen=True)
class Step:
    step: str  # judge, drain, reset, check, reboot, resume
    ok: bool
    words: str


@dataclass
class HostRecovery:
    host: str
    status: Status = "healthy"
    steps: list[Step] = field(default_factory=list)
    error: str | None = None

    def say(self, step: str, ok: bool, words: str) -> None:
        self.steps.append(Step(step, ok, words))


@dataclass(frozen=True)
class Decision:
    """What the findings ask for: the GPUs to reset (every one at once on an NVSwitch rig) or a reboot."""

    resets: tuple[int, ...]
    reboot: bool
    together: bool
    why: tuple[str, ...]

    @property
    def needed(self) -> bool:
        return bool(self.resets) or self.reboot


def decide(findings: list[Finding], nvswitch: bool) -> Decision:
    """The recovery the findings ask for. A reset of a GPU NVML no longer lists (no index) is a reboot."""
    asking = [f for f in findings if f.recovery]
    resets = sorted({f.gpu for f in asking if f.recovery == "reset" and f.gpu is not None})
    reboot = any(f.recovery == "reboot" or f.gpu is None for f in asking)
    why = tuple(dict.fromkeys(f"{f.check}: {f.message}" for f in asking))
    return Decision(tuple(resets), reboot, nvswitch and bool(resets), why)


def _failing(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == FAIL]


def _gpus(resets: tuple[int, ...], together: bool) -> str:
    return "every GPU together (NVSwitch)" if together else "GPU " + ", ".join(str(g) for g in resets)


def recover_host(
    session: AgentSession,
    options: FleetOptions,
    loaded: LoadedRig,
    host: Host,
    settings: RecoverSettings,
    progress: Progress,
) -> HostRecovery:
    """The steps of one host, each said as it ends; a ProvisionError is the host's error."""
    done = HostRecovery(host.name)
    rig = loaded.rig_of(host)
    expect = expectation.for_rig(loaded, host)  # health, not drift
    request = facts_request(loaded, host)
    state_dir = node_path(loaded, host, loaded.spec.files.state_dir)
    lock = node_path(loaded, host, f"{loaded.spec.files.state_dir.rstrip('/')}/{LOCK_FILE}")
    with ReopenableSession(session, options) as node:

        def judge() -> list[Finding]:
            return judge_node(node.facts(request).model_dump(), expect)

        facts = node.facts(request)
        decision = decide(judge_node(facts.model_dump(), expect), expect.bridge_kind == "nvswitch")
        if not decision.needed:
            done.say("judge", True, "no finding asks for a GPU reset or a reboot")
            return done
        done.say("judge", True, "; ".join(decision.why))
        policy = rig.driver.reboot if rig.driver is not None else "never"
        if settings.dry_run:
            _would(done, decision, rig.slurm is not None, policy, settings)
            done.status = "would-recover"
            return done
        ours = False
        if rig.slurm is not None:
            drained = _drain(node, settings, progress, done)
            if drained is None:
                return _end(done, node.session, False, "failed")
            ours = drained
        reboot = decision.reboot
        if decision.resets and not reboot:
            outcome = _reset(node, decision, settings, state_dir, lock, done)
            if outcome == "held":
                return _end(done, node.session, ours, "failed")
            if outcome == "reset":
                return _checked(done, node.session, judge, ours)
            reboot = True  # the reset failed: a reboot is what is left
        if reboot:
            here = control_machine(node.target, facts, Here.read(), address_is_here)
            if not _reboot(node, done, policy, here, lock, settings, progress, facts.host.simulated):
                return _end(done, node.session, False, "failed")
            return _checked(done, node.session, judge, ours)
    return done


def _drain(
    node: ReopenableSession, settings: RecoverSettings, progress: Progress, done: HostRecovery
) -> bool | None:
    """Drain the node in Slurm and wait for its jobs: whether the drain is this run's, None if it never got
    DRAINED within the timeout."""
    wait = DrainSettings(settings.drain_timeout_s, settings.poll_s)
    drained = drain_host(node.session, wait, progress, reason=RECOVER_REASON)
    if not drained.ready:
        done.say("drain", False, f"{drained.node} still {drained.state} after {drained.waited_s:.0f}s")
        return None
    whose = "this run's" if drained.ours else f"already drained: {drained.reason or drained.state}"
    done.say("drain", True, f"{drained.node} DRAINED in Slurm ({whose})")
    return drained.ours


def _reset(
    node: ReopenableSession,
    decision: Decision,
    settings: RecoverSettings,
    state_dir: str,
    lock: str,
    done: HostRecovery,
) -> Literal["reset", "held", "failed"]:
    """The GPUs reset once no process holds them: `reset`, `held` (nothing reset) or `failed` (a reboot is
    the next step)."""
    args = protocol.gpu_reset_request(
        decision.resets, decision.together, settings.wait_s, state_dir, lock, settings.lock_wait_s
    )
    timeout = node.target.command_timeout_s + settings.wait_s + settings.lock_wait_s + 120
    reply = node.read("gpu-reset", args, GpuResetReply, timeout)
    what = _gpus(decision.resets, decision.together)
    if reply.held:
        held = "; ".join(f"GPU {h.gpu} by pid {', '.join(map(str, h.pids))}" for h in reply.held)
        done.say("reset", False, f"still held after {reply.waited_s:g}s ({held}): nothing reset")
        return "held"
    if reply.reset:
        done.say("reset", True, f"{what} reset")
        return "reset"
    done.say("reset", False, f"{what}: {reply.error}")
    return "failed"


def _reboot(
    node: ReopenableSession,
    done: HostRecovery,
    policy: str,
    here: str | None,
    lock: str,
    settings: RecoverSettings,
    progress: Progress,
    simulated: bool,
) -> bool:
    """Reboot the host when the rig's policy allows it and it is not the control machine: whether it did."""
    if policy != "allowed" or here:
        why = f"policy: {policy}" if not here else f"it is the machine running mgpu-provision ({here})"
        done.say("reboot", False, f"a reboot is needed and not done ({why}): reboot it, then check again")
        return False
    reboot_settings = ApplySettings((), settings.lock_wait_s, settings.reboot_timeout_s, settings.poll_s)
    reboot_and_wait(node, lock, reboot_settings, progress, simulated)
    done.say("reboot", True, "rebooted, back with a new boot id")
    return True


def _checked(
    done: HostRecovery, session: AgentSession, judge: Callable[[], list[Finding]], ours: bool
) -> HostRecovery:
    """After a reset or a reboot: judged again; a failure left keeps the drain (the host is still sick)."""
    left = _failing(judge())
    if left:
        done.say("check", False, "; ".join(f"{f.check}: {f.message}" for f in left))
        return _end(done, session, False, "failed")
    done.say("check", True, "no failure left")
    return _end(done, session, ours, "recovered")


def _would(
    done: HostRecovery, decision: Decision, slurm: bool, policy: str, settings: RecoverSettings
) -> None:
    if slurm:
        done.say("drain", True, f"would drain it in Slurm ({RECOVER_REASON}) and wait for its jobs to end")
    if decision.resets and not decision.reboot:
        what = _gpus(decision.resets, decision.together)
        done.say(
            "reset", True, f"would reset {what} once no process holds it (waiting up to {settings.wait_s:g}s)"
        )
        done.say("check", True, "would check again" + (", then resume its own drain" if slurm else ""))
    else:
        done.say("reboot", policy == "allowed", f"would reboot it (policy: {policy}) and check again")


def _end(done: HostRecovery, session: AgentSession, ours: bool, status: Status) -> HostRecovery:
    """Lift this run's drain (the node lifts only a drain of this reason) and set the host's status."""
    if ours:
        reply = resume_host(session, reason=RECOVER_REASON)
        done.say("resume", True, f"{reply.node}: this run's drain lifted")
    done.status = status
    return done


def exit_code(hosts: list[HostRecovery]) -> int:
    """0: every host healthy, recovered, or (dry run) recoverable; 2: anything else."""
    return 0 if all(h.status in ("healthy", "recovered", "would-recover") for h in hosts) else 2
