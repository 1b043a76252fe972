"""systemd's own EnvironmentFile= reader, called offline: no systemd needs to run.

systemd builds its parser into the private library every systemd install ships
(`libsystemd-shared-<version>.so`, the code of src/basic/env-file.c and env-util.c). A unit's
EnvironmentFile= is read by `load_env_file` and then cleaned by `strv_env_clean_with_callback` (invalid
names and values dropped), which is what `exec_context_load_environment` does before a service starts; this
module makes the same two calls through ctypes, so the tests check the real parser of the installed
version rather than a copy of its rules.
"""

from __future__ import annotations

import ctypes
import glob
import os
from pathlib import Path

from tests.support.hosts import skip_or_fail

LIBRARY_GLOBS = (
    "/usr/lib/*/systemd/libsystemd-shared-*.so",
    "/usr/lib64/systemd/libsystemd-shared-*.so",
    "/usr/lib/systemd/libsystemd-shared-*.so",
    "/lib/systemd/libsystemd-shared-*.so",
)

StrvPointer = ctypes.POINTER(ctypes.c_char_p)


def library_path() -> str | None:
    found = sorted(path for pattern in LIBRARY_GLOBS for path in glob.glob(pattern))
    return found[-1] if found else None


def require_library() -> ctypes.CDLL:
    """The loaded library; skips the test without one (fails it under CI=true: CI has systemd)."""
    path = library_path()
    if path is None:
        reason = "no libsystemd-shared-*.so (systemd's private library) on this machine"
        skip_or_fail(reason, "systemd's reader is missing")
    lib = ctypes.CDLL(path)
    lib.load_env_file.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(StrvPointer)]
    lib.load_env_file.restype = ctypes.c_int
    lib.strv_env_clean_with_callback.argtypes = [StrvPointer, ctypes.c_void_p, ctypes.c_void_p]
    lib.strv_env_clean_with_callback.restype = StrvPointer
    return lib


def read_environment_file(path: Path) -> dict[str, str]:
    """What a service with `EnvironmentFile=<path>` gets from the file, as systemd reads it."""
    lib = require_library()
    found = StrvPointer()
    code = lib.load_env_file(None, str(path).encode(), ctypes.byref(found))
    assert code == 0, f"systemd could not read {path}: {os.strerror(-code)}"
    variables: dict[str, str] = {}
    if not found:
        return variables
    found = lib.strv_env_clean_with_callback(found, None, None)  # the small strv leaks: test process only
    index = 0
    while found[index] is not None:
        name, _, value = found[index].decode().partition("=")
        variables[name] = value
        index += 1
    return variables
