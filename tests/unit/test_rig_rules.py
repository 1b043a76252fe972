"""Each cross-field rule gets a rig file that breaks it; the problem must name its line, field and cause.

The offending line of each case carries a `# <-` marker, so the expected line number is read from the text
itself rather than counted by hand.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mgpu_provision.errors import SpecError
from mgpu_provision.rig import load_rig
from tests.support.rig_problems import problems_of

RIGS = Path(__file__).parent / "rigs"
HEAD = """\
version: 1
hosts:
  - {name: gpu-a, rig: pair}
  - {name: gpu-b, rig: pair}
"""
GPUS = '    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}\n'


def marked_line(text: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), 1) if "# <-" in line]
    assert len(lines) == 1, "each case marks exactly one line"
    return lines[0]


def rig(*lines: str, tail: str = "") -> str:
    """HEAD plus a rig `pair` with the given lines (8-space indented keys of the rig)."""
    return HEAD + "rigs:\n  pair:\n" + "".join(f"    {line}\n" for line in lines) + tail


CASES = {
    "host-rig-exists": (
        HEAD + "  - {name: gpu-c, rig: a100}  # <-\nrigs:\n  pair:\n" + GPUS,
        "hosts[2].rig",
        "rig 'a100' is not defined under `rigs` (defined: pair)",
    ),
    "hosts-are-distinct-boxes": (
        HEAD + "  - {name: gpu-c, address: GPU-A., rig: pair}  # <-\nrigs:\n  pair:\n" + GPUS,
        "hosts[2].address",
        "hosts 'gpu-a' and 'gpu-c' are the same box (gpu-a port 22): 'gpu-a' at hosts[0], "
        "'gpu-c' at hosts[2]; one apply would converge it twice at once",
    ),
    "hosts-are-distinct-boxes-by-ip": (
        HEAD.replace("{name: gpu-b, rig: pair}", "{name: gpu-b, address: '0::1', rig: pair}")
        + "  - {name: gpu-c, address: '0:0::1', port: 22, rig: pair}  # <-\nrigs:\n  pair:\n"
        + GPUS,
        "hosts[2].address",
        "hosts 'gpu-b' and 'gpu-c' are the same box (::1 port 22)",
    ),
    "host-names-unique": (
        HEAD + "  - {name: gpu-a, rig: pair}  # <-\nrigs:\n  pair:\n" + GPUS,
        "hosts[2].name",
        "host name 'gpu-a' is already used by hosts[0]",
    ),
    "group-members-exist": (
        rig(GPUS.strip(), tail="groups:\n  lab: [gpu-a, gpu-z]  # <-\n"),
        "groups.lab[1]",
        "group member 'gpu-z' is not a host of the fleet",
    ),
    "group-name-is-not-a-host": (
        rig(GPUS.strip(), tail="groups:\n  gpu-a: [gpu-b]  # <-\n"),
        "groups.gpu-a",
        "group 'gpu-a' has the name of a host",
    ),
    "ddp-master-in-fleet": (
        rig(GPUS.strip(), "ddp: {master: gpu-z}  # <-"),
        "rigs.pair.ddp.master",
        "ddp master 'gpu-z' is not a host of the fleet",
    ),
    "ddp-master-has-address": (
        rig(GPUS.strip(), "ddp: {master: gpu-a}  # <-"),
        "rigs.pair.ddp.master",
        "ddp master 'gpu-a' has no `address`: the other nodes of rig 'pair' reach the rendezvous there",
    ),
    "ddp-master-uses-rig": (
        HEAD
        + "  - {name: big-1, rig: big}\nrigs:\n  pair:\n"
        + GPUS
        + "    ddp: {master: big-1}  # <-\n  big:\n"
        + GPUS,
        "rigs.pair.ddp.master",
        "ddp master 'big-1' is a 'big' host; the master of rig 'pair' must be one of its own hosts",
    ),
    "visible-devices-in-range": (
        rig(GPUS.strip(), "visible_devices: [0, 2]  # <-"),
        "rigs.pair.visible_devices[1]",
        "visible device 2 does not exist: the rig has 2 GPU(s), indices 0-1",
    ),
    "visible-devices-not-negative": (
        rig(GPUS.strip(), "visible_devices: [-1]  # <-"),
        "rigs.pair.visible_devices[0]",
        "visible device -1 does not exist",
    ),
    "visible-devices-unique": (
        rig(GPUS.strip(), "visible_devices: [GPU-1aff65f8-8897, GPU-1aff65f8-8897]  # <-"),
        "rigs.pair.visible_devices[1]",
        "visible device GPU-1aff65f8-8897 is listed twice",
    ),
    "batch-size-covers-gpus": (
        rig(GPUS.strip(), tail="smoke: {batch_size: 1}  # <-\n"),
        "smoke.batch_size",
        "batch size 1 is smaller than the 2 GPUs per node of rig 'pair'",
    ),
    "nproc-within-visible": (
        rig(GPUS.strip(), "visible_devices: [0]", "ddp: {master: gpu-a, nproc_per_node: 2}  # <-"),
        "rigs.pair.ddp.nproc_per_node",
        "nproc_per_node 2 is more than the 1 visible GPU(s) per node",
    ),
    "sli-mode-supported": (
        rig(
            GPUS.strip(), "bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}", "sli: {mode: AFR}  # <-"
        ),
        "rigs.pair.sli.mode",
        "SLI mode 'AFR' is not supported: NVIDIA drivers since 455 accept only Off and Mosaic (On, Auto, "
        "AFR, SFR, AA and AFRofAA were removed); BaseMosaic spans displays on GeForce",
    ),
    "sli-mode-on-from-yaml-bool": (
        rig(
            GPUS.strip(), "bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}", "sli: {mode: on}  # <-"
        ),
        "rigs.pair.sli.mode",
        "SLI mode 'On' is not supported",
    ),
    "sli-needs-two-gpus": (
        rig(
            'gpus: {model: "NVIDIA RTX A6000", count: 1}',
            "bridge: {kind: nvlink-bridge, pairs: [[0, 0]], links: 4}",
            "sli: {mode: Mosaic}  # <-",
        ),
        "rigs.pair.sli.mode",
        "SLI needs at least 2 GPUs of one model; this rig has 1",
    ),
    "sli-needs-bridge": (
        rig('gpus: {model: "NVIDIA RTX A6000", count: 2}', "sli: {mode: mosaic}  # <-"),
        "rigs.pair.sli.mode",
        "SLI needs a bridge: set bridge.kind",
    ),
    "sli-mosaic-needs-professional-cards": (
        rig(
            GPUS.strip(),
            "bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}",
            "sli: {mode: Mosaic}  # <-",
        ),
        "rigs.pair.sli.mode",
        "SLI Mosaic needs professional cards (Quadro, RTX A-series, RTX Ada); NVIDIA GeForce RTX 3090 is a "
        "GeForce card, whose driver ignores it: use mode BaseMosaic",
    ),
    "card-has-bridge-connector": (
        rig(
            'gpus: {model: "NVIDIA GeForce RTX 4090", count: 2}',
            "bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}  # <-",
        ),
        "rigs.pair.bridge.kind",
        "NVIDIA GeForce RTX 4090 has no NVLink/SLI connector (GeForce RTX 40 series): bridge kind "
        "nvlink-bridge is impossible",
    ),
    "card-has-sli-connector": (
        rig('gpus: {model: "NVIDIA GeForce RTX 5090", count: 2}', "sli: {mode: BaseMosaic}  # <-"),
        "rigs.pair.sli.mode",
        "NVIDIA GeForce RTX 5090 has no NVLink/SLI connector (GeForce RTX 50 series): SLI mode BaseMosaic is "
        "impossible",
    ),
    "card-has-nvlink-connector": (
        rig(
            'gpus: {model: "NVIDIA L40S", count: 2}',
            "bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}  # <-",
        ),
        "rigs.pair.bridge.kind",
        "NVIDIA L40S has no NVLink connector (L4, L40 and L40S): bridge kind nvlink-bridge is impossible",
    ),
    "blackwell-refuses-proprietary-flavor": (
        rig(
            'gpus: {model: "NVIDIA B200", count: 2}',
            'driver: {branch: "580", source: ubuntu, flavor: server}  # <-',
        ),
        "rigs.pair.driver.flavor",
        "NVIDIA B200 (Blackwell) runs only the open kernel modules; NVIDIA does not support the proprietary "
        "ones there and the GPU does not initialize: flavor server is proprietary",
    ),
    "grace-hopper-refuses-a-proprietary-default": (
        rig('gpus: {model: "NVIDIA GH200 480GB", count: 2}', 'driver: {branch: "550"}  # <-'),
        "rigs.pair.driver",
        "NVIDIA GH200 480GB (Grace Hopper) runs only the open kernel modules; NVIDIA does not support the "
        "proprietary ones there and the GPU does not initialize: branch 550 installs them by default (open "
        "from 560)",
    ),
    "driver-repo-key-readable": (
        rig(
            GPUS.strip(),
            'driver: {version: "535.216.03", source: debian,',
            "         repo: {url: http://mirror.lab/nvidia/, key: absent.asc}}  # <-",
        ),
        "rigs.pair.driver.repo.key",
        "cannot read the mirror's key",
    ),
    "driver-repo-is-a-package-repository": (
        rig(
            GPUS.strip(),
            'driver: {version: "550.54.15", method: runfile, runfile_url: /srv/NVIDIA.run,',
            "         runfile_sha256: " + "0" * 64 + ",",
            "         repo: {url: http://mirror.lab/nvidia/, key: absent.asc}}  # <-",
        ),
        "rigs.pair.driver.repo",
        "driver.repo is a package repository; method runfile installs no packages",
    ),
    # Issue 37 item 9: NVIDIA's deprecation schedule (580 is the last branch for Volta) and the data
    # center release notes (B200 from 570); the cards.branch_range table.
    "volta-past-580": (
        rig('gpus: {model: "Tesla V100-SXM2-32GB", count: 2}', 'driver: {branch: "590"}  # <-'),
        "rigs.pair.driver.branch",
        "Tesla V100-SXM2-32GB (Maxwell, Pascal or Volta) is driven by branch 580 and older; branch 590 does "
        'not support it: set driver.branch to "580"',
    ),
    # The README of NVIDIA/open-gpu-kernel-modules lists "NVIDIA B300 SXM6 AC" from 580.82.07 (not 580.76.05).
    "b300-before-580-82-07": (
        rig(
            'gpus: {model: "NVIDIA B300 SXM6 AC", count: 8}',
            'driver: {version: "580.76.05", flavor: open}  # <-',
        ),
        "rigs.pair.driver.version",
        "NVIDIA B300 SXM6 AC (Blackwell Ultra) is driven from 580.82.07; 580.76.05 does not support it",
    ),
    "b300-before-580": (
        rig('gpus: {model: "NVIDIA GB300", count: 4}', 'driver: {branch: "575", flavor: open}  # <-'),
        "rigs.pair.driver.branch",
        "NVIDIA GB300 (Blackwell Ultra) needs branch 580 or newer; branch 575 does not support it",
    ),
    "b200-before-570": (
        rig('gpus: {model: "NVIDIA B200", count: 8}', 'driver: {version: "550.163.01", flavor: open}  # <-'),
        "rigs.pair.driver.version",
        "NVIDIA B200 (Blackwell) needs branch 570 or newer; branch 550 does not support it: set "
        'driver.branch to "570" or later',
    ),
    # Issue 37 item 2: Canonical's archive has FM and NSCQ per branch and none of NVLink5's pieces.
    "nvlink5-from-ubuntus-archive": (
        rig(
            'gpus: {model: "NVIDIA B200", count: 8}',
            "bridge: {kind: nvswitch, links: 18}",
            'driver: {branch: "580", source: ubuntu, fabricmanager: true}  # <-',
        ),
        "rigs.pair.driver.source",
        "which Ubuntu's archive does not carry: set driver.source: cuda",
    ),
    "no-fabric-manager-on-a-gb200-tray": (
        rig(
            'gpus: {model: "NVIDIA GB200", count: 4}',
            "bridge: {kind: nvswitch, links: 18}",
            'driver: {branch: "580", source: cuda, fabricmanager: true}  # <-',
        ),
        "rigs.pair.driver.fabricmanager",
        "NVIDIA GB200 compute trays run no Fabric Manager (the rack's NVLink switch trays do)",
    ),
    "imex-is-nvidias": (
        rig(
            'gpus: {model: "NVIDIA GB200", count: 4}',
            'driver: {branch: "580", source: ubuntu, imex: true}  # <-',
        ),
        "rigs.pair.driver.imex",
        "the ubuntu source has no nvidia-imex package; use source cuda",
    ),
    "imex-peers-are-ip-addresses": (
        rig(
            'gpus: {model: "NVIDIA GB200", count: 4}',
            'driver: {branch: "580", source: cuda, imex: {peers: [10.0.0.1, 10.0.0.300]}}  # <-',
        ),
        "rigs.pair.driver.imex.peers[1]",
        "10.0.0.300 is not an IP address (nodes_config.cfg lists IP addresses)",
    ),
    "imex-peers-once": (
        rig(
            'gpus: {model: "NVIDIA GB200", count: 4}',
            'driver: {branch: "580", source: cuda, imex: {peers: [10.0.0.1, 10.0.0.1]}}  # <-',
        ),
        "rigs.pair.driver.imex.peers",
        "each address once",
    ),
    "imex-fleet-takes-ip-addresses": (
        "version: 1\nhosts:\n  - {name: gpu-a, address: gpu-a.lan, rig: pair}  # <-\n"
        + 'rigs:\n  pair:\n    gpus: {model: "NVIDIA GB200", count: 4}\n'
        + '    driver: {branch: "580", source: cuda, imex: true}\n',
        "hosts[0].address",
        "gpu-a's address gpu-a.lan is not an IP address, and IMEX's nodes_config.cfg lists IP addresses",
    ),
    "bridge-pairs-in-range": (
        rig(GPUS.strip(), "bridge: {kind: nvlink-bridge, pairs: [[0, 3]], links: 4}  # <-"),
        "rigs.pair.bridge.pairs[0][1]",
        "GPU 3 does not exist: the rig has 2 GPU(s), indices 0-1",
    ),
    "bridge-pairs-no-self": (
        rig(GPUS.strip(), "bridge: {kind: nvlink-bridge, pairs: [[1, 1]], links: 4}  # <-"),
        "rigs.pair.bridge.pairs[0]",
        "GPU 1 cannot be bridged to itself",
    ),
    "bridge-pairs-no-duplicates": (
        rig(GPUS.strip(), "bridge: {kind: nvlink-bridge, pairs: [[0, 1], [1, 0]], links: 4}  # <-"),
        "rigs.pair.bridge.pairs[1]",
        "pair [1, 0] is listed twice",
    ),
    "bridge-nvlink-needs-links": (
        rig(GPUS.strip(), "bridge: {kind: nvlink-bridge, pairs: [[0, 1]]}  # <-"),
        "rigs.pair.bridge",
        "bridge kind nvlink-bridge needs `links`",
    ),
    "bridge-nvlink-needs-pairs": (
        rig(GPUS.strip(), "bridge: {kind: nvlink, links: 4}  # <-"),
        "rigs.pair.bridge",
        "bridge kind nvlink needs `pairs` (which GPUs are joined) or a `topology_file`",
    ),
    "nvswitch-has-no-pairs": (
        rig(GPUS.strip(), "bridge: {kind: nvswitch, links: 18, pairs: [[0, 1]]}  # <-"),
        "rigs.pair.bridge.pairs",
        "nvswitch bridges take no `pairs`",
    ),
    "no-bridge-has-no-links": (
        rig(GPUS.strip(), "bridge: {links: 4}  # <-"),
        "rigs.pair.bridge.links",
        "`links` needs an NVLink bridge kind; bridge.kind is none",
    ),
    "driver-needs-version-or-branch": (
        rig(GPUS.strip(), "driver: {method: apt}  # <-"),
        "rigs.pair.driver",
        "driver needs `version`",
    ),
    "driver-not-both": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", branch: "550"}  # <-'),
        "rigs.pair.driver.branch",
        "give either `version` or `branch`, not both",
    ),
    "runfile-needs-url-and-sha": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", method: runfile}  # <-'),
        "rigs.pair.driver.method",
        "method runfile needs runfile_url and runfile_sha256",
    ),
    "runfile-needs-exact-version": (
        rig(
            GPUS.strip(),
            "driver:",
            '  branch: "550"  # <-',
            "  method: runfile",
            "  runfile_url: https://example.com/NVIDIA-Linux-x86_64-550.54.15.run",
            "  runfile_sha256: " + "a" * 64,
        ),
        "rigs.pair.driver.branch",
        "method runfile installs one exact `version`, not a branch",
    ),
    "runfile-url-only-with-runfile": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", runfile_url: /srv/nv.run}  # <-'),
        "rigs.pair.driver.runfile_url",
        "`runfile_url` is only used with method runfile (method is apt/dnf)",
    ),
    "driver-flavor-the-source-has": (
        rig(GPUS.strip(), 'driver: {version: "535.216.03", source: debian, flavor: server}  # <-'),
        "rigs.pair.driver.flavor",
        "the debian source has no server flavor (it has default, open)",
    ),
    "driver-cuda-repo-has-no-server-builds": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", source: cuda, flavor: server-open}  # <-'),
        "rigs.pair.driver.flavor",
        "the cuda source has no server-open flavor (it has default, open)",
    ),
    "driver-source-has-fabricmanager": (
        rig(
            'gpus: {model: "NVIDIA H100 80GB HBM3", count: 8}',
            "bridge: {kind: nvswitch, links: 18}",
            'driver: {version: "535.216.03", source: debian, fabricmanager: true}  # <-',
        ),
        "rigs.pair.driver.fabricmanager",
        "the debian source has no Fabric Manager package; use source cuda",
    ),
    "driver-source-method": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", source: rhel, method: apt}  # <-'),
        "rigs.pair.driver.method",
        "the rhel source is installed with dnf or yum, not apt",
    ),
    "driver-source-method-zypper": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", source: ubuntu, method: zypper}  # <-'),
        "rigs.pair.driver.method",
        "the ubuntu source is installed with apt, not zypper",
    ),
    "driver-packages-are-apt-only-not-zypper": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", method: zypper, packages: [nvidia-smi]}  # <-'),
        "rigs.pair.driver.packages",
        "`packages` is for apt sources; zypper installs NVIDIA's set",
    ),
    "driver-packages-are-apt-only": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", method: dnf, packages: [nvidia-driver]}  # <-'),
        "rigs.pair.driver.packages",
        "`packages` is for apt sources",
    ),
    "driver-open-needs-turing": (
        rig(
            'gpus: {model: "Tesla V100-SXM2-16GB", count: 2}',
            'driver: {version: "550.54.15", flavor: open}  # <-',
        ),
        "rigs.pair.driver.flavor",
        "open kernel modules need Turing or newer; Tesla V100-SXM2-16GB needs flavor default",
    ),
    "runfile-has-no-fabricmanager": (
        rig(
            'gpus: {model: "NVIDIA H100 80GB HBM3", count: 8}',
            "bridge: {kind: nvswitch, links: 18}",
            "driver:",
            '  version: "550.54.15"',
            "  method: runfile",
            "  fabricmanager: true  # <-",
            "  runfile_url: https://example.com/NVIDIA-Linux-x86_64-550.54.15.run",
            "  runfile_sha256: " + "a" * 64,
        ),
        "rigs.pair.driver.fabricmanager",
        "Fabric Manager has no runfile path here: install the driver with method apt or dnf",
    ),
    "runfile-has-no-server-flavor": (
        rig(
            GPUS.strip(),
            "driver:",
            '  version: "550.54.15"',
            "  method: runfile",
            "  flavor: server  # <-",
            "  runfile_url: https://example.com/NVIDIA-Linux-x86_64-550.54.15.run",
            "  runfile_sha256: " + "a" * 64,
        ),
        "rigs.pair.driver.flavor",
        "flavor server is an Ubuntu package build; a runfile has default or open",
    ),
    "containers-toolkit-has-cdi": (
        rig(GPUS.strip(), 'containers: {toolkit: "1.11.0", runtimes: [podman]}  # <-'),
        "rigs.pair.containers.toolkit",
        "toolkit 1.11.0 has no `nvidia-ctk cdi generate` (from 1.12.0): pin 1.12.0 or later",
    ),
    "fabricmanager-needs-nvswitch": (
        rig(GPUS.strip(), 'driver: {version: "550.54.15", fabricmanager: true}  # <-'),
        "rigs.pair.driver.fabricmanager",
        "Fabric Manager only runs NVSwitch boxes; bridge.kind is none",
    ),
    "env-value-no-nul": (
        rig(GPUS.strip(), tail='env:\n  A: "x\\0y"  # <-\n'),
        "env.A",
        "value of A contains a NUL character (\\0), which no environment variable can hold",
    ),
    "env-value-no-noncharacter": (
        rig(GPUS.strip(), 'env: {NCCL_DEBUG: "x\\uFFFE"}  # <-'),
        "rigs.pair.env.NCCL_DEBUG",
        "value of NCCL_DEBUG contains U+FFFE, a Unicode noncharacter: systemd ignores an EnvironmentFile "
        "line that holds one",
    ),
    "env-value-not-its-own-reference": (
        rig(GPUS.strip(), tail="env:\n  PATH: /usr/local/cuda/bin:${PATH}  # <-\n"),
        "env.PATH",
        "value of PATH refers to $PATH, but values are written as data, not expanded: the node would get the "
        "text $PATH; to put folders in front of PATH use path_prepend: {PATH: [/folder]}",
    ),
    "env-value-not-its-own-reference-rig": (
        rig(GPUS.strip(), 'env: {LD_LIBRARY_PATH: "/usr/local/cuda/lib64:$LD_LIBRARY_PATH"}  # <-'),
        "rigs.pair.env.LD_LIBRARY_PATH",
        "value of LD_LIBRARY_PATH refers to $LD_LIBRARY_PATH",
    ),
    "path-prepend-entry-absolute": (
        rig(GPUS.strip(), tail="path_prepend:\n  PATH: [cuda/bin]  # <-\n"),
        "path_prepend.PATH[0]",
        "PATH: entry 'cuda/bin' must be an absolute path (start with /)",
    ),
    "path-prepend-entry-no-colon": (
        rig(GPUS.strip(), "path_prepend: {LD_LIBRARY_PATH: [/a, /b:/c]}  # <-"),
        "rigs.pair.path_prepend.LD_LIBRARY_PATH[1]",
        "LD_LIBRARY_PATH: entry '/b:/c' contains ':', which separates the entries of the variable",
    ),
    "path-prepend-entry-no-nul": (
        rig(GPUS.strip(), tail='path_prepend:\n  PATH: ["/a\\0"]  # <-\n'),
        "path_prepend.PATH[0]",
        "PATH: entry '/a\\x00' contains a NUL character",
    ),
    "path-prepend-entry-once": (
        rig(GPUS.strip(), tail="path_prepend:\n  PATH: [/a, /b, /a]  # <-\n"),
        "path_prepend.PATH[2]",
        "PATH: entry '/a' is listed twice",
    ),
    "path-prepend-not-a-derived-variable": (
        rig(GPUS.strip(), tail="path_prepend:\n  OMP_NUM_THREADS: [/a]  # <-\n"),
        "path_prepend.OMP_NUM_THREADS",
        "OMP_NUM_THREADS is written by the tool, not a search path: path_prepend is for variables such as "
        "PATH and LD_LIBRARY_PATH",
    ),
    "env-or-path-prepend-in-the-fleet": (
        rig(GPUS.strip(), tail="env: {PATH: /opt/bin}\npath_prepend:\n  PATH: [/usr/local/cuda/bin]  # <-\n"),
        "path_prepend.PATH",
        "PATH is set by env and prepended to by path_prepend: a variable is either a value (env) or "
        "entries put in front of its current value (path_prepend), not both",
    ),
    "env-or-path-prepend-rig-over-fleet": (
        rig(GPUS.strip(), "path_prepend: {PATH: [/cuda/bin]}  # <-", tail="env: {PATH: /opt/bin}\n"),
        "rigs.pair.path_prepend.PATH",
        "PATH is set by env and prepended to by rigs.pair.path_prepend",
    ),
    "env-or-path-prepend-rig-env": (
        rig(
            GPUS.strip(),
            "env: {LD_LIBRARY_PATH: /lib}  # <-",
            tail="path_prepend: {LD_LIBRARY_PATH: [/a]}\n",
        ),
        "rigs.pair.env.LD_LIBRARY_PATH",
        "LD_LIBRARY_PATH is set by rigs.pair.env and prepended to by path_prepend",
    ),
    "env-not-bash-read-only": (
        rig(GPUS.strip(), tail='env:\n  UID: "1000"  # <-\n'),
        "env.UID",
        "UID is read-only in bash: the profile.d script cannot set it, and the launcher would stop where "
        "/bin/sh is bash",
    ),
    "path-prepend-not-bash-read-only": (
        rig(GPUS.strip(), "path_prepend: {SHELLOPTS: [/a]}  # <-"),
        "rigs.pair.path_prepend.SHELLOPTS",
        "SHELLOPTS is read-only in bash",
    ),
    "env-not-managed-name": (
        rig(GPUS.strip(), tail='env:\n  CUDA_VISIBLE_DEVICES: "0"  # <-\n'),
        "env.CUDA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES is written by the tool from visible_devices; set it there",
    ),
    "topology-file-exists": (
        rig(GPUS.strip(), "bridge: {kind: nvlink-bridge, links: 4, topology_file: missing.txt}  # <-"),
        "rigs.pair.bridge.topology_file",
        "cannot read topology file",
    ),
    "topology-file-parses": (
        rig(GPUS.strip(), "bridge: {kind: nvlink-bridge, links: 4, topology_file: rig.yaml}  # <-"),
        "rigs.pair.bridge.topology_file",
        "is not `nvidia-smi topo -m` output",
    ),
    "topology-file-gpu-count": (
        rig(
            'gpus: {model: "NVIDIA GeForce RTX 3090", count: 4}',
            "bridge: {kind: nvlink-bridge, links: 4, topology_file: topo.txt}  # <-",
        ),
        "rigs.pair.bridge.topology_file",
        "topo.txt shows 2 GPU(s) but gpus.count is 4",
    ),
    "reclaim-patterns-need-their-policy": (
        rig(GPUS.strip(), tail='reclaim: {policy: orphans, patterns: ["leak"]}  # <-\n'),
        "reclaim.patterns",
        "patterns are only used with policy orphans+patterns, but the policy is orphans",
    ),
    "reclaim-patterns-policy-needs-patterns": (
        rig(GPUS.strip(), tail="reclaim: {policy: orphans+patterns}  # <-\n"),
        "reclaim.patterns",
        "policy orphans+patterns needs `patterns` (command-line regexes)",
    ),
    "inventory-needs-rig-groups": (
        rig(GPUS.strip(), tail="inventory: hosts.ini  # <-\n"),
        "inventory",
        "an inventory needs `rig_groups`: map its groups to rig types",
    ),
    "rig-groups-need-an-inventory": (
        rig(GPUS.strip(), tail="rig_groups:  # <-\n  gpu_3090: pair\n"),
        "rig_groups",
        "rig_groups maps groups of an Ansible inventory: name it in `inventory:`",
    ),
    "rig-groups-rig-exists": (
        rig(GPUS.strip(), tail="inventory: hosts.ini\nrig_groups:\n  gpu_h100: h100  # <-\n"),
        "rig_groups.gpu_h100",
        "rig 'h100' is not defined under `rigs` (defined: pair)",
    ),
    "slurm-type-matches-nvml": (
        rig(GPUS.strip(), "slurm: {gres_type: rtx3090}  # <-"),
        "rigs.pair.slurm.gres_type",
        "GRES type 'rtx3090' is not part of 'nvidia_geforce_rtx_3090' (the NVML name lower-cased with "
        "underscores): Slurm's AutoDetect=nvml would not match it; use a substring such as 'rtx_3090'",
    ),
    "slurm-health-check-has-node-check": (
        rig(GPUS.strip(), "slurm: {health_check: /usr/local/bin/mgpu-provision-check}  # <-"),
        "rigs.pair.slurm.health_check",
        "health_check runs the node check, which apply installs only with a `node_check` section",
    ),
    "ssh-files-absolute": (
        rig(GPUS.strip(), tail="files:\n  launcher: bin/mgpu-torchrun  # <-\n"),
        "files.launcher",
        "'bin/mgpu-torchrun' must be an absolute path (start with /): it is a path on ssh hosts "
        "such as gpu-a",
    ),
    "identity-files-exist": (
        "version: 1\nhosts:\n  - {name: gpu-a, rig: pair, identity_file: keys/id_gone}  # <-\n"
        "rigs:\n  pair:\n" + GPUS,
        "hosts[0].identity_file",
        "keys/id_gone does not exist",
    ),
    "addresses-are-addresses": (
        "version: 1\nhosts:\n  - {name: gpu-a, rig: pair, address: 10.0.0.300}  # <-\nrigs:\n  pair:\n"
        + GPUS,
        "hosts[0].address",
        "'10.0.0.300' is not an IPv4 address (four numbers 0 to 255)",
    ),
    "local-twins-exist": (
        "version: 1\nhosts:\n  - {name: gpu-a, rig: pair, connection: local, simulate: twin.yaml}  # <-\n"
        "rigs:\n  pair:\n" + GPUS,
        "hosts[0].simulate",
        "twin.yaml does not exist",
    ),
    "local-hosts-apart": (
        "version: 1\nhosts:\n  - {name: gpu-a, rig: pair, connection: local, simulate: a.yaml}\n"
        "  - {name: gpu-b, rig: pair, connection: local, simulate: b.yaml}  # <-\nrigs:\n  pair:\n" + GPUS,
        "hosts[1].connection",
        "'gpu-b' and 'gpu-a' are simulated on this machine (connection: local) and would write the same "
        "managed files",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule(tmp_path: Path, name: str) -> None:
    text, field, message = CASES[name]
    shutil.copy(RIGS / "topo-2x-rtx3090.txt", tmp_path / "topo.txt")
    problems = problems_of(tmp_path, text)
    matching = [p for p in problems if p.field == field and message in p.message]
    assert matching, f"no problem at {field} with {message!r}; got {problems}"
    assert matching[0].line == marked_line(text)
    assert matching[0].file.endswith("rig.yaml")


def test_a_rig_drops_the_fleets_prepend_with_an_empty_list_and_sets_the_variable_itself(
    tmp_path: Path,
) -> None:
    text = rig(
        GPUS.strip(),
        "env: {LD_LIBRARY_PATH: /opt/lib}",
        "path_prepend: {LD_LIBRARY_PATH: []}",
        tail="path_prepend: {LD_LIBRARY_PATH: [/usr/local/cuda/lib64]}\n",
    )
    (tmp_path / "rig.yaml").write_text(text)
    load_rig(tmp_path / "rig.yaml")  # no problem


def test_every_rule_file_reports_all_problems_at_once() -> None:
    path = RIGS / "every-rule.yaml"
    with pytest.raises(SpecError) as info:
        load_rig(path)
    found = {(p.line, p.field) for p in info.value.problems}
    assert found == {
        (5, "hosts[1].name"),
        (6, "hosts[2].rig"),
        (8, "groups.lab[1]"),
        (12, "rigs.pair.sli.mode"),  # not Off or Mosaic
        (13, "rigs.pair.visible_devices[1]"),
        (14, "rigs.pair.ddp.master"),
        (14, "rigs.pair.ddp.nproc_per_node"),
        (15, "smoke.batch_size"),
    }


def test_schema_errors_and_rule_errors_come_together(tmp_path: Path) -> None:
    text = rig(
        'gpus: {model: "NVIDIA GeForce RTX 3090", count: 2, colour: red}',
        "visible_devices: [0, 5]",
        tail="hosts_extra: 1\n",
    )
    problems = problems_of(tmp_path, text)
    fields = {p.field for p in problems}
    assert {"rigs.pair.gpus.colour", "hosts_extra"} <= fields
    # the rig failed the schema (an unknown key), but its other fields still get their rules
    assert "rigs.pair.visible_devices[1]" in fields


def test_rules_stay_quiet_about_values_that_failed_the_schema(tmp_path: Path) -> None:
    text = (
        HEAD
        + "  - {name: gpu-c, address: 10.0.0.13, rig: pair, port: 0}\nrigs:\n  pair:\n"
        + GPUS
        + "    ddp: {master: gpu-c}\n"
    )
    problems = problems_of(tmp_path, text)
    # gpu-c is declared (with a bad port): the master rule must not claim it is missing from the fleet
    assert [p.field for p in problems] == ["hosts[2].port"]


@pytest.mark.parametrize(
    ("model", "bridge", "mode", "canonical"),
    [
        ("NVIDIA GeForce RTX 3090", "nvlink-bridge", "off", "Off"),
        ("NVIDIA GeForce RTX 3090", "nvlink-bridge", "OFF", "Off"),
        ("NVIDIA GeForce RTX 3090", "nvlink-bridge", "basemosaic", "BaseMosaic"),
        ("NVIDIA GeForce RTX 3090", "none", "BaseMosaic", "BaseMosaic"),  # Base Mosaic needs no bridge
        ("NVIDIA RTX A6000", "nvlink-bridge", "mosaic", "Mosaic"),
        ("NVIDIA GeForce RTX 4090", "none", "Off", "Off"),  # no connector, and none asked for
        (
            "NVIDIA H100 80GB HBM3",
            "nvlink-bridge",
            "BaseMosaic",
            "BaseMosaic",
        ),  # models it does not know pass
    ],
)
def test_sli_modes_the_cards_accept(
    tmp_path: Path, model: str, bridge: str, mode: str, canonical: str
) -> None:
    links = ", pairs: [[0, 1]], links: 4" if bridge != "none" else ""
    path = tmp_path / "rig.yaml"
    path.write_text(
        rig(
            f'gpus: {{model: "{model}", count: 2}}',
            f"bridge: {{kind: {bridge}{links}}}",
            f"sli: {{mode: {mode}}}",
        )
    )
    sli = load_rig(path).spec.rigs["pair"].sli
    assert sli is not None and sli.mode == canonical


def test_local_host_may_use_relative_files(tmp_path: Path) -> None:
    path = tmp_path / "rig.yaml"
    path.write_text(
        "hosts: [{name: ws, rig: pair, connection: local}]\nrigs:\n  pair:\n"
        + GPUS
        + "files: {launcher: bin/run}\n"
    )
    assert load_rig(path).spec.files.launcher == "bin/run"


def test_topology_file_relative_to_rig_file_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    shutil.copy(RIGS / "topo-2x-rtx3090.txt", tmp_path / "sub" / "topo.txt")
    path = tmp_path / "sub" / "rig.yaml"
    path.write_text(rig(GPUS.strip(), "bridge: {kind: nvlink-bridge, links: 4, topology_file: topo.txt}"))
    monkeypatch.chdir(tmp_path)  # the working directory must not matter
    loaded = load_rig("sub/rig.yaml")
    assert loaded.resolve("topo.txt") == (tmp_path / "sub" / "topo.txt").resolve()


@pytest.mark.parametrize("kind", ["nvlink", "nvlink-bridge"])
def test_a_topology_file_stands_in_for_links(tmp_path: Path, kind: str) -> None:
    """The README offers `topology_file` instead of `links`: the capture's NV# cells give every pair's."""
    shutil.copy(RIGS / "topo-2x-rtx3090.txt", tmp_path / "topo.txt")
    bridge = f"bridge: {{kind: {kind}, topology_file: topo.txt}}"
    (tmp_path / "rig.yaml").write_text(rig(GPUS.strip(), bridge))
    assert load_rig(tmp_path / "rig.yaml").spec.rigs["pair"].bridge.links is None


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("public", "is a public key: name the private key (the same file without .pub)"),
        ("text", "is not a private key (no '-----BEGIN ... PRIVATE KEY-----' line)"),
        (
            "encrypted",
            "is protected by a passphrase and no SSH agent runs (SSH_AUTH_SOCK): load it with ssh-add",
        ),
    ],
)
def test_a_key_that_cannot_log_in_is_named_at_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, message: str
) -> None:
    """Issue 40 item 13: a .pub or a text file as identity_file, or an encrypted key with no agent, failed
    only at the first login, in Paramiko's words."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    secret = tmp_path / "id_ed25519"
    passphrase = "s3cret" if key == "encrypted" else ""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(secret)], check=True)
    named = {"public": "id_ed25519.pub", "text": "notes.txt", "encrypted": "id_ed25519"}[key]
    (tmp_path / "notes.txt").write_text("my keys are in the safe\n")
    text = (
        f"version: 1\nhosts:\n  - {{name: gpu-a, rig: pair, identity_file: {named}}}  # <-\nrigs:\n  pair:\n"
    )
    problems = problems_of(tmp_path, text + GPUS)
    assert [(p.field, p.line) for p in problems if message in p.message] == [("hosts[0].identity_file", 3)]
    # A key without a passphrase, with no agent: no problem.
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id_plain")], check=True
    )
    (tmp_path / "rig.yaml").write_text(text.replace(named, "id_plain") + GPUS)
    load_rig(tmp_path / "rig.yaml")  # valid
