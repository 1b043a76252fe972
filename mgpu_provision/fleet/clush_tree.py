"""The topology file of `--via clush --topology FILE`: ClusterShell's own topology.conf format, read and
checked against the rig before any host is asked.

    [routes]
    head: gw[1-2]
    gw1: gpu-[001-512]
    gw2: gpu-[513-1024]

The one router that no line reaches is the head (this machine, whatever its hostname); every other router
is a gateway, and every name that routes nowhere is a node and must be a host of the rig. ClusterShell's
parser names neither a line nor a host when it refuses a file, so each line is read here first: a problem
is one message naming the file, the line and what to change. ClusterShell is imported only here and in
clush.py, only under `--via clush`.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ..errors import ProvisionError
from ..typing_lite import NamedTuple

_ROUTE = re.compile(r"^(?P<src>[^\s#;:=][^:=]*?)\s*[:=]\s*(?P<dst>.*?)\s*$")
_SECTION = re.compile(r"^\[(?P<name>[^\]]*)\]\s*$")
FORMAT = "a [routes] section of `routers: nodes` lines (ClusterShell's topology.conf)"


class Topology(NamedTuple):
    """A checked topology: ClusterShell's tree, its head, and each name's routers (its parents)."""

    path: Path
    tree: Any  # ClusterShell.Topology.TopologyTree
    head: str
    parents: dict[str, str]  # a gateway or node → the node set of the routers one level up

    def route(self, host: str) -> str | None:
        """The gateways a host is reached through (one level up), or None where the head reaches it."""
        parent = self.parents.get(host)
        return None if parent is None or parent == self.head else parent

    def gateway_levels(self, hosts: Collection[str]) -> list[list[str]]:
        """The gateways on the way to `hosts`, nearest the head first: each level's own ssh_config and
        known_hosts must be in place before the next level's connections start from it."""
        depth: dict[str, int] = {}

        def level(name: str) -> int:
            parent = self.parents.get(name)
            if parent is None or parent == self.head:
                return 0
            if name not in depth:
                from ClusterShell.NodeSet import NodeSet

                depth[name] = 1 + max(level(gateway) for gateway in NodeSet(parent))
            return depth[name]

        from ClusterShell.NodeSet import NodeSet

        needed: dict[str, int] = {}
        for host in hosts:
            parent = self.route(host)
            while parent is not None:
                for gateway in NodeSet(parent):
                    needed[gateway] = level(gateway)
                parent = self.route(next(iter(NodeSet(parent))))
        deepest = max(needed.values(), default=-1)
        return [sorted(g for g, d in needed.items() if d == n) for n in range(deepest + 1)]


def _routes(path: Path) -> list[tuple[int, str, str]]:
    """(line number, routers, destinations) of each line of the [routes] section."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisionError(f"cannot read the topology file {path}: {exc}") from None
    section, routes = None, []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        heading = _SECTION.match(line)
        if heading:
            section = heading.group("name").strip()
            continue
        if section != "routes":
            continue
        route = _ROUTE.match(line)
        if route is None or not route.group("dst"):
            raise ProvisionError(
                f"{path}, line {number}: {line!r} is not a route: write `routers: nodes` "
                "(e.g. `gw1: gpu-[001-064]`)"
            )
        routes.append((number, route.group("src"), route.group("dst")))
    if not routes:
        raise ProvisionError(f"{path}: no routes: the topology file needs {FORMAT}")
    return routes


def read_topology(path: Path, hosts: Collection[str]) -> Topology:
    """The topology in `path`, checked: each line parses, one head, no loop, every node a host of the rig."""
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError
    from ClusterShell.Topology import TopologyError, TopologyGraph

    routes = _routes(path)
    sources, destinations = NodeSet(), NodeSet()
    parents: dict[str, str] = {}
    for number, src, dst in routes:
        try:
            src_set, dst_set = NodeSet(src), NodeSet(dst)
        except NodeSetParseError as exc:
            raise ProvisionError(f"{path}, line {number}: {exc}: write node sets as gpu-[001-064]") from None
        sources.update(src_set)
        destinations.update(dst_set)
        for name in dst_set:
            parents[name] = str(src_set)
    heads = sources - destinations
    if len(heads) != 1:
        why = "every router is also reached from another" if not heads else f"it has {len(heads)} ({heads})"
        raise ProvisionError(
            f"{path}: the topology needs exactly one head (a router no line reaches: this machine); {why}"
        )
    strangers = destinations - sources - NodeSet.fromlist(list(hosts))
    if strangers:
        first = next(iter(strangers))
        number = next(n for n, _, dst in routes if first in NodeSet(dst))
        raise ProvisionError(
            f"{path}, line {number}: {first} is not a host of the rig"
            + (f" (nor are {len(strangers) - 1} more: {strangers})" if len(strangers) > 1 else "")
            + ": remove it from the topology or add it to the rig's hosts"
        )
    graph = TopologyGraph()  # what ClusterShell's TopologyParser builds from the same lines
    try:
        for _, src, dst in routes:
            graph.add_route(NodeSet(src), NodeSet(dst))
        tree = graph.to_tree(str(heads))
    except TopologyError as exc:
        raise ProvisionError(f"{path}: {exc}: each node set may be reached from one router only") from None
    return Topology(path, tree, str(heads), parents)
