"""`.ci/system-packages` installs only the packages that are missing, with `--no-upgrade`: a newcomer's
machine once had nine packages upgraded (bash, systemd, libsystemd0, ...) because one was missing.

dpkg-query is replaced on PATH by a script that answers as dpkg does for a machine that lacks two of the
packages; `--dry-run` prints the apt-get command the script would run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "system-packages"

# `dpkg-query -W -f='${db:Status-Abbrev}' PKG` prints `ii ` for an installed package and fails for an
# unknown one (dpkg-query(1)); `rc ` is a removed package whose configuration is left.
FAKE_DPKG_QUERY = """#!/bin/sh
for last; do :; done
case "$last" in
    mmdebstrap) echo "dpkg-query: no packages found matching $last" >&2; exit 1 ;;
    sudo) printf 'rc ' ;;
    *) printf 'ii ' ;;
esac
"""


def dry_run(tmp_path: Path, dpkg_query: str) -> str:
    (tmp_path / "dpkg-query").write_text(dpkg_query)
    (tmp_path / "dpkg-query").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    return done.stdout


def test_only_missing_packages_are_installed_and_nothing_is_upgraded(tmp_path: Path) -> None:
    command = dry_run(tmp_path, FAKE_DPKG_QUERY).split()
    assert command[:2] == ["apt-get", "install"]
    assert "--no-upgrade" in command and "--no-install-recommends" in command
    assert [word for word in command if not word.startswith("-") and "=" not in word][2:] == [
        "sudo",
        "mmdebstrap",
    ]


def test_nothing_runs_when_every_package_is_there(tmp_path: Path) -> None:
    assert dry_run(tmp_path, "#!/bin/sh\nprintf 'ii '\n") == ""


def test_ci_run_installs_system_packages_through_the_script() -> None:
    text = (REPO / ".ci" / "run").read_text()
    assert ".ci/system-packages" in text and "apt-get" not in text
