"""Who to reach and how: one `HostTarget` per host, the rig file's host merged over its defaults.

Everything below this module (SSH, sessions, the worker pool) takes targets, never the rig file, so that
`init` can reach a box that no rig file names yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..typing_lite import NamedTuple

if TYPE_CHECKING:
    import fabric

    from ..rig.models import Host
    from ..rig.rig import LoadedRig

DEFAULT_PYTHON = "python3"


class HostTarget(NamedTuple):
    """Everything needed to reach one host and run its agent; built from the rig by `targets_for`."""

    name: str
    address: str
    port: int | None
    user: str | None
    identity_file: str | None
    jump: str | None
    become: bool
    python: str
    connection: Literal["ssh", "local"]
    simulate: str | None
    connect_timeout_s: float
    command_timeout_s: float


def targets_for(loaded: LoadedRig, hosts: list[Host]) -> list[HostTarget]:
    """Merge each host over the rig's defaults; paths (key, twin) resolve against the rig file's folder."""
    defaults = loaded.spec.defaults
    targets = []
    for host in hosts:
        identity = host.identity_file or defaults.identity_file
        simulate = host.simulate
        targets.append(
            HostTarget(
                name=host.name,
                address=host.target,
                port=host.port if host.port is not None else defaults.port,
                user=host.user or defaults.user,
                identity_file=str(loaded.resolve(identity)) if identity else None,
                jump=host.jump or defaults.jump,
                become=host.become if host.become is not None else bool(defaults.become),
                python=host.python or defaults.python or DEFAULT_PYTHON,
                connection=host.connection,
                simulate=str(loaded.resolve(simulate)) if simulate else None,
                connect_timeout_s=defaults.connect_timeout_s,
                command_timeout_s=defaults.command_timeout_s,
            )
        )
    return targets


def describe(target: HostTarget, conn: fabric.Connection | None = None) -> str:
    """`gpu-a (127.0.0.11:2222)`: the name people use and where it really points."""
    if target.connection == "local":
        return f"{target.name} (local)"
    if conn is not None:
        return f"{target.name} ({conn.host}:{conn.port})"
    return f"{target.name} ({target.address}:{target.port or 22})"
