"""SHA-256 for the agent's everyday calls without loading OpenSSL.

`import hashlib` loads `_hashlib`, which links OpenSSL's libcrypto: ~5 ms of CPU on every `facts` call (a
tenth of the call) for the few digests it takes (the managed files, the torch probe's cache key). CPython
also builds SHA-256 in (`_sha2` from 3.12, `_sha256` before), with the same digests; a build without it,
or one that refuses it (FIPS-patched builds allow OpenSSL's only), gets hashlib's.
"""

from __future__ import annotations

from ...typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_SHA256: Optional[Callable[[bytes], Any]] = None


def _sha256_of_python() -> Callable[[bytes], Any]:
    for name in ("_sha2", "_sha256"):
        try:
            found: Callable[[bytes], Any] = __import__(name).sha256
            found(b"")  # a build that refuses its own hashes says so here
            return found
        except (ImportError, AttributeError, ValueError):
            continue
    import hashlib

    return hashlib.sha256


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of `data`, as hex."""
    global _SHA256
    if _SHA256 is None:
        _SHA256 = _sha256_of_python()
    return str(_SHA256(data).hexdigest())
