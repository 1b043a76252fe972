"""An internal apt mirror for the driver (`driver.repo`): its deb822 source and keyring, and a simulated
install from it alone that names what it lacks before anything on the box changes.

Air-gapped and regulated sites get the driver from a mirror of their own, signed with their own key. The
source apply writes trusts that key only for that mirror (`Signed-By:`), as Debian recommends. Before the
box's apt configuration is touched, `check` runs apt against the mirror in private folders (its own
source list, lists and cache: the box's are only read, through dpkg's status), so a mirror missing a
dependency or signed with another key is reported by plan, naming the package or the key.

Shipped to nodes: Python 3.8, standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from ...typing_lite import TYPE_CHECKING
from ..core import system
from ..core.atomic import atomic_write
from ..core.errors import AgentFailure
from .common import release_family

if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

SOURCES_DIR = "/etc/apt/sources.list.d"
KEYRINGS_DIR = "/etc/apt/keyrings"
NAME = "mgpu-provision-driver"


def paths(name: str = NAME) -> Tuple[str, str]:
    """(the .sources file, the keyring) apply manages for a mirror."""
    return os.path.join(SOURCES_DIR, name + ".sources"), os.path.join(KEYRINGS_DIR, name + ".asc")


def sources_text(url: str, keyring: str, suite: str = "./", components: str = "") -> str:
    """A deb822 stanza for the mirror, trusted only through its own keyring. A flat repository's suite is
    `./` and has no components."""
    lines = ["Types: deb", "URIs: " + url, "Suites: " + suite]
    if components:
        lines.append("Components: " + components)
    lines.append("Signed-By: " + keyring)
    return (
        "# Written by mgpu-provision: the NVIDIA driver's mirror (driver.repo).\n" + "\n".join(lines) + "\n"
    )


def configure(repo: Dict[str, str]) -> Tuple[bool, str]:
    """Write the mirror's source and keyring (only what differs); say what changed."""
    source, keyring = paths()
    wanted = {
        keyring: repo["key"],
        source: sources_text(repo["url"], keyring, repo.get("suite") or "./", repo.get("components") or ""),
    }
    changed = [path for path, text in wanted.items() if system.read_text(path) != text]
    for path in changed:
        atomic_write(path, wanted[path].encode("utf-8"), 0o644)
    if not changed:
        return False, "mirror {} already configured".format(repo["url"])
    return True, "mirror {} configured ({})".format(repo["url"], ", ".join(sorted(changed)))


_MISSING = (
    re.compile(r"Depends: (\S+)(?: \([^)]*\))? but it is not (?:installable|going to be installed)"),
    re.compile(r"Unable to locate package (\S+)"),
    re.compile(r"Package '?(\S+?)'? has no installation candidate"),
    re.compile(r"Version '[^']+' for '(\S+)' was not found"),
)
_KEY = re.compile(r"NO_PUBKEY ([0-9A-Fa-f]{8,40})")


def missing_packages(simulation: str) -> List[str]:
    """The packages an `apt-get -s install` could not find, in the order apt names them."""
    found: List[str] = []
    for pattern in _MISSING:
        for match in pattern.finditer(simulation):
            if match.group(1) not in found:
                found.append(match.group(1))
    return found


def untrusted_key(update: str) -> Optional[str]:
    """The key id apt could not verify the mirror with (signed with another key than the one given)."""
    match = _KEY.search(update)
    if match:
        return match.group(1)
    return "unknown" if "is not signed" in update or "NO_PUBKEY" in update else None


def check(repo: Dict[str, str], install: List[str]) -> List[str]:
    """Resolve `install` (`name` or `name=version`) from the mirror alone, in private folders; the packages
    it lacks (empty: the set resolves). A mirror apt cannot reach or trust fails, naming why. A box that
    installs with dnf, yum or zypper is not asked here: apply reads its mirror right after writing it and
    takes it back when it cannot be read (node/packages/rpmrepo.py)."""
    if release_family(system.os_release(system.os_release_text())).method != "apt":
        return []
    scratch = tempfile.mkdtemp(prefix="mgpu-mirror-")
    try:
        keyring = os.path.join(scratch, "mirror.asc")
        parts = os.path.join(scratch, "sources.list.d")
        os.makedirs(os.path.join(scratch, "lists", "partial"))
        os.makedirs(os.path.join(scratch, "cache", "archives", "partial"))
        os.makedirs(parts)
        with open(keyring, "w", encoding="utf-8") as handle:
            handle.write(repo["key"])
        text = sources_text(repo["url"], keyring, repo.get("suite") or "./", repo.get("components") or "")
        with open(os.path.join(parts, "mirror.sources"), "w", encoding="utf-8") as handle:
            handle.write(text)
        options = [
            "-o", "Dir::Etc::SourceList=/dev/null",
            "-o", "Dir::Etc::SourceParts=" + parts,
            "-o", "Dir::State::Lists=" + os.path.join(scratch, "lists"),
            "-o", "Dir::Cache=" + os.path.join(scratch, "cache"),
            "-o", "Debug::NoLocking=1",
        ]  # fmt: skip
        update = system.run(["apt-get", *options, "update"], timeout=300)
        said = update.stdout + update.stderr
        key = untrusted_key(said)
        if key is not None:
            raise AgentFailure(
                "driver",
                "mirror {} is not signed by the key given in driver.repo (apt: NO_PUBKEY {}); nothing was "
                "changed".format(repo["url"], key),
            )
        if update.returncode != 0 or re.search(r"^(Err|E):", said, re.MULTILINE):
            tail = " | ".join(line for line in said.splitlines() if line.startswith(("Err", "E:")))[-400:]
            raise AgentFailure(
                "driver", "mirror {} cannot be read: {}".format(repo["url"], tail or "apt failed")
            )
        simulated = system.run(
            ["apt-get", *options, "-s", "install", "--no-install-recommends", *install], timeout=300
        )
        missing = missing_packages(simulated.stdout + simulated.stderr)
        if simulated.returncode != 0 and not missing:
            raise AgentFailure("driver", "apt cannot resolve the set from mirror {}".format(repo["url"]))
        return missing
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
