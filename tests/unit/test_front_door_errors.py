"""Issue 40 items 4-6: mistakes and interruptions a newcomer makes are one plain line, never a traceback.

4. an ~/.ssh/config line Paramiko cannot parse (`ProxyJump` with no value), or a number that is not one
   (`Port abc`, `ConnectTimeout abc`): the file, the line and why;
5. Ctrl-D at apply's confirmation prompt: answered as `no`;
6. Ctrl-C while the CLI's modules load: exit 130, no traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from mgpu_provision.commands import apply as apply_command
from mgpu_provision.fleet.options import ssh_config_problem

CLI = [sys.executable, "-m", "mgpu_provision"]
REPO = Path(__file__).resolve().parents[2]
RIG = """\
version: 1
hosts: [{name: gpu-a, address: 127.0.0.1, rig: r}]
rigs: {r: {gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}}}
"""


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("  ProxyJump", "ProxyJump has no value"),
        ("  Port abc", "Port 'abc' is not a whole number"),
        ("  ConnectTimeout abc", "ConnectTimeout 'abc' is not a whole number"),
    ],
)
def test_a_bad_ssh_config_line_is_named_with_its_file_and_line(tmp_path: Path, line: str, why: str) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(f"# mine\nHost *\n{line}\n")
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG)
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([*CLI, "plan", str(rig)], capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert f"{tmp_path / '.ssh' / 'config'}, line 3: {why}" in done.stdout + done.stderr
    assert done.returncode == 2  # the host is unreachable, named with the reason


def test_a_good_ssh_config_has_no_problem() -> None:
    assert ssh_config_problem(["Host gpu-*", "  Port 2222", "  ProxyJump bastion", "", "# c"]) is None


def test_ctrl_d_at_the_confirmation_is_no(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    console = Console(force_terminal=False)

    def end_of_input(*_: object, **__: object) -> str:
        raise EOFError

    monkeypatch.setattr(console, "input", end_of_input)
    with pytest.raises(apply_command.NotConfirmed, match="apply cancelled: nothing was changed"):
        apply_command.confirm(False, 2, console)


# Interrupted once the import of each module has finished (`-X importtime` reports each as it ends): inside
# the CLI's own import, in a command module's import (pydantic, the models), and in argument parsing.
@pytest.mark.parametrize("after", ["mgpu_provision.entry", "mgpu_provision.errors", "pydantic"])
def test_ctrl_c_while_the_cli_loads_is_one_line_and_130(tmp_path: Path, after: str) -> None:
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG)
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "mgpu_provision", "validate", str(rig)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert process.stderr is not None
    for line in process.stderr:
        if line.split("|")[-1].strip() == after:
            process.send_signal(signal.SIGINT)
            break
    else:
        pytest.fail(f"the CLI never imported {after}")
    _out, rest = process.communicate(timeout=60)
    err = "".join(line for line in rest.splitlines(keepends=True) if not line.startswith("import time:"))
    assert "Traceback" not in err, err
    assert process.returncode in (0, 130), (process.returncode, err)  # 0: it had finished before the signal
    if process.returncode == 130:
        assert err.strip().splitlines()[-1] == "interrupted", err


def test_verbose_logs_one_line_per_ssh_step_for_a_host_without_a_banner(tmp_path: Path) -> None:
    """Item 7: `-v` against a box whose sshd never sends its banner printed Paramiko's own traceback."""
    from tests.support.hosts import SilentServer, loopback_address

    address = loopback_address()
    rig = tmp_path / "rig.yaml"
    rig.write_text(RIG.replace("address: 127.0.0.1", f"address: {address}, port: 2222"))
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    with SilentServer(address):
        done = subprocess.run(
            [*CLI, "plan", str(rig), "-v", "--timeout", "1", "--known-hosts", str(tmp_path / "kh")],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "\n  File " not in done.stderr, done.stderr
    assert "gpu-a: connecting" in done.stderr  # the steps are still logged, one line each


def test_schema_and_init_take_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 9: README says every command has --json; schema and init had none (slurm-conf ignored it)."""
    import json

    from mgpu_provision import cli

    assert cli.main(["schema", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["exit_code"] == 0 and document["schema"]["title"] == "mgpu-provision rig file"
    twin = REPO / "examples" / "twins" / "rtx3090-nvlink.yaml"
    output = tmp_path / "rig.yaml"
    argv = ["init", "--connection", "local", "--simulate", str(twin), "--output", str(output), "--json"]
    assert cli.main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    (host,) = document["hosts"].values()
    assert (document["rig"], host["gpus"], host["simulated"]) == (str(output), 2, True)


def test_plan_into_head_exits_as_the_exit_code_table_says(tmp_path: Path) -> None:
    """Item 12: `plan … | head` exited 1 with nothing on stderr (rich's broken-pipe exit), not 2 for drift."""
    from mgpu_provision.commands.demo import write_demo

    rig = write_demo(tmp_path / "demo", None)
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    script = f'{sys.executable} -m mgpu_provision plan {rig} --diff | head -1; exit "${{PIPESTATUS[0]}}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (2, "demo-3090\n", "")


def test_drain_slurm_without_a_slurm_section_is_refused_before_any_host_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 10: refused at once (as smoke --via srun is), not after running scontrol on every node."""
    from mgpu_provision import cli
    from mgpu_provision.commands.demo import write_demo

    rig = write_demo(tmp_path / "demo", None)
    assert cli.main(["apply", str(rig), "--drain", "slurm", "--yes"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --drain slurm needs a `slurm` section in the rig of demo-3090"), err
    assert not (tmp_path / "demo" / "root").exists()  # nothing was applied, no agent was asked


def test_the_ssh_keyscan_advice_works_on_a_clean_home(tmp_path: Path) -> None:
    """Item 16: `ssh-keyscan ... >> ~/.ssh/known_hosts` fails in the shell where ~/.ssh does not exist."""
    import paramiko

    from mgpu_provision.fleet.ssh import UnknownHostKey, _RejectUnknown

    known = tmp_path / "home" / ".ssh" / "known_hosts"
    key = paramiko.RSAKey.generate(1024)
    with pytest.raises(UnknownHostKey) as refused:
        _RejectUnknown("gpu-a", known).missing_host_key(None, "[127.0.0.1]:2222", key)  # type: ignore[arg-type]
    advice = str(refused.value).rsplit("add it with ", 1)[1].strip("`")
    assert advice == f"mkdir -p -m 700 {known.parent} && ssh-keyscan -p 2222 127.0.0.1 >> {known}"
    done = subprocess.run(["bash", "-c", advice.replace("ssh-keyscan -p 2222 127.0.0.1", "echo key")])
    assert done.returncode == 0 and known.read_text() == "key\n"
