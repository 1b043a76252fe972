"""Node sets as HPC people type and read them: `gpu-[001-064]`, `@sp:gpu` — one module for the whole tool.

`--limit` expands them and every host list the tool prints is folded by them, through ClusterShell's
`NodeSet` where it is installed (the `clush` extra), so that what is printed pastes back into `--limit`, into
`clush -w` and into Slurm's hostlists. Without ClusterShell one small fallback folds and expands the common
form (one number per name, ranges and lists in brackets) to the same strings; the tests hold the two to the
same results. Group sources (`@st:drain`, `@sp:PARTITION`: ClusterShell's Slurm groups) need the library's
group resolver; without it they are an error that says what to install.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..errors import ProvisionError

INSTALL_HINT = "pip install 'mgpu-provision[clush]' (ClusterShell >= 1.9.3)"
# One number in a name, the last one: what the fallback folds on (ClusterShell also folds inner numbers).
_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")
# A bracket of ranges, as node sets write it: [001-064], [1,3,5-7].
_BRACKET = re.compile(r"\[(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)\]")


class NodeSetError(ProvisionError):
    """A node set that does not parse, or a group source that cannot be resolved (`where`: the option)."""


def clustershell() -> bool:
    """Whether ClusterShell can be imported (the `clush` extra)."""
    try:
        import ClusterShell.NodeSet  # noqa: F401
    except ImportError:
        return False
    return True


def too_old() -> str | None:
    """Why the installed ClusterShell cannot carry `--via clush` (None: it can): releases before 1.9.3 take
    minutes on large unfoldable node lists (cea-hpc/clustershell#560); Debian 12 packages 1.9.1."""
    import ClusterShell

    version = getattr(ClusterShell, "__version__", "0")
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    if numbers >= (1, 9, 3):
        return None
    return f"ClusterShell {version} is too old for --via clush (it needs 1.9.3 or later): {INSTALL_HINT}"


def split_terms(text: str) -> list[str]:
    """`gpu-[001,003],login` → ['gpu-[001,003]', 'login']: commas outside brackets separate terms."""
    terms, depth, word = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(word)
            word = ""
        else:
            word += char
    terms.append(word)
    return [term.strip() for term in terms if term.strip()]


def is_nodeset(term: str) -> bool:
    """A term written as a node set (a numeric bracket, or a `@source:group`) rather than a shell glob."""
    return term.startswith("@") or _BRACKET.search(term) is not None


def expand(term: str, where: str = "--limit") -> list[str]:
    """The names of one node set term, in the library's order; NodeSetError naming `where` and why."""
    if clustershell():
        return _expand_with_library(term, where)
    if term.startswith("@"):
        raise NodeSetError(f"{where}: '{term}' is a ClusterShell group; {INSTALL_HINT} to use group sources")
    return _expand_fallback(term, where)


def fold(names: Iterable[str]) -> str:
    """`gpu-[001-062,064], login-1`: the names as one node set, each pattern once, in the library's order."""
    names = list(names)
    if clustershell():
        from ClusterShell.NodeSet import NodeSet

        return ", ".join(split_terms(str(NodeSet.fromlist(names))))
    return ", ".join(_fold_fallback(names))


def _expand_with_library(term: str, where: str) -> list[str]:
    from ClusterShell.NodeSet import NodeSet, NodeSetException
    from ClusterShell.NodeUtils import GroupResolverError

    try:
        return list(NodeSet(term))
    except NodeSetException as exc:
        raise NodeSetError(f"{where}: '{term}' is not a node set: {exc}") from exc
    except GroupResolverError as exc:
        raise NodeSetError(
            f"{where}: '{term}': ClusterShell cannot resolve the group ({type(exc).__name__}: {exc}); "
            "configure its group source in /etc/clustershell/groups.conf.d/ (ClusterShell ships "
            "slurm.conf.example for @sp: and @st:)"
        ) from exc


def _expand_fallback(term: str, where: str) -> list[str]:
    """One bracket of ranges ('gpu-[001-003,7]'), as ClusterShell expands it, without the library."""
    brackets = list(_BRACKET.finditer(term))
    if len(brackets) != 1 or term.count("[") != 1 or term.count("]") != 1:
        raise NodeSetError(
            f"{where}: '{term}' is not a node set this tool reads without ClusterShell (one bracket of "
            f"ranges, e.g. gpu-[001-064,070]); {INSTALL_HINT} for the full syntax"
        )
    bracket = brackets[0]
    head, tail = term[: bracket.start()], term[bracket.end() :]
    numbers: list[str] = []
    for span in bracket.group(1).split(","):
        low, _, high = span.partition("-")
        high = high or low
        if int(high) < int(low):
            raise NodeSetError(f"{where}: '{term}' is not a node set: range {span} runs backwards")
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        numbers += [f"{n:0{width}d}" for n in range(int(low), int(high) + 1)]
    return [f"{head}{number}{tail}" for number in sorted(dict.fromkeys(numbers), key=_number_order)]


def _number_order(digits: str) -> tuple[int, int]:
    return len(digits), int(digits)


def _padding(digits: str) -> int:
    return len(digits) if digits.startswith("0") and len(digits) > 1 else 0


def _follows(before: str, after: str) -> bool:
    """Whether `after` continues a range ending in `before`: the next number, written with the same padding
    (099 → 100 keeps three digits; 9 → 10 has none)."""
    same_padding = _padding(before) == _padding(after) or (_padding(before) > 0 and len(after) == len(before))
    return int(after) == int(before) + 1 and same_padding


def _fold_fallback(names: Sequence[str]) -> list[str]:
    """The patterns ClusterShell prints for names with at most one number: sorted by pattern, numbers by
    width then value, contiguous runs as ranges."""
    patterns: dict[str, tuple[str, str, list[str]]] = {}
    for name in dict.fromkeys(names):
        match = _NUMBERED.match(name)
        if match is None:
            patterns[name] = (name, "", [])
            continue
        head, digits, tail = match.groups()
        patterns.setdefault(f"{head}%s{tail}", (head, tail, []))[2].append(digits)
    shown = []
    for key in sorted(patterns):
        head, tail, numbers = patterns[key]
        if not numbers:
            shown.append(head)
            continue
        runs: list[list[str]] = []
        for digits in sorted(numbers, key=_number_order):
            if runs and _follows(runs[-1][-1], digits):
                runs[-1].append(digits)
            else:
                runs.append([digits])
        if len(numbers) == 1:
            shown.append(f"{head}{numbers[0]}{tail}")
            continue
        spans = [run[0] + (f"-{run[-1]}" if len(run) > 1 else "") for run in runs]
        shown.append(f"{head}[{','.join(spans)}]{tail}")
    return shown
