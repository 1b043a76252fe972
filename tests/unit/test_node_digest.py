"""node/core/digest.py: SHA-256 without OpenSSL gives hashlib's digests, and falls back to hashlib where
CPython's own SHA-256 is missing or refused (a FIPS-patched build)."""

from __future__ import annotations

import builtins
import hashlib
from typing import Any

import pytest

from mgpu_provision.node.core import digest


@pytest.mark.parametrize("data", [b"", b"abc", bytes(range(256)) * 300])
def test_the_digest_is_hashlibs(data: bytes) -> None:
    assert digest.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_without_pythons_own_sha256_hashlib_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def refusing(name: str, *args: Any, **kwargs: Any) -> Any:
        if name in ("_sha2", "_sha256"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refusing)
    assert digest._sha256_of_python() is hashlib.sha256
