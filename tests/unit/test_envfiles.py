"""Env files, the mgpu-torchrun launcher and the X config: rendered from a real rig file, then read back by
the programs that consume them (sh sources the profile script, the launcher runs with a stand-in python)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mgpu_provision.facts import Facts, ManagedFile
from mgpu_provision.plan import files as toolkit
from mgpu_provision.plan.change import HostContext
from mgpu_provision.plan.files import DesiredFile, EnvFileError, diff_file, diff_files
from mgpu_provision.plan.host import desired_files as registry_files
from mgpu_provision.plan.resources import envfiles, gloo
from mgpu_provision.rig import LoadedRig, load_rig
from mgpu_provision.rig.models import Host
from mgpu_provision.rig.rules import DERIVED_ENV
from tests.support import factories

RIG = """\
version: 1
hosts:
  - {name: gpu-a, address: 10.0.0.11, rig: pair}
  - {name: gpu-b, address: 10.0.0.12, rig: pair}
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
    bridge: {kind: nvlink-bridge, pairs: [[0, 1]], links: 4}
    sli: {mode: BaseMosaic}
    visible_devices: [1, 0]
    ddp: {master: gpu-a, port: 29511, backend: gloo, nproc_per_node: 2, ifname: "=eth0"}
    env: {NCCL_DEBUG: WARN, NCCL_IB_DISABLE: "0"}
env: {NCCL_IB_DISABLE: "1", GLOO_NOTE: "two words"}
smoke: {python: /opt/venv/bin/python}
"""


def load(tmp_path: Path, text: str = RIG, **replace: str) -> LoadedRig:
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "rig.yaml"
    path.write_text(text)
    return load_rig(path)


def desired_files(loaded: LoadedRig, host: Host, facts: Facts) -> list[DesiredFile]:
    """Every file the plan's registry has apply write on `host`: here the env files, launcher, X config."""
    return registry_files(HostContext(loaded, host, facts))


def files_of(loaded: LoadedRig, host: str = "gpu-b") -> dict[str, DesiredFile]:
    return {Path(f.path).name: f for f in desired_files(loaded, loaded.host(host), facts_with())}


def sourced_env(script: str, tmp_path: Path, prefix: str = "") -> dict[str, str]:
    path = tmp_path / "env.sh"
    path.write_text(script)
    out = subprocess.run(
        ["sh", "-c", f'{prefix} . "$1" && env -0', "sh", str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    ).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def test_every_file_is_listed_with_mode_and_tag(tmp_path: Path) -> None:
    files = desired_files(load(tmp_path), load(tmp_path).host("gpu-b"), facts_with())
    assert [(f.path, f.mode, f.phase) for f in files] == [
        ("/etc/profile.d/mgpu-provision.sh", "0644", "env"),
        ("/etc/mgpu-provision/environment", "0644", "env"),
        ("/usr/local/bin/mgpu-torchrun", "0755", "env"),
        ("/etc/X11/xorg.conf.d/20-mgpu-provision.conf", "0644", "sli"),
    ]


def test_every_file_says_it_is_managed(tmp_path: Path) -> None:
    for f in files_of(load(tmp_path)).values():
        lines = f.content.splitlines()
        first = lines[1] if lines[0].startswith("#!") else lines[0]
        assert first.startswith("# managed by mgpu-provision, do not edit"), f.path


def test_profile_script_exports_cuda_nccl_gloo_and_the_rig_env(tmp_path: Path) -> None:
    env = sourced_env(files_of(load(tmp_path))["mgpu-provision.sh"].content, tmp_path)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "NCCL_ASYNC_ERROR_HANDLING" not in env  # the deprecated name
    assert env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"  # Gloo has no "=" (exact match) syntax
    assert env["NCCL_DEBUG"] == "WARN"
    assert env["NCCL_IB_DISABLE"] == "0"  # the rig's env wins over the fleet's
    assert env["GLOO_NOTE"] == "two words"


@pytest.mark.parametrize("job", ["", "4242"])
def test_under_slurm_the_profile_script_leaves_a_jobs_gpus_alone(tmp_path: Path, job: str) -> None:
    """A batch script `#!/bin/bash -l` sources profile.d: outside a job the rig's GPUs, inside one Slurm's."""
    loaded = load(tmp_path, **{"    env: {NCCL": "    slurm: {}\n    env: {NCCL"})
    script = files_of(loaded)["mgpu-provision.sh"]
    prefix = f"SLURM_JOB_ID={job} CUDA_VISIBLE_DEVICES=3 && export SLURM_JOB_ID CUDA_VISIBLE_DEVICES &&"
    env = sourced_env(script.content, tmp_path, prefix=prefix)
    assert env["CUDA_VISIBLE_DEVICES"] == ("3" if job else "1,0")
    assert env["NCCL_DEBUG"] == "WARN"  # everything else is set as before


def test_environment_file_sets_the_same_variables_as_the_profile_script(tmp_path: Path) -> None:
    files = files_of(load(tmp_path))
    profile = sourced_env(files["mgpu-provision.sh"].content, tmp_path)
    systemd = sourced_env(files["environment"].content, tmp_path, prefix="set -a &&")
    assert systemd == profile
    assert 'GLOO_NOTE="two words"' in files["environment"].content.splitlines()
    assert "export" not in files["environment"].content


def test_comment_maps_each_cuda_index_to_its_physical_gpu(tmp_path: Path) -> None:
    content = files_of(load(tmp_path))["mgpu-provision.sh"].content
    assert "#   cuda:0 = nvidia-smi GPU 1\n#   cuda:1 = nvidia-smi GPU 0\n" in content


def test_uuids_are_written_as_the_rig_gives_them(tmp_path: Path) -> None:
    uuid = "GPU-1aff65f8-8897-eaee-29e4-6871ef7491a0"
    loaded = load(
        tmp_path, **{"visible_devices: [1, 0]": f"visible_devices: [{uuid}]", "nproc_per_node: 2, ": ""}
    )
    content = files_of(loaded)["mgpu-provision.sh"].content
    assert f"export CUDA_VISIBLE_DEVICES={uuid}\n" in content
    assert f"#   cuda:0 = the GPU with UUID {uuid}\n" in content


def test_all_gpus_visible_without_visible_devices(tmp_path: Path) -> None:
    content = files_of(load(tmp_path, **{"visible_devices: [1, 0]": ""}))["mgpu-provision.sh"].content
    assert "CUDA_VISIBLE_DEVICES" not in content
    assert "# Every GPU is visible: cuda:N = nvidia-smi GPU N" in content


UP = [{"name": "eth0", "up": True}, {"name": "eth1", "up": False}, {"name": "lo", "up": True}]


@pytest.mark.parametrize(
    ("pattern", "up", "name"),
    [
        ("eth", ["eth0", "lo"], "eth0"),  # NCCL's prefix: the one interface starting with eth
        ("=eth0", ["eth0", "eth01"], "eth0"),
        ("eth0", ["eth0", "lo"], "eth0"),
        ("^docker,lo", ["docker0", "eth0", "lo"], "eth0"),
        ("ib,eth0:1", ["eth0", "lo"], "eth0"),  # a port suffix means nothing for a socket interface
        ("=eth", ["eth0"], None),  # exact: eth0 is not eth
        ("eth", ["eth0", "eth1"], None),  # two: Gloo would take a different one than NCCL's first
        ("^lo", ["lo"], None),
    ],
)
def test_gloo_interface_is_resolved_from_the_nccl_pattern(
    pattern: str, up: list[str], name: str | None
) -> None:
    resolved = gloo.gloo_interface(pattern, up)
    assert resolved.name == name
    assert (resolved.problem is None) == (name is not None)


def test_env_files_carry_the_resolved_gloo_name_not_the_pattern(tmp_path: Path) -> None:
    loaded = load(tmp_path, **{'ifname: "=eth0"': "ifname: eth"})
    env = dict(envfiles.environment(loaded, loaded.rig_of(loaded.host("gpu-a")), facts_with(interfaces=UP)))
    assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("eth", "eth0")  # eth1 is down
    assert envfiles.checks(HostContext(loaded, loaded.host("gpu-a"), facts_with(interfaces=UP))) == []


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("eth", "ddp.ifname 'eth' matches 2 interfaces that are up (eth0, eth1)"),
        ("ib", "ddp.ifname 'ib' matches no interface that is up (up: eth0, eth1, lo)"),
    ],
)
def test_a_pattern_matching_none_or_several_is_refused_naming_them(
    tmp_path: Path, pattern: str, why: str
) -> None:
    loaded = load(tmp_path, **{'ifname: "=eth0"': f"ifname: {pattern}"})
    box = facts_with(interfaces=[{"name": n, "up": True} for n in ("eth0", "eth1", "lo")])
    [check] = envfiles.checks(HostContext(loaded, loaded.host("gpu-a"), box))
    assert (check.resource, check.action) == ("ddp.ifname", "verify-failed")
    assert check.summary.startswith(why) and "Gloo needs exactly one interface name" in check.summary
    env = dict(envfiles.environment(loaded, loaded.rig_of(loaded.host("gpu-a")), box))
    assert "GLOO_SOCKET_IFNAME" not in env and env["NCCL_SOCKET_IFNAME"] == pattern


def test_gloo_set_in_env_is_left_to_the_rig(tmp_path: Path) -> None:
    loaded = load(tmp_path, **{'ifname: "=eth0"': "ifname: ib", "NCCL_DEBUG: WARN": "GLOO_SOCKET_IFNAME: lo"})
    rig = loaded.rig_of(loaded.host("gpu-a"))
    assert dict(envfiles.environment(loaded, rig, facts_with(interfaces=UP)))["GLOO_SOCKET_IFNAME"] == "lo"
    assert envfiles.checks(HostContext(loaded, loaded.host("gpu-a"), facts_with(interfaces=UP))) == []


def torch_facts(version: str) -> Facts:
    return facts_with(torch={"python": "/opt/venv/bin/python", "ok": True, "version": version})


@pytest.mark.parametrize(
    ("version", "name"),
    [
        ("2.13.0+cpu", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
        ("2.2.0", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
        ("2.1.2+cu121", "NCCL_ASYNC_ERROR_HANDLING"),
        ("1.13.1", "NCCL_ASYNC_ERROR_HANDLING"),
    ],
)
def test_async_error_handling_is_named_as_the_nodes_torch_reads_it(
    tmp_path: Path, version: str, name: str
) -> None:
    loaded = load(tmp_path)
    env = dict(envfiles.environment(loaded, loaded.rig_of(loaded.host("gpu-a")), torch_facts(version)))
    assert env[name] == "1"
    other = {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"} - {name}
    assert not other & set(env)  # torch >= 2.2 warns about the old name; older torch ignores the new one


def test_path_prepend_may_name_no_variable_the_tool_derives(tmp_path: Path) -> None:
    # rig/rules.py keeps its own list of derived names (rig/ cannot import plan/); it must cover them all
    loaded = load(tmp_path, **{'NCCL_DEBUG: WARN, NCCL_IB_DISABLE: "0"': ""})
    rig = loaded.rig_of(loaded.host("gpu-a"))
    names = set()
    for version in ("2.13.0", "1.13.1"):
        box = facts_with(
            torch={"python": "/opt/venv/bin/python", "ok": True, "version": version},
            cpu={"logical": 8, "cores": 4},
            interfaces=[{"name": "eth0", "up": True}],
        )
        names |= {name for name, _ in envfiles.environment(loaded, rig, box)}
    assert "GLOO_SOCKET_IFNAME" in names and "OMP_NUM_THREADS" in names
    assert names - set(loaded.spec.env) <= DERIVED_ENV


def test_launcher_spells_torchrun_flags_as_the_nodes_torch_reads_them(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG + "files: {profile_d: null}\n")
    old = {Path(f.path).name: f for f in desired_files(loaded, loaded.host("gpu-b"), torch_facts("1.13.1"))}
    args, env = run_launcher(old["mgpu-torchrun"].content, tmp_path, "train.py")
    assert args[2:6] == ["--nnodes=2", "--nproc_per_node=2", "--node_rank=1", "--master_addr=10.0.0.11"]
    assert env["NCCL_ASYNC_ERROR_HANDLING"] == "1"
    new = {Path(f.path).name: f for f in desired_files(loaded, loaded.host("gpu-b"), torch_facts("2.0.1"))}
    assert "--nproc-per-node=" in new["mgpu-torchrun"].content


@pytest.mark.parametrize(("cores", "logical", "threads"), [(32, 64, "16"), (None, 12, "6"), (1, 1, "1")])
def test_omp_threads_are_the_cores_per_local_rank(
    tmp_path: Path, cores: int | None, logical: int, threads: str
) -> None:
    loaded = load(tmp_path)  # nproc_per_node: 2
    box = facts_with(cpu={"logical": logical, "cores": cores})
    assert (
        dict(envfiles.environment(loaded, loaded.rig_of(loaded.host("gpu-a")), box))["OMP_NUM_THREADS"]
        == threads
    )


def test_omp_threads_from_the_rig_env_win_and_unknown_cores_write_none(tmp_path: Path) -> None:
    loaded = load(tmp_path, **{"NCCL_DEBUG: WARN": "OMP_NUM_THREADS: '3'"})
    rig = loaded.rig_of(loaded.host("gpu-a"))
    assert dict(envfiles.environment(loaded, rig, facts_with(cpu={"logical": 64})))["OMP_NUM_THREADS"] == "3"
    plain = load(tmp_path)
    default_rig = plain.rig_of(plain.host("gpu-a"))
    assert "OMP_NUM_THREADS" not in dict(envfiles.environment(plain, default_rig, facts_with()))


def test_explicit_env_wins_over_ifname(tmp_path: Path) -> None:
    loaded = load(tmp_path, **{"NCCL_DEBUG: WARN": "NCCL_DEBUG: WARN, NCCL_SOCKET_IFNAME: bond0"})
    env = dict(envfiles.environment(loaded, loaded.rig_of(loaded.host("gpu-a"))))
    assert env["NCCL_SOCKET_IFNAME"] == "bond0"


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    assert files_of(load(tmp_path)) == files_of(load(tmp_path))


def test_a_null_path_is_not_managed_and_the_launcher_inlines_the_env(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG + "files: {profile_d: null, environment_file: null}\n")
    files = files_of(loaded)
    assert sorted(files) == ["20-mgpu-provision.conf", "mgpu-torchrun"]
    assert "export CUDA_VISIBLE_DEVICES=1,0\n" in files["mgpu-torchrun"].content


def test_no_launcher_without_ddp_and_no_x_config_without_sli(tmp_path: Path) -> None:
    text = "\n".join(line for line in RIG.splitlines() if "ddp:" not in line and "sli:" not in line)
    assert sorted(files_of(load(tmp_path, text + "\n"))) == ["environment", "mgpu-provision.sh"]


def test_windows_hosts_get_no_linux_files(tmp_path: Path) -> None:
    loaded = load(tmp_path, **{"rig: pair}\nrigs": "rig: pair, os: windows}\nrigs"})
    assert desired_files(loaded, loaded.host("gpu-b"), facts_with()) == []


def test_relative_paths_of_local_hosts_lie_beside_the_rig_file(tmp_path: Path) -> None:
    text = RIG.replace("rig: pair}", "rig: pair, connection: local}")
    loaded = load(tmp_path, text + "files: {profile_d: out/env.sh}\n")
    assert files_of(loaded)["env.sh"].path == str(tmp_path / "out" / "env.sh")


def run_launcher(content: str, tmp_path: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """Run the launcher with its python replaced by a script that records argv and the environment."""
    record = tmp_path / "record"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}.args\nenv > {record}.env\n')
    fake.chmod(0o755)
    launcher = tmp_path / "mgpu-torchrun"
    launcher.write_text(content.replace("/opt/venv/bin/python", str(fake)))
    launcher.chmod(0o755)
    subprocess.run([str(launcher), *args], check=True, env={"PATH": os.environ["PATH"]})
    env = dict(line.split("=", 1) for line in Path(f"{record}.env").read_text().splitlines() if "=" in line)
    return Path(f"{record}.args").read_text().splitlines(), env


def test_launcher_runs_torchrun_with_this_nodes_rank(tmp_path: Path) -> None:
    loaded = load(tmp_path, RIG + f"files: {{profile_d: {tmp_path}/profile.sh}}\n")
    files = files_of(loaded)
    Path(files["profile.sh"].path).write_text(files["profile.sh"].content)
    args, env = run_launcher(files["mgpu-torchrun"].content, tmp_path, "train.py", "--epochs", "two words")
    assert args == [
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--node-rank=1",
        "--master-addr=10.0.0.11",
        "--master-port=29511",
        "--rdzv-id=mgpu-gpu-a",  # the rig file sets none: apply's default, the same in smoke
        "train.py",
        "--epochs",
        "two words",
    ]
    assert env["MGPU_DDP_BACKEND"] == "gloo"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0"  # sourced from the profile script


def test_launcher_with_c10d_rendezvous(tmp_path: Path) -> None:
    text = RIG.replace("ifname:", "rdzv_backend: c10d, rdzv_id: job7, ifname:") + "files: {profile_d: null}\n"
    loaded = load(tmp_path, text)
    args, _ = run_launcher(files_of(loaded, "gpu-a")["mgpu-torchrun"].content, tmp_path, "t.py")
    assert args[2:] == [
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.11:29511",
        "--rdzv-id=job7",
        "t.py",
    ]


def test_nproc_defaults_to_the_visible_gpus(tmp_path: Path) -> None:
    loaded = load(tmp_path, **{"visible_devices: [1, 0]": "visible_devices: [1]", "nproc_per_node: 2, ": ""})
    assert "\nnproc_per_node=1\n" in files_of(loaded)["mgpu-torchrun"].content


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("eth0", "eth0"),
        ("a b", '"a b"'),
        ('say "$x" `y` \\', '"say \\"\\$x\\" \\`y\\` \\\\"'),
        ("two\nlines", '"two\nlines"'),  # a newline is data inside double quotes, for sh and systemd alike
        ("", '""'),
    ],
)
def test_env_quote_writes_double_quoted_data(value: str, quoted: str) -> None:
    assert toolkit.env_quote(value) == quoted


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("a\0NCCL_DEBUG=INFO", "contains a NUL character"),
        ("\ud800", "contains U+D800, a lone surrogate that has no UTF-8 form"),
        ("\U0010ffff", "contains U+10FFFF, a Unicode noncharacter"),
    ],
)
@pytest.mark.parametrize("quote", [toolkit.shell_quote, toolkit.env_quote])
def test_values_no_env_file_can_hold_are_refused(quote: Any, value: str, why: str) -> None:
    with pytest.raises(EnvFileError, match=re.escape(why)):
        quote(value)


FILE = DesiredFile("/etc/x.sh", "a\nb\n", "0644", "env")


def facts_with(*files: ManagedFile, **more: Any) -> Facts:
    """A box of two RTX 3090s (bus 0x17 and 0x65) reporting `files`, with more facts fields as given."""
    buses = enumerate(("17", "65"))
    gpus = [factories.gpu(i, uuid=f"GPU-{i}", pci_bus_id=f"0000:{bus}:00.0") for i, bus in buses]
    return factories.facts(gpus=gpus, files=[f.model_dump() for f in files], **more)


def test_missing_file_is_created_with_a_diff_from_nothing() -> None:
    change = diff_file(FILE, ManagedFile(path="/etc/x.sh", exists=False))
    assert change is not None
    assert (change.resource, change.action, change.phase) == ("file:/etc/x.sh", "create", "env")
    assert change.summary == "new file, 2 lines, mode 0644"
    assert change.diff is not None and "--- /dev/null" in change.diff and "+b" in change.diff
    assert change.agent_step == {"kind": "file", "path": "/etc/x.sh", "content": "a\nb\n", "mode": "0644"}


def test_a_file_the_agent_did_not_report_is_created() -> None:
    [change] = diff_files([FILE], facts_with())
    assert change.action == "create"


def test_changed_content_is_an_update_with_a_unified_diff() -> None:
    have = ManagedFile(path="/etc/x.sh", exists=True, content="a\nc\n", mode="0644", sha256="0" * 64)
    change = diff_file(FILE, have)
    assert change is not None and change.action == "update"
    assert change.summary == "content differs"
    assert change.diff is not None and "-c\n" in change.diff and "+b\n" in change.diff


def test_a_carriage_return_inside_a_value_stays_on_its_diff_line() -> None:
    want = DesiredFile("/etc/x.sh", 'export A="a\rb"\nexport B=1\n', "0644", "env")
    have = ManagedFile(path="/etc/x.sh", exists=True, mode="0644", content="export A=1\nexport B=1\n")
    change = diff_file(want, have)
    assert change is not None and change.diff is not None
    assert '+export A="a\rb"\n' in change.diff and " export B=1\n" in change.diff


def test_mode_drift_alone_is_an_update() -> None:
    have = ManagedFile(path="/etc/x.sh", exists=True, content="a\nb\n", mode="0600", sha256=FILE.sha256)
    change = diff_file(FILE, have)
    assert change is not None and change.summary == "mode 0600 → 0644"
    assert change.diff is None
    assert change.current == f"mode 0600, sha256 {FILE.sha256[:12]}"


def test_without_content_the_hash_decides() -> None:
    same = ManagedFile(path="/etc/x.sh", exists=True, mode="0644", sha256=FILE.sha256)
    other = ManagedFile(path="/etc/x.sh", exists=True, mode="0644", sha256="f" * 64)
    assert diff_files([FILE], facts_with(same)) == []
    [change] = diff_files([FILE], facts_with(other))
    assert change.summary == "content differs" and change.diff is None


def test_converged_file_gives_no_change(tmp_path: Path) -> None:
    loaded = load(tmp_path)
    desired = desired_files(loaded, loaded.host("gpu-a"), facts_with())
    on_node = [
        ManagedFile(path=f.path, exists=True, content=f.content, mode=f.mode, sha256=f.sha256)
        for f in desired
    ]
    assert diff_files(desired, facts_with(*on_node)) == []
