"""`driver.repo`'s check on the node, against the signed local repository (tests/support/apt_repo.py) and the
real apt of the Debian-root test host: the set resolves from the mirror alone, a mirror missing a dependency
names it, a mirror signed with another key names the key; the box's own apt configuration is left as it
was."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.support import apt_repo
from tests.support.hosts import TestHost

Mirrors = Callable[..., apt_repo.SignedRepo]

REPO = Path(__file__).resolve().parents[2]
SET = ["nvidia-smi=535.216.03-2~bpo12+1", "libnvidia-ml1=535.216.03-2~bpo12+1"]


CHECK = """\
import json, sys
from mgpu_provision.node.core.errors import AgentFailure
from mgpu_provision.node.packages import mirror
request = json.load(open(sys.argv[1]))
try:
    print(json.dumps(mirror.check(request["repo"], request["install"])))
except AgentFailure as exc:
    print(json.dumps({"error": exc.message}))
"""


def check(host: TestHost, repo: dict[str, str], tmp_path: Path) -> tuple[list[str] | None, str]:
    """The agent's mirror.check run inside the host: (missing packages, "") or (None, the failure)."""
    (tmp_path / "check.py").write_text(CHECK)
    (tmp_path / "request.json").write_text(json.dumps({"repo": repo, "install": SET}))
    root = host.chroot
    host.run_in_ns(
        f"mkdir -p {root}/opt/mgpu && cp -r {REPO / 'mgpu_provision'} {tmp_path}/check.py "
        f"{tmp_path}/request.json {root}/opt/mgpu/"
    )
    done = host.run_in_root("PYTHONPATH=/opt/mgpu python3 /opt/mgpu/check.py /opt/mgpu/request.json")
    answer = json.loads(done.stdout)
    return (None, answer["error"]) if isinstance(answer, dict) else (answer, "")


def test_the_set_resolves_from_the_mirror_alone_and_the_box_is_untouched(
    debian_host: TestHost, mirrors: Mirrors, tmp_path: Path
) -> None:
    repo = mirrors("full")
    before = debian_host.run_in_root("ls /etc/apt/sources.list.d /var/lib/apt/lists | sort").stdout
    assert check(debian_host, {"url": repo.url, "key": repo.armored}, tmp_path) == ([], "")
    assert debian_host.run_in_root("ls /etc/apt/sources.list.d /var/lib/apt/lists | sort").stdout == before


def test_a_mirror_missing_a_dependency_is_named(
    debian_host: TestHost, mirrors: Mirrors, tmp_path: Path
) -> None:
    repo = mirrors("partial", leave_out=("pciutils", "nvidia-installer-cleanup"))
    missing, _ = check(debian_host, {"url": repo.url, "key": repo.armored}, tmp_path)
    assert missing is not None and set(missing) >= {"pciutils"}, missing


def test_a_wrong_key_is_named(debian_host: TestHost, mirrors: Mirrors, tmp_path: Path) -> None:
    repo = mirrors("signed")
    key = apt_repo.stranger_key(tmp_path / "stranger")
    missing, error = check(debian_host, {"url": repo.url, "key": key}, tmp_path)
    assert missing is None and "not signed by the key given in driver.repo" in error
    assert repo.fingerprint[-16:] in error, error
