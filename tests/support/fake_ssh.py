"""A stand-in for the `ssh` ClusterShell starts (its task info `ssh_path`), for unit tests of `--via clush`
without sshd: each host's command runs on this machine, under /bin/sh, in a HOME of that host's own, and
each connection is one line of a log (the host, then ssh's options). The host `dead` refuses every
connection as OpenSSH would (exit 255, its words). The real sshd cases are tests/e2e/test_clush*_e2e.py."""

from __future__ import annotations

import sys
from pathlib import Path

_SCRIPT = """#!{python} -S
import os, sys
host, command = sys.argv[-2], sys.argv[-1]
with open({log!r}, "a") as log:
    log.write(host + " " + " ".join(sys.argv[1:-2]) + "\\n")
if host == "dead":
    sys.stderr.write("ssh: connect to host 127.0.0.9 port 22: Connection refused\\n")
    sys.exit(255)
home = os.path.join({homes!r}, host)
os.makedirs(home, exist_ok=True)
os.execve("/bin/sh", ["sh", "-c", command], dict(os.environ, HOME=home))
"""


def write_fake_ssh(script: Path, log: Path, homes: Path) -> Path:
    """The stand-in at `script`, logging to `log`, each host's HOME under `homes`."""
    script.write_text(_SCRIPT.format(python=sys.executable, log=str(log), homes=str(homes)))
    script.chmod(0o755)
    return script
