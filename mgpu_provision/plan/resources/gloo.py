"""The Gloo interface of a node, resolved from the rig's NCCL_SOCKET_IFNAME pattern and the node's interfaces.

`ddp.ifname` is written in NCCL's syntax: a comma list of name prefixes (`eth` = every interface whose name
starts with eth), `=` for exact names, `^` to exclude, an optional `:port` per entry. Gloo's
GLOO_SOCKET_IFNAME takes exact interface names only, so `GLOO_SOCKET_IFNAME=eth` fails every Gloo job
("Unable to find address for: eth"). The pattern must select exactly one of the node's interfaces that are up;
otherwise plan refuses it and names what it matched, because a guess could put Gloo and NCCL on different
networks.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...typing_lite import NamedTuple


class GlooInterface(NamedTuple):
    """The resolved name, or why there is none (`problem`, shown as a failed check)."""

    name: str | None
    problem: str | None = None


def nccl_matches(pattern: str, names: Sequence[str]) -> list[str]:
    """The names NCCL selects with NCCL_SOCKET_IFNAME=pattern, in the given order."""
    exclude = pattern.startswith("^")
    rest = pattern[1:] if exclude else pattern
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    # NCCL allows `name:port` entries (for IB devices); the port means nothing for a socket interface.
    entries = [entry.split(":", 1)[0] for entry in rest.split(",") if entry]

    def listed(name: str) -> bool:
        return any(name == entry if exact else name.startswith(entry) for entry in entries)

    return [name for name in names if listed(name) != exclude]


def gloo_interface(pattern: str, up: Sequence[str] | None) -> GlooInterface:
    """The one interface among those `up` that `pattern` selects.

    `up` is None when the node's interfaces are unknown (smoke builds its environment from the rig file
    alone): the pattern's names are then taken as written, and an exclusion leaves Gloo to its default.
    """
    if up is None:
        return GlooInterface(None if pattern.startswith("^") else pattern.removeprefix("="))
    matched = nccl_matches(pattern, up)
    if len(matched) == 1:
        return GlooInterface(matched[0])
    if not matched:
        problem = f"matches no interface that is up (up: {', '.join(up) or 'none'})"
    else:
        problem = f"matches {len(matched)} interfaces that are up ({', '.join(matched)})"
    return GlooInterface(
        None,
        f"ddp.ifname '{pattern}' {problem}: Gloo needs exactly one interface name, so GLOO_SOCKET_IFNAME is "
        "not written; name one interface (e.g. '=eth0') or set GLOO_SOCKET_IFNAME in env",
    )
