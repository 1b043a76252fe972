"""The README's first command ends in `mgpu-provision demo`: it must converge the demo box and pass smoke.

Run as a separate process, exactly as a newcomer runs it, with a clean HOME (no known_hosts, no ssh config).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_provision.commands.demo import write_demo
from mgpu_provision.rig import load_rig

CLI = [sys.executable, "-m", "mgpu_provision"]


@pytest.mark.torch
def test_demo_runs_plan_apply_plan_smoke(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "COLUMNS": "120"}
    done = subprocess.run(
        [*CLI, "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for line in (
        "Plan: 4 to change, on 1 of 1 host",  # SLI Off: no X config snippet to write
        "No changes. 1 host matches the rig file.",
        "Smoke pass: world size 2 of 2",
        "Demo done",
    ):
        assert line in out
    launcher = tmp_path / "demo" / "root" / "usr" / "local" / "bin" / "mgpu-torchrun"
    assert os.access(launcher, os.X_OK)
    profile = (tmp_path / "demo" / "root" / "etc" / "profile.d" / "mgpu-provision.sh").read_text()
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in profile
    assert "Traceback" not in done.stderr
    assert_readable_on_one_screen(done.stdout, done.stderr)
    shown = {like_the_readme(line, tmp_path / "demo") for line in out.splitlines()}
    missing = [line for line in readme_demo_sample() if like_the_readme(line) not in shown]
    assert not missing, "README's demo sample has lines the demo does not print:\n" + "\n".join(missing)


def readme_demo_sample() -> list[str]:
    """The lines of README's sample of the demo's output (issue 40 item 16) but its `…` (what it omits)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    sample = readme.split("The demo runs the same commands", 1)[1].split("```", 2)[1]
    return [line for line in sample.splitlines()[1:] if line.strip() not in ("", "…")]


def like_the_readme(line: str, folder: Path | None = None) -> str:
    """A line as README shows it: the demo folder as `…`, figures (times, ports, bandwidth) as `#` and the
    blanks that align them as one, a rule by its title alone (its width is the terminal's)."""
    if folder is not None:
        line = line.replace(str(folder), "…")
    line = re.sub(r"\d+(\.\d+)?", "#", line.strip("─ "))
    return re.sub(r"━+", "━", re.sub(r" +", " ", line)).rstrip()


# What a person sees on a terminal (stdout and stderr together) must fit a screen.
MAX_DEMO_LINES = 60


def assert_readable_on_one_screen(out: str, err: str) -> None:
    lines = out.splitlines() + err.splitlines()
    assert len(lines) <= MAX_DEMO_LINES, f"the demo printed {len(lines)} lines:\n" + "\n".join(lines)
    sections = out.split("──── apply")
    assert len(sections) == 2, out
    plan_part, apply_part = sections[0], sections[1].split("RECAP")[0]

    def changes(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line.startswith(("  + ", "  ~ "))]

    assert changes(plan_part) and changes(plan_part) == changes(apply_part), "plan and apply differ in order"
    for line in changes(plan_part):
        if line.startswith("+ file:"):
            path = line.split(":")[1]
            assert line.count(path) == 1, f"the path is named twice: {line}"
    for clumsy in ("1 nodes", "→ on on GPU"):
        assert clumsy not in out


def test_demo_rig_is_valid_and_needs_no_ssh(tmp_path: Path) -> None:
    loaded = load_rig(write_demo(tmp_path, sys.executable))
    (host,) = loaded.spec.hosts
    assert host.connection == "local" and host.simulate
    assert all(str(p).startswith(str(tmp_path)) for p in loaded.spec.files.model_dump().values() if p)


def test_demo_refuses_a_folder_with_spaces(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "demo", "--dir", str(tmp_path / "my demo")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "contains spaces; choose another with --dir" in done.stderr


def test_demo_without_torch_runs_validate_plan_apply_and_says_how_to_add_smoke(tmp_path: Path) -> None:
    bare = tmp_path / "python"  # this interpreter without site-packages: no torch
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    done = subprocess.run(
        [*CLI, "demo", "--dir", str(tmp_path / "demo"), "--python", str(bare)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = ("Plan: 4 to change, on 1 of 1 host", "No changes. 1 host matches the rig file.", "Demo done")
    for line in steps:
        assert line in done.stdout
    assert "smoke: a real DDP run" not in done.stdout
    hint = (
        f"smoke skipped: {bare} has no torch, so the demo leaves out its smoke test (a real DDP run). To add "
        f"it, install the CPU build (about 190 MB): {bare} -m pip install torch==2.13.0 --index-url "
        "https://download.pytorch.org/whl/cpu"
    )
    assert hint in done.stdout


def test_the_readmes_first_command_needs_no_torch() -> None:
    """Where PyTorch's index is unreachable, a first command with torch took 9 minutes and 2.75 GB."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    first = readme.split("```sh\n", 1)[1].split("\n", 1)[0]
    assert first == "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/mgpu-provision demo"


def test_a_rehearsal_against_an_example_twin_writes_nothing_into_the_checkout(tmp_path: Path) -> None:
    """Issue 37 item 11: the twin's overlay goes to the node's state folder, not `<twin>.state.json` beside
    a twin of the checkout (examples/twins/), where it was an untracked file after every apply."""
    twins = Path(__file__).resolve().parents[2] / "examples" / "twins"
    before = sorted(twins.iterdir())
    rig = write_demo(tmp_path / "demo", None)
    text = rig.read_text()
    demo_twin = f"{tmp_path / 'demo'}/twin-rtx3090-nvlink.yaml"
    rig.write_text(text.replace(demo_twin, str(twins / "rtx3090-nvlink.yaml")))
    env = {**os.environ, "HOME": str(tmp_path)}
    for argv, code in ((["apply", "--yes"], 0), (["plan"], 0)):
        done = subprocess.run([*CLI, argv[0], str(rig), *argv[1:]], capture_output=True, text=True, env=env)
        assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(twins.iterdir()) == before
    (state,) = (tmp_path / "demo" / "root" / "var" / "lib" / "mgpu-provision" / "twin-state").iterdir()
    assert state.name.startswith("rtx3090-nvlink-") and "nvidia-persistenced" in state.read_text()


def test_the_demos_torch_hint_pins_the_version_readme_and_pyproject_pin() -> None:
    """Issue 40 item 16: the hint said `pip install torch`, README `torch==2.13.0`."""
    from mgpu_provision.commands.demo import TORCH

    root = Path(__file__).resolve().parents[2]
    assert f"pip install {TORCH} --index-url" in (root / "README.md").read_text()
    assert f'demo = ["{TORCH}"]' in (root / "pyproject.toml").read_text()
