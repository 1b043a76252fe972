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


def test_units_the_install_enabled_at_boot_are_disabled_and_each_package_is_named(tmp_path: Path) -> None:
    """Issue 40 item 15: installing openssh-server, prometheus-node-exporter and munge left their units
    enabled in multi-user.target.wants; a reboot of the developer's machine started them. apt-get and
    deb-systemd-helper are stand-ins here: the install adds the links a package's postinst adds."""
    bin_dir, units = tmp_path / "bin", tmp_path / "units"
    wants = units / "multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "cron.service").symlink_to("/lib/systemd/system/cron.service")  # the machine's own: kept
    bin_dir.mkdir()
    fakes = {
        "dpkg-query": FAKE_DPKG_QUERY,
        "apt-get": f'#!/bin/sh\n[ "$1" != install ] || ln -s /lib/systemd/system/munge.service {wants}/\n',
        "deb-systemd-helper": f'#!/bin/sh\necho "$@" >> {tmp_path}/helper.log\nrm -f {wants}/"$2"\n',
    }
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "MGPU_CI_UNIT_DIR": str(units),
        "MGPU_CI_POLICY_RC_D": str(tmp_path / "policy-rc.d"),
    }
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    assert (
        "installing the missing test packages (nothing installed is upgraded): sudo mmdebstrap" in done.stderr
    )
    assert (tmp_path / "helper.log").read_text() == "disable munge.service\n"
    assert sorted(p.name for p in wants.iterdir()) == ["cron.service"]
    assert not (tmp_path / "policy-rc.d").exists()  # the install's own policy, removed again
