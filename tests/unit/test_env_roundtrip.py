"""Any env value is data: a corpus of hostile and ordinary values goes from a rig file through the loader and
the renderer into both env files, and comes back byte for byte from real dash, real bash (also interactive)
sourcing the profile.d script, and from systemd's own EnvironmentFile reader
(`tests/support/systemd_envfile.py`). Each hostile value also tries to run a command that would create a
canary file; it must never appear. `path_prepend` goes the same way: the script sourced twice, into an unset,
empty or filled variable.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mgpu_provision.catalog import envpath
from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.resources import envfiles
from mgpu_provision.plan.resources.envfiles import SYSTEMD_DEFAULT_PATH, desired
from mgpu_provision.rig import LoadedRig, load_rig
from tests.support import factories
from tests.support.hosts import skip_or_fail
from tests.support.systemd_envfile import read_environment_file

SHELLS = {"dash": ["dash", "-c"], "bash": ["bash", "-c"], "bash -i": ["bash", "--norc", "-i", "-c"]}
BASE_PATH = "/usr/bin:/bin"
PREPEND = {"PATH": ["/usr/local/cuda/bin", "/opt/tools bin"], "LD_LIBRARY_PATH": ["/usr/local/cuda/lib64"]}


def corpus(canary: Path) -> list[str]:
    """Values to round-trip; those naming `canary` would create it if any reader ran them as code."""
    return [
        "plain",
        "",
        " leading and trailing spaces ",
        "\ttabs\t",
        "/usr/local/cuda/bin:$PATH",
        "${HOME} and $HOME and ${x:-default} and $((1+1))",
        f"$(touch {canary}-dollar)",
        f"`touch {canary}-backtick`",
        f'"; touch {canary}-dquote; echo "',
        f"'; touch {canary}-squote; echo '",
        f"x\ntouch {canary}-newline\n",
        f"a\\\ntouch {canary}-continued",
        "single ' and double \" quotes",
        'back\\slash \\n \\t \\$ \\` \\\\ \\"',
        "trailing backslash\\",
        "\\",
        "carriage\rreturn\r",
        "line1\nline2\n",
        "\n",
        "# not a comment",
        "value # with hash",
        "; semicolon first",
        "=starts with equals=and=more",
        "NAME=other",
        "!history !! !$ !-1",
        "* ? [a-z] ~ glob chars ~root",
        "& | < > ( ) { } ;",
        "\x1b[31mescape\x1b[0m \x01\x7f",
        "unicode: é ü 日本語 😀 \u200b \u2028 \u0085",
        "x" * 4096,
    ]


def yaml_quoted(value: str) -> str:
    """A YAML double-quoted scalar: printable ASCII as is, every other character as an escape."""
    out = []
    for char in value:
        code = ord(char)
        if char in '\\"':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        else:
            out.append(f"\\U{code:08x}" if code > 0xFFFF else f"\\u{code:04x}")
    return '"' + "".join(out) + '"'


def rig_text(values: list[str], path_prepend: dict[str, list[str]] | None = None) -> str:
    env = ", ".join(f"V{i}: {yaml_quoted(value)}" for i, value in enumerate(values))
    return (
        "version: 1\n"
        "hosts:\n  - {name: gpu-a, address: 10.0.0.11, rig: pair}\n"
        'rigs:\n  pair:\n    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}\n'
        "    ddp: {master: gpu-a, port: 29511, backend: gloo}\n"
        f"env: {{{env}}}\n"
        f"path_prepend: {json.dumps(path_prepend or {})}\n"
    )


def load(tmp_path: Path, text: str) -> LoadedRig:
    path = tmp_path / "rig.yaml"
    path.write_text(text, encoding="utf-8")
    return load_rig(path)


def written(loaded: LoadedRig, tmp_path: Path) -> dict[str, Path]:
    """The rendered files, written as apply writes them (UTF-8), by file name."""
    out = {}
    for file in desired(HostContext(loaded, loaded.host("gpu-a"), factories.facts())):
        path = tmp_path / Path(file.path).name
        path.write_bytes(file.content.encode())
        out[path.name] = path
    return out


def sourced(
    shell: str, script: Path, times: int = 1, env: dict[str, str] | None = None, pre: str = ""
) -> dict:
    """The environment after `shell` sources `script` `times` times, read as NUL-separated bytes."""
    program, *options = SHELLS[shell]
    found = shutil.which(program)
    if found is None:
        skip_or_fail(f"{program} is not installed", "a shell the env files must be read by is missing")
    # env by its full path: PATH may be empty or changed by the script
    command = pre + '. "$1"; ' * times + f"{shutil.which('env')} -0"
    out = subprocess.run(
        [found, *options, command, "sh", str(script)],
        capture_output=True,
        check=True,
        env={"PATH": BASE_PATH} if env is None else env,
        cwd=script.parent,
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


@pytest.mark.parametrize("shell", SHELLS)
def test_every_value_reads_back_exactly_from_the_profile_script(shell: str, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    values = corpus(canary)
    files = written(load(tmp_path, rig_text(values)), tmp_path)
    got = sourced(shell, files["mgpu-provision.sh"])
    assert {f"V{i}": got.get(f"V{i}") for i in range(len(values))} == {
        f"V{i}": value for i, value in enumerate(values)
    }
    assert not list(tmp_path.glob("canary*")), "a value ran as a command"


def test_every_value_reads_back_exactly_from_the_environment_file_as_systemd_reads_it(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    values = corpus(canary)
    files = written(load(tmp_path, rig_text(values)), tmp_path)
    got = read_environment_file(files["environment"])
    assert {f"V{i}": got.get(f"V{i}") for i in range(len(values))} == {
        f"V{i}": value for i, value in enumerate(values)
    }
    assert got["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # the derived variables around them are intact
    assert not list(tmp_path.glob("canary*"))


def test_the_launcher_with_its_exports_inline_reads_back_every_value(tmp_path: Path) -> None:
    # files.profile_d: null: the launcher carries the exports itself and runs them under `set -eu`
    canary = tmp_path / "canary"
    values = corpus(canary)
    text = rig_text(values, PREPEND) + "files: {profile_d: null}\n"
    launcher = written(load(tmp_path, text), tmp_path)["mgpu-torchrun"]
    script = launcher.read_bytes().decode().split("\nexec ", 1)[0] + "\nenv -0\n"
    out = subprocess.run(["dash", "-c", script], capture_output=True, check=True, env={"PATH": BASE_PATH})
    got = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    assert [got.get(f"V{i}") for i in range(len(values))] == values
    # its prepends too, under `set -u` with LD_LIBRARY_PATH unset
    assert got["PATH"] == f"/usr/local/cuda/bin:/opt/tools bin:{BASE_PATH}"
    assert got["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert not list(tmp_path.glob("canary*"))


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"PATH": BASE_PATH}, {"PATH": f"/usr/local/cuda/bin:/opt/tools bin:{BASE_PATH}"}),
        ({"PATH": ""}, {"PATH": "/usr/local/cuda/bin:/opt/tools bin"}),  # no empty element: no "current dir"
        (  # an entry already present stays where it is and is not added again
            {"PATH": "/bin:/usr/local/cuda/bin"},
            {"PATH": "/opt/tools bin:/bin:/usr/local/cuda/bin"},
        ),
    ],
)
def test_path_prepend_sourced_twice_holds_each_entry_once(
    shell: str, before: dict[str, str], after: dict[str, str], tmp_path: Path
) -> None:
    profile = written(load(tmp_path, rig_text([], PREPEND)), tmp_path)["mgpu-provision.sh"]
    got = sourced(shell, profile, times=2, env={**before}, pre="set -u; ")
    assert got["PATH"] == after["PATH"]
    assert got["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"  # was unset: the entry alone, no ':'


@pytest.mark.parametrize(
    "current", [None, "", "/bin", "/usr/local/cuda/bin:/bin", "/bin:/usr/local/cuda/bin", "/a::/b", "/b:"]
)
def test_the_shell_prepend_is_the_rule_the_node_and_systemd_file_use(
    current: str | None, tmp_path: Path
) -> None:
    entries = ["/usr/local/cuda/bin", "/opt/$x `y`", "/b"]
    script = tmp_path / "p.sh"
    script.write_text("\n".join(envfiles.sh_prepend("SEARCH", entries)) + "\n")
    env = {"PATH": BASE_PATH} if current is None else {"PATH": BASE_PATH, "SEARCH": current}
    got = sourced("dash", script, times=2, env=env, pre="set -u; ")
    assert got["SEARCH"] == envpath.prepend(current, entries)


def test_the_environment_file_puts_the_entries_before_systemds_default_path(tmp_path: Path) -> None:
    files = written(load(tmp_path, rig_text([], PREPEND)), tmp_path)
    got = read_environment_file(files["environment"])
    assert got["PATH"] == "/usr/local/cuda/bin:/opt/tools bin:" + SYSTEMD_DEFAULT_PATH
    assert got["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"


def test_a_rigs_list_replaces_the_fleets_list_for_that_variable(tmp_path: Path) -> None:
    text = rig_text([], {"PATH": ["/fleet/bin"], "LD_LIBRARY_PATH": ["/fleet/lib"]}).replace(
        "    ddp:", "    path_prepend: {PATH: [/rig/bin], LD_LIBRARY_PATH: []}\n    ddp:"
    )
    loaded = load(tmp_path, text)
    assert envfiles.path_prepends(loaded, loaded.rig_of(loaded.host("gpu-a"))) == [("PATH", ["/rig/bin"])]
