"""`--limit`: choose hosts by name, group, rig type, glob or node set, with `!` to leave some out.

Groups are the rig file's `groups:`, each host's `groups`, and for hosts read from an Ansible inventory
every inventory group they are in (parents included), as Ansible's own `--limit` takes them.

Every command that talks to hosts takes the same pattern, as Ansible's `--limit` does, so its meaning lives
in one place. A term that matches nothing is an error rather than an empty run: a typo must not silently
skip a box. A term with a numeric bracket (`gpu-[001-064]`) or a `@source:group` is a node set
(rig/nodesets.py: ClusterShell's syntax), not a glob: it stands for the names it expands to.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

from ..errors import ProvisionError
from .nodesets import expand, is_nodeset, split_terms
from .rig import LoadedRig

if TYPE_CHECKING:
    from .models import Host


def _groups_of(loaded: LoadedRig, host: Host) -> set[str]:
    """Every name a host answers to: its own, its groups (both kinds) and its rig type."""
    named = {group for group, members in loaded.spec.groups.items() if host.name in members}
    return {host.name, host.rig, *host.groups, *named}


def _known(loaded: LoadedRig) -> str:
    """The names --limit knows besides the hosts' own, for the message about a term that matches none."""
    hosts = loaded.spec.hosts
    groups = {group for host in hosts for group in host.groups} | {
        group for group, members in loaded.spec.groups.items() if members
    }
    rigs = {host.rig for host in hosts}
    return f"groups: {', '.join(sorted(groups)) or 'none'}; rig types: {', '.join(sorted(rigs))}"


def _matches(answers: set[str], pattern: str | frozenset[str]) -> bool:
    """A glob matches any name a host answers to; a node set (its expanded names) any of them exactly."""
    if isinstance(pattern, frozenset):
        return bool(answers & pattern)
    return any(fnmatch.fnmatchcase(name, pattern) for name in answers)


def _pattern(term: str) -> str | frozenset[str]:
    return frozenset(expand(term)) if is_nodeset(term) else term


def select_hosts(loaded: LoadedRig, limit: str | None) -> list[Host]:
    """Hosts matched by `limit` ("gpu-a,rtx*,!gpu-c,gpu-[001-064]") in file order; all when limit is None.

    Terms are comma-separated (outside brackets) host names, group names or rig names, with shell globs,
    or node sets. Terms starting with `!` remove hosts; a limit made only of removals starts from the
    whole fleet.
    """
    hosts = list(loaded.spec.hosts)
    if limit is None:
        return hosts
    terms = split_terms(limit)
    if not terms:
        raise ProvisionError("--limit is empty; give host names, groups or patterns")
    names = {host.name: _groups_of(loaded, host) for host in hosts}
    include = [term for term in terms if not term.startswith("!")]
    exclude = [term[1:] for term in terms if term.startswith("!")]
    patterns = {term: _pattern(term) for term in include + exclude}
    for term, pattern in patterns.items():
        if not any(_matches(answers, pattern) for answers in names.values()):
            raise ProvisionError(
                f"--limit: '{term}' matches no host, group or rig of {loaded.path}; {_known(loaded)}"
            )

    def chosen_by(host: Host, terms: list[str]) -> bool:
        return any(_matches(names[host.name], patterns[term]) for term in terms)

    chosen = [h for h in hosts if (not include or chosen_by(h, include)) and not chosen_by(h, exclude)]
    if not chosen:
        raise ProvisionError(f"--limit '{limit}' leaves no hosts")
    return chosen
