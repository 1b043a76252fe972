"""The driver's repository on RPM boxes (`driver.repo` with dnf, yum or zypper): its `.repo` file and key,
checked against the repository before anything is written, then written once.

NVIDIA's installation guide configures its repository before any install command: a `.repo` file
(`dnf config-manager --add-repo .../cuda-rhel9.repo`, `zypper addrepo .../cuda-sles15.repo`) with
`gpgcheck=1` and the repository's key. A site's own mirror gets the same here, signed with the site's key:
the key is imported into rpm's database once (`rpm --import`, which zypper and dnf both trust) and every
later call checks signatures, the repository's metadata (`repo_gpgcheck`) and each package
(`pkg_gpgcheck`, zypper; dnf's `gpgcheck`). Before anything is written the repository's `repomd.xml` is
fetched and its signature checked with the given key (gpgv): a mirror that cannot be reached, or is signed
with another key, is named and nothing changes. It is read once more by the manager right after it is
written (`zypper refresh`, `dnf makecache`); a failure there takes the files back.
Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import base64
import functools
import os
import shutil
import tempfile

from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.atomic import atomic_write
from ..core.errors import AgentFailure

if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

NAME = "mgpu-provision-driver"
KEY = "/etc/pki/rpm-gpg/RPM-GPG-KEY-" + NAME
REPO_DIRS = {"dnf": "/etc/yum.repos.d", "yum": "/etc/yum.repos.d", "zypper": "/etc/zypp/repos.d"}


def paths(method: str) -> Tuple[str, str]:
    """(the .repo file, the key file) apply manages for a mirror installed with `method`."""
    return os.path.join(REPO_DIRS[method], NAME + ".repo"), KEY


def repo_text(method: str, url: str) -> str:
    """The repository's section: signatures checked on the metadata and on every package."""
    lines = [
        "# Written by mgpu-provision: the NVIDIA driver's mirror (driver.repo).",
        f"[{NAME}]",
        "name=NVIDIA driver mirror (driver.repo)",
        "baseurl=" + url,
        "enabled=1",
        "gpgcheck=1",
        "repo_gpgcheck=1",
        "gpgkey=file://" + KEY,
        "skip_if_unavailable=False",  # dnf: a mirror it cannot read or trust is an error, never skipped
    ]
    if method == "zypper":
        lines += ["pkg_gpgcheck=1", "autorefresh=1", "type=rpm-md"]
    return "\n".join(lines) + "\n"


def _read_check(method: str) -> List[str]:
    if method == "zypper":
        return ["zypper", "--non-interactive", "refresh", "--force", NAME]
    return [
        method,
        "-y",
        "--disablerepo=*",
        f"--enablerepo={NAME}",
        "--setopt=skip_if_unavailable=False",
        "makecache",
    ]


def configure(method: str, repo: Dict[str, str]) -> Tuple[bool, str]:
    """Check that the mirror answers and is signed with the given key (before anything changes), then write
    its .repo file and key, import the key once, and read the repository; a failed read takes the files
    back. Say what changed."""
    repo_file, key_file = paths(method)
    wanted = {key_file: repo["key"], repo_file: repo_text(method, repo["url"])}
    changed = [path for path, text in wanted.items() if system.read_text(path) != text]
    if not changed:
        return False, "mirror {} already configured".format(repo["url"])
    check_signed(repo["url"], repo["key"])
    before = {path: system.read_text(path) for path in wanted}
    for path in sorted(changed):
        atomic_write(path, wanted[path].encode("utf-8"), 0o644)
    imported = system.run(["rpm", "--import", key_file], timeout=60)
    read = system.run(_read_check(method), timeout=300) if imported.returncode == 0 else imported
    if read.returncode != 0:
        _take_back(before)  # the key stays: it is the one that signs the mirror
        said = [line.strip() for line in (read.stderr + "\n" + read.stdout).splitlines() if line.strip()]
        raise AgentFailure(
            "driver",
            "mirror {} cannot be read with {}: {}; nothing was changed".format(
                repo["url"], method, (said[-1] if said else "exit {}".format(read.returncode))[:300]
            ),
        )
    return True, "mirror {} configured ({})".format(repo["url"], ", ".join(sorted(changed)))


def dearmor(text: str) -> bytes:
    """The binary packets of an ASCII-armored OpenPGP block (RFC 4880 section 6: base64 between the
    header lines and the `=` checksum line)."""
    body: List[str] = []
    inside = False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("-----BEGIN PGP"):
            inside, body = True, []
        elif line.startswith("-----END PGP"):
            break
        elif inside and line and ":" not in line and not line.startswith("="):
            body.append(line)
    try:
        return base64.b64decode("".join(body), validate=True)
    except ValueError:
        return b""


def check_signed(url: str, key: str) -> None:
    """The mirror's repomd.xml answers and its detached signature verifies with `key` (gpgv, in a scratch
    folder): else a plain error naming which, before anything changes."""
    import urllib.request  # only a mirror's first configuration needs it

    base = url if url.endswith("/") else url + "/"
    fetched: Dict[str, bytes] = {}
    for name in ("repomd.xml", "repomd.xml.asc"):
        try:
            with urllib.request.urlopen(base + "repodata/" + name, timeout=60) as response:
                fetched[name] = response.read()
        except (OSError, ValueError) as exc:
            raise AgentFailure(
                "driver",
                "mirror {} cannot be read ({}: {}); check driver.repo.url; nothing was changed".format(
                    url, name, exc
                ),
            ) from exc
    scratch = tempfile.mkdtemp(prefix="mgpu-rpmrepo-")
    try:
        files = {
            "key.gpg": dearmor(key),
            "repomd.xml": fetched["repomd.xml"],
            "repomd.xml.sig": dearmor(fetched["repomd.xml.asc"].decode("utf-8", "replace")),
        }
        for name, data in files.items():
            with open(os.path.join(scratch, name), "wb") as handle:
                handle.write(data)
        join = functools.partial(os.path.join, scratch)
        argv = ["gpgv", "--keyring", join("key.gpg"), join("repomd.xml.sig"), join("repomd.xml")]
        verified = system.run(argv, timeout=60)
        if verified.returncode == 127:
            return  # no gpgv: zypper and dnf check the signature themselves when the mirror is read
        if verified.returncode != 0:
            said = [line for line in verified.stderr.splitlines() if line.strip()]
            raise AgentFailure(
                "driver",
                "mirror {} is not signed by the key given in driver.repo.key ({}); nothing was "
                "changed".format(url, (said[-1] if said else "bad signature").replace(scratch + "/", "")),
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _take_back(before: Dict[str, Optional[str]]) -> None:
    for path, text in before.items():
        if text is None:
            if os.path.exists(path):
                os.remove(path)
        else:
            atomic_write(path, text.encode("utf-8"), 0o644)
