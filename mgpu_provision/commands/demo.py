"""`mgpu-provision demo`: the whole tool on a built-in rig that needs no root, no SSH and no GPU.

A newcomer has no fleet. The demo writes a rig file for one simulated 2x RTX 3090 NVLink workstation
reached over a local connection (its managed files live in a sandbox folder), then runs the real commands on
it in order: validate, plan (drift), apply, plan again (converged) and a Gloo DDP smoke test on the CPU
(left out, with how to add it, when the python has no torch: the other steps need none).
Nothing here is special-cased for the demo: it drives the same CLI a user would.
"""

from __future__ import annotations

import argparse
import socket
import sys
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from ..errors import ProvisionError
from ..jobs.rehearse import has_torch
from ..rig.models import schema_comment
from . import paths
from .output import shown

DEMO_TWIN = "twin-rtx3090-nvlink.yaml"
# PyTorch's index of CPU-only wheels (pytorch.org, "Get started"): ~190 MB instead of the CUDA build's GBs.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The torch README and pyproject's `demo` extra pin (tests/unit/test_demo.py keeps the three equal).
TORCH = "torch==2.13.0"

RIG_TEMPLATE = """\
{schema_line}
# The built-in demo rig: one simulated 2x RTX 3090 NVLink workstation, reached without SSH.
# Only its NVIDIA layer is simulated (from {twin}); files, processes and torch are real.
version: 1
hosts:
  - name: demo-3090
    address: 127.0.0.1
    rig: rtx3090-pair
    connection: local
    simulate: {sandbox}/{twin}
rigs:
  rtx3090-pair:
    gpus: {{model: "NVIDIA GeForce RTX 3090", count: 2, persistence_mode: true}}
    bridge: {{kind: nvlink-bridge, pairs: [[0, 1]], links: 4}}
    driver: {{version: "550.54.15", method: apt, hold: true, reboot: never}}
    sli: {{mode: "Off"}}
    visible_devices: [0, 1]
    ddp: {{master: demo-3090, port: {port}, backend: gloo, nproc_per_node: 2, ifname: lo}}
env:
  OMP_NUM_THREADS: "1"
files:
  # Managed paths live in the sandbox so the demo needs no root; on a real fleet keep the defaults.
  profile_d: {sandbox}/root/etc/profile.d/mgpu-provision.sh
  environment_file: {sandbox}/root/etc/mgpu-provision/environment
  launcher: {sandbox}/root/usr/local/bin/mgpu-torchrun
  xorg_conf: {sandbox}/root/etc/X11/xorg.conf.d/20-mgpu-provision.conf
  state_dir: {sandbox}/root/var/lib/mgpu-provision
  systemd_dir: {sandbox}/root/etc/systemd/system
smoke: {{{smoke_python}timeout_s: 120, batch_size: 8}}
"""

# (title, argv after the rig path, the exit code that means the step went as it should)
STEPS: tuple[tuple[str, list[str], int], ...] = (
    ("validate: the rig file is well formed", ["validate"], 0),
    ("plan: what differs on the box (drift expected: exit 2)", ["plan"], 2),
    ("apply: converge it", ["apply", "--yes"], 0),
    ("plan again: nothing left to change", ["plan"], 0),
    ("smoke: a real DDP run (Gloo on the CPU)", ["smoke"], 0),
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_demo(sandbox: Path, python: str | None) -> Path:
    """Write the demo rig and twin into `sandbox`; return the rig file's path. `python` is the smoke's;
    None (no torch) leaves it out, and with it plan's torch check, which would fail on every run."""
    sandbox = sandbox.resolve()
    if any(ch.isspace() for ch in str(sandbox)):
        raise ProvisionError(f"the demo folder {sandbox} contains spaces; choose another with --dir")
    try:
        sandbox.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. under /proc, which no one can write
        raise ProvisionError(f"--dir {sandbox}: cannot make the demo folder ({exc.strerror})") from exc
    twin = resources.files("mgpu_provision.demo").joinpath(DEMO_TWIN).read_text(encoding="utf-8")
    (sandbox / DEMO_TWIN).write_text(twin, encoding="utf-8")
    rig = sandbox / "demo-rig.yaml"
    rig.write_text(
        RIG_TEMPLATE.format(
            schema_line=schema_comment(sandbox),
            twin=DEMO_TWIN,
            sandbox=sandbox,
            port=free_port(),
            smoke_python=f"python: {python}, " if python else "",
        ),
        encoding="utf-8",
    )
    return rig


def smoke_hint(python: str) -> str:
    return (
        f"{python} has no torch, so the demo leaves out its smoke test (a real DDP run). To add it, install "
        f"the CPU build (about 190 MB): {python} -m pip install {TORCH} --index-url {CPU_INDEX} "
        "and run mgpu-provision demo again"
    )


def run(args: argparse.Namespace) -> int:
    main = args.cli  # the demo drives the real CLI step by step: cli.main hands itself over
    # Rules stay 80 wide in a log; the sentences are never wrapped off a terminal (a command in them must
    # stay one line to copy).
    console = Console(soft_wrap=not sys.stdout.isatty())
    python = args.python or sys.executable
    steps = STEPS if has_torch(python) else STEPS[:-1]  # validate, plan and apply need no torch
    rig = write_demo(args.dir, python if steps == STEPS else None)
    console.print(shown("Demo rig written to ", (str(rig), "bold")))  # --dir may hold brackets
    if steps != STEPS:
        console.print(shown(("note:", "yellow"), f" {smoke_hint(python)}"))
    for title, argv, expected in steps:
        console.print(Rule(title))
        code = main([argv[0], str(rig), *argv[1:]])
        if code != expected:
            console.print(f"[red]demo stopped: `{argv[0]}` exited {code}, expected {expected}[/red]")
            return 1
    console.print(Rule())
    console.print(shown(("Demo done.", "green"), f" The files apply wrote are under {rig.parent / 'root'}."))
    if steps != STEPS:
        console.print(shown(("smoke skipped:", "yellow"), f" {smoke_hint(python)}"))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help="run validate, plan, apply, plan and smoke on a built-in simulated rig",
        description=(
            "Try the tool on a built-in simulated box: no GPU, no SSH, no root needed.\n\n"
            "Writes a rig file for one simulated 2x RTX 3090 NVLink workstation reached without SSH\n"
            "(its managed files go to the sandbox folder), then runs validate, plan, apply, plan again\n"
            "and a real DDP smoke test (Gloo on the CPU) on it. Only the NVIDIA layer is simulated.\n"
            "Without torch it runs all but the smoke test and says how to add it."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  mgpu-provision demo\n  mgpu-provision demo --dir /tmp/mgpu-demo",
    )
    parser.add_argument(
        "--dir", type=paths.work_folder, default="mgpu-demo", help="sandbox folder (default ./mgpu-demo)"
    )
    parser.add_argument(
        "--python", type=paths.program, help="python with torch for the smoke test (default: this one)"
    )
    parser.set_defaults(func=run)
