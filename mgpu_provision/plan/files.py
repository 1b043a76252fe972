"""The managed-file toolkit: a file as the rig wants it on a node, rendered, and the Change that makes it so.

Every resource that writes files on a node (`resources/envfiles.py`, `sli.py`, `boot_unit.py`, `slurm.py`,
`node_check.py`) is one `ManagedFiles` entry in `plan/host.FILES`: its paths (what the facts must
describe, known before any facts) and its desired files (for those facts). Files are rendered from
`templates/*.j2` deterministically (no timestamps, sorted where order is free) so that a converged node
shows no drift; values pass the quoting filters, never autoescape.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import os
import re
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import protocol
from ..control_cache import control_cache_dir
from ..errors import ProvisionError
from ..facts import Facts, ManagedFile
from ..judge.files import same_digest
from ..rig.envvalues import value_problem
from ..typing_lite import NamedTuple
from .change import Change, HostContext, Phase

if TYPE_CHECKING:
    import jinja2

    from ..rig import LoadedRig
    from ..rig.models import Host

# Values systemd and sh both take unquoted; anything else is double-quoted with escapes.
_BARE_VALUE = re.compile(r"[A-Za-z0-9_.,:=@%+/^-]+")
# Inside double quotes POSIX sh and systemd's EnvironmentFile parser both give these four characters
# their special meaning and take them literally after a backslash; every other character, newlines
# included, stands for itself in both.
_DOUBLE_QUOTE_ESCAPES = re.compile(r'([\\"`$])')


class EnvFileError(ProvisionError):
    """A value cannot be written safely into a node's env file or launcher."""


class DesiredFile(NamedTuple):
    """A managed file as the rig file wants it on one node."""

    path: str
    content: str
    mode: str  # octal permission bits, e.g. "0644", as the agent's file step and facts spell them
    phase: Phase  # the playbook step that manages it

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()


class ManagedFiles(NamedTuple):
    """One resource's files, as the registry (`plan/host.FILES`) holds them: the facts request asks for
    `paths`, the plan diffs `desired` (or runs `diff`, for a resource that also enables a unit, restarts a
    daemon or removes what is no longer wanted), and the node check holds the digests of `checked` ones."""

    paths: Callable[[LoadedRig, Host], list[str]]  # every path written or removed on a host, before facts
    desired: Callable[[HostContext], list[DesiredFile]]  # the files as the rig wants them, for these facts
    diff: Callable[[HostContext], list[Change]] | None = (
        None  # None: each desired file written where it differs
    )
    checked: bool = True  # its digests go into the node check's expectations

    def changes(self, ctx: HostContext) -> list[Change]:
        """What the plan shows for these files on the host."""
        if self.diff is not None:
            return self.diff(ctx)
        return diff_files(self.desired(ctx), ctx.facts)


def node_path(loaded: LoadedRig, host: Host, path: str) -> str:
    """Where a rig-file path lies on `host`: relative ones (local hosts only) are beside the rig file."""
    return str(loaded.resolve(path)) if host.connection == "local" else path


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
    """`template` rendered with `context`: from the control machine's cache of rendered files when this
    template, these values and the code that renders them were seen before (a plan of an unchanged fleet
    then never imports jinja2), else by jinja2."""
    key = _render_key(template, context)
    if key is not None and (found := _rendered().get(key)) is not None:
        _RENDERED_NOW[key] = found
        return found
    text = _templates().get_template(template).render(**context)
    if key is not None:
        _RENDERED_NOW[key] = text
        _RENDERED_NEW.append(key)
    return text


# What this run rendered or found (kept for the next run), and which of those were rendered afresh.
_RENDERED_NOW: dict[str, str] = {}
_RENDERED_NEW: list[str] = []
# A rendered file's key holds only values of these types (what the resources pass), so that its repr is the
# value itself; anything else renders without the cache.
_PLAIN = (str, int, float, bool, type(None))
_RENDERED_MAX = 4096  # entries kept: a fleet of thousands of distinct hosts renders without the cache


def _plain_value(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_value(v) for k, v in value.items())
    return False


def _render_key(template: str, context: dict[str, Any]) -> str | None:
    if not _plain_value(context):
        return None
    words = repr((template, sorted(context.items()), _render_code()))
    return hashlib.sha256(words.encode()).hexdigest()


@functools.cache
def _render_code() -> tuple[object, ...]:
    """What a rendered file depends on besides its values: every template (includes too), the filters'
    code and jinja2's version, each by path, mtime and size (as the rig cache's key)."""
    import importlib.util

    folder = os.path.join(os.path.dirname(os.path.dirname(__file__)), "templates")
    spec = importlib.util.find_spec("jinja2")
    paths = [os.path.join(folder, name) for name in sorted(os.listdir(folder))]
    paths += [__file__, value_problem.__code__.co_filename]
    if spec is not None and spec.origin:
        paths.append(spec.origin)
    found: list[object] = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            found.append((path, None))
            continue
        found.append((path, stat.st_mtime_ns, stat.st_size))
    return tuple(found)


def _rendered_file() -> str:
    return str(control_cache_dir() / "rendered.json")


@functools.cache
def _rendered() -> dict[str, str]:
    """The previous run's rendered files by key, read once per run (nothing when unreadable); this run's
    are written back when it ends, if it rendered anything afresh."""
    import atexit
    import json

    atexit.register(_keep_rendered)
    try:
        with open(_rendered_file(), encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _keep_rendered() -> None:
    if not _RENDERED_NEW or len(_RENDERED_NOW) > _RENDERED_MAX:
        return
    import json

    path = _rendered_file()
    # os.urandom rather than uuid4: importing uuid (and the platform module it loads) cost every run's
    # exit ~2 ms of CPU, even the runs that had nothing to write.
    partial = f"{path}.{os.urandom(16).hex()}.partial"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(_RENDERED_NOW, handle)
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)


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
    if have is None or not have.exists:
        return _created(want)
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
        f"file:{want.path}",
        "update",
        ", ".join(what),
        _describe(have.mode, have.sha256),
        _describe(want.mode, want.sha256),
        diff=diff,
        agent_step=protocol.file_step(want.path, want.content, want.mode),
        phase=want.phase,
    )


def _created(want: DesiredFile) -> Change:
    """A file the node lacks, with its whole content as the diff."""
    lines = want.content.count("\n")
    return Change(
        f"file:{want.path}",
        "create",
        f"new file, {lines} lines, mode {want.mode}",
        None,
        _describe(want.mode, want.sha256),
        diff=_unified("", want.content, want.path, "/dev/null"),
        agent_step=protocol.file_step(want.path, want.content, want.mode),
        phase=want.phase,
    )


def diff_files(desired: list[DesiredFile], facts: Facts) -> list[Change]:
    """Create/update Changes for every desired file that is missing or differs in content or mode."""
    changes = (diff_file(want, facts.file(want.path)) for want in desired)
    return [change for change in changes if change is not None]


def diff_unwanted(paths: list[str], facts: Facts, why: str, phase: Phase) -> list[Change]:
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
