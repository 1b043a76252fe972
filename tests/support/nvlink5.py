"""The HGX B200 rig the NVLink5 end-to-end tests apply (real apt, dnf and zypper against signed stand-in
mirrors): one B200 on NVSwitch (18 links per GPU), the driver pinned with Fabric Manager from `driver.repo`,
no reboot (the test hosts are not booted), no env files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.hosts import HostFactory, TestHost
from tests.support.rpm_roots import NVLINK5_VERSION


def write_rig(factory: HostFactory, path: Path, host: TestHost, url: str, key: str, **driver: Any) -> None:
    """The rig file at `path` for `host`, its mirror's key beside it; `driver` adds to the driver section."""
    (path.parent / "mirror.asc").write_text(key)
    rig = {
        "gpus": {"model": "NVIDIA B200", "count": 1},
        "bridge": {"kind": "nvswitch", "links": 18},  # NVLink5: 18 links per GPU to the switches
        "driver": {
            "version": NVLINK5_VERSION,
            "fabricmanager": True,
            "reboot": "never",
            "repo": {"url": url, "key": "mirror.asc"},
            **driver,
        },
    }
    files = {"profile_d": None, "environment_file": None, "launcher": None}
    factory.write_rig(path, [host], rigs={host.rig: rig}, files=files)
