"""The Debian test root's mirror comes from this machine's own apt sources, in either of apt's formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.debian_root import RootUnavailable, debian_mirror

DEB822 = """\
Types: deb
URIs: http://security.invalid/debian-security
Suites: bookworm-security
Components: main

Types: deb
# a comment line inside the stanza
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
"""


def test_the_mirror_is_read_from_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert debian_mirror((tmp_path / "sources.list.d",)) == "http://mirror.invalid/debian"


def test_the_mirror_is_read_from_a_one_line_list(tmp_path: Path) -> None:
    listed = tmp_path / "sources.list"
    listed.write_text("# old style\ndeb [arch=amd64] http://mirror.invalid/debian bookworm main\n")
    assert debian_mirror((tmp_path / "missing.d", listed)) == "http://mirror.invalid/debian"


def test_no_debian_mirror_says_how_to_name_one(tmp_path: Path) -> None:
    listed = tmp_path / "sources.list"
    listed.write_text("deb http://archive.invalid/ubuntu jammy main\n")
    with pytest.raises(RootUnavailable, match="set MGPU_TEST_DEBIAN_MIRROR to one"):
        debian_mirror((listed,))
