"""Plain Fabric, the floor of any tool built on it (issue 32): `ThreadingGroup.run` of one command.

    python fabric_group.py KNOWN_HOSTS KEY USER COMMAND HOST:PORT...

One thread and one cold Paramiko connection per host, as Fabric's group does it; host keys checked
against KNOWN_HOSTS (unknown keys refused, like the other contenders), no ssh_config, no agent. Prints
{host: stdout} as one JSON object and exits 1 when any host failed (its error in the object instead).
"""

from __future__ import annotations

import json
import sys

import paramiko
from fabric import Config, ThreadingGroup
from fabric.exceptions import GroupException


def main(argv: list[str]) -> int:
    known_hosts, key, user, command, *targets = argv
    config = Config(overrides={"load_ssh_configs": False})
    connect = {"key_filename": [key], "look_for_keys": False, "allow_agent": False}
    group = ThreadingGroup(*targets, user=user, config=config, connect_kwargs=connect)
    for connection in group:
        connection.client.load_host_keys(known_hosts)
        connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        results = group.run(command, hide=True, warn=True)
        failed = False
    except GroupException as exc:
        results, failed = exc.result, True
    out = {
        f"{c.host}:{c.port}": (r.stdout if not isinstance(r, Exception) else f"error: {r!r}")
        for c, r in results.items()
    }
    print(json.dumps(out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
