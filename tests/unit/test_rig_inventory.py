"""Hosts from an Ansible inventory (`inventory:` + `rig_groups:`), read by ansible-core's own parser.

Each rule about the inventory's hosts and each way an inventory can be wrong gets a file that breaks it, and
the problem must name the file (the inventory, its group_vars, or the rig file), the line and the cause.
The last tests run the CLI in a fresh python to see what an inventory costs a process: ansible is imported
only for a rig file that names an inventory, its absence is a clear error, and nothing lands in ~/.ansible.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mgpu_provision.errors import ProvisionError, SpecError, SpecProblem
from mgpu_provision.fleet.targets import targets_for
from mgpu_provision.rig import LoadedRig, load_rig, select_hosts

if os.environ.get("CI") != "true":
    pytest.importorskip("ansible", reason="ansible-core (the `ansible` extra) is not installed")

REPO = Path(__file__).resolve().parents[2]
RIGS = """\
rigs:
  pair:
    gpus: {model: "NVIDIA GeForce RTX 3090", count: 2}
  h100:
    gpus: {model: "NVIDIA H100 80GB HBM3", count: 8}
"""
INI = """\
[gpu_3090]
gpu-a ansible_host=10.0.0.11 ansible_port=2222 ansible_user=mlops
gpu-b ansible_host=10.0.0.12

[gpu_h100]
hgx-1 ansible_host=10.0.1.1 ansible_connection=ssh

[gpu:children]
gpu_3090
gpu_h100

[web]
www1 ansible_host=10.9.9.9
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder / "rig.yaml"


def rig_text(
    inventory: str = "hosts.ini", groups: str = "{gpu_3090: pair, gpu_h100: h100}", extra: str = ""
) -> str:
    return f"version: 1\n{extra}inventory: {inventory}\nrig_groups: {groups}\n{RIGS}"


def load(tmp_path: Path, files: dict[str, str] | None = None) -> LoadedRig:
    """The rig file and inventory of `files`, by default rig_text() and INI."""
    return load_rig(write(tmp_path, {"rig.yaml": rig_text(), "hosts.ini": INI, **(files or {})}))


def problems(tmp_path: Path, files: dict[str, str] | None = None) -> list[SpecProblem]:
    with pytest.raises(SpecError) as info:
        load(tmp_path, files)
    return info.value.problems


def only(found: list[SpecProblem]) -> SpecProblem:
    assert len(found) == 1, found
    return found[0]


def line_of(text: str, fragment: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


def test_ini_hosts_become_hosts_of_their_rig_types(tmp_path: Path) -> None:
    group_vars = "ansible_ssh_private_key_file: keys/lab\nansible_python_interpreter: /opt/py/bin/python3\n"
    loaded = load(tmp_path, {"group_vars/gpu_3090.yml": group_vars, "host_vars/gpu-b": "ansible_user: ops\n"})
    hosts = {host.name: host for host in loaded.spec.hosts}
    assert list(hosts) == ["gpu-a", "gpu-b", "hgx-1"]  # rig_groups order, then inventory order; no www1
    assert [hosts[name].rig for name in hosts] == ["pair", "pair", "h100"]
    targets = {t.name: t for t in targets_for(loaded, list(loaded.spec.hosts))}
    a, b, hgx = targets["gpu-a"], targets["gpu-b"], targets["hgx-1"]
    assert (a.address, a.port, a.user, a.python) == ("10.0.0.11", 2222, "mlops", "/opt/py/bin/python3")
    assert a.identity_file == str(tmp_path / "keys" / "lab")  # relative to the inventory's folder
    assert (b.address, b.port, b.user) == ("10.0.0.12", None, "ops")  # host_vars/ over group_vars/
    assert (hgx.address, hgx.identity_file, hgx.python) == ("10.0.1.1", None, "python3")
    assert set(hosts["gpu-a"].groups) == {"gpu_3090", "gpu"}  # parents too, without all/ungrouped


def test_yaml_inventory_and_rig_file_defaults_fill_the_gaps(tmp_path: Path) -> None:
    inventory = """\
    all:
      children:
        gpus:
          hosts:
            gpu-a: {ansible_host: 10.0.0.11, ansible_port: 2200}
            gpu-b:
              ansible_ssh_host: 10.0.0.12
              ansible_ssh_user: old
              ansible_become: yes
          vars:
            ansible_user: lab
    """
    rig = rig_text("hosts.yml", "{gpus: pair}", "defaults: {port: 22}\n")
    loaded = load(tmp_path, {"rig.yaml": rig, "hosts.yml": inventory})
    targets = {t.name: t for t in targets_for(loaded, list(loaded.spec.hosts))}
    assert (targets["gpu-a"].port, targets["gpu-a"].user, targets["gpu-a"].become) == (2200, "lab", False)
    b = targets["gpu-b"]  # the older ansible_ssh_* spellings, and a host variable over a group one
    assert (b.address, b.port, b.user, b.become) == ("10.0.0.12", 22, "old", True)


def test_connection_local_and_auto_python(tmp_path: Path) -> None:
    ini = "[box]\nthis-box ansible_connection=local ansible_python_interpreter=auto_silent\n"
    loaded = load(tmp_path, {"hosts.ini": ini, "rig.yaml": rig_text(groups="{box: pair}")})
    (target,) = targets_for(loaded, list(loaded.spec.hosts))
    assert (target.connection, target.python) == ("local", "python3")


def test_written_hosts_and_rig_file_groups_may_name_inventory_hosts(tmp_path: Path) -> None:
    extra = "hosts:\n  - {name: ws-1, address: 10.0.5.5, rig: pair}\ngroups:\n  rack1: [ws-1, gpu-b]\n"
    rig = rig_text(extra=extra).replace("count: 2}\n", "count: 2}\n    ddp: {master: gpu-a}\n")
    loaded = load(tmp_path, {"rig.yaml": rig})
    assert [h.name for h in loaded.spec.hosts] == ["ws-1", "gpu-a", "gpu-b", "hgx-1"]
    rendezvous = loaded.rendezvous(loaded.host("gpu-b"))
    assert rendezvous is not None
    assert rendezvous.members == ("gpu-a", "ws-1", "gpu-b")
    assert rendezvous.master_addr == "10.0.0.11"


def test_limit_takes_inventory_groups_and_lists_the_known_ones(tmp_path: Path) -> None:
    loaded = load(tmp_path)
    assert [h.name for h in select_hosts(loaded, "gpu_3090")] == ["gpu-a", "gpu-b"]
    assert [h.name for h in select_hosts(loaded, "gpu,!gpu-b")] == ["gpu-a", "hgx-1"]  # a parent group
    assert [h.name for h in select_hosts(loaded, "h100")] == ["hgx-1"]  # rig types still work
    with pytest.raises(ProvisionError) as info:
        select_hosts(loaded, "gpu_4090")
    assert str(info.value) == (
        f"--limit: 'gpu_4090' matches no host, group or rig of {tmp_path / 'rig.yaml'}; "
        "groups: gpu, gpu_3090, gpu_h100; rig types: h100, pair"
    )


def test_host_in_two_mapped_groups(tmp_path: Path) -> None:
    rig = rig_text(groups="\n  gpu_3090: pair\n  gpu: h100")
    problem = only(problems(tmp_path, {"rig.yaml": rig}))
    assert problem.file.endswith("rig.yaml")
    assert (problem.line, problem.field) == (line_of(rig, "gpu: h100"), "rig_groups.gpu")
    assert problem.message.startswith(
        "inventory host(s) gpu-a, gpu-b are in two groups of rig_groups: 'gpu_3090' (pair) and 'gpu' (h100)"
    )


def test_mapped_group_missing_from_the_inventory(tmp_path: Path) -> None:
    rig = rig_text(groups="\n  gpu_3090: pair\n  gpu_4090: pair")
    problem = only(problems(tmp_path, {"rig.yaml": rig}))
    assert (problem.line, problem.field) == (line_of(rig, "gpu_4090"), "rig_groups.gpu_4090")
    assert problem.message == (
        f"group 'gpu_4090' is not in the inventory {tmp_path / 'hosts.ini'} "
        "(its groups: gpu, gpu_3090, gpu_h100, web)"
    )


def test_mapped_group_without_hosts(tmp_path: Path) -> None:
    problem = only(
        problems(tmp_path, {"hosts.ini": INI + "[spare]\n", "rig.yaml": rig_text(groups="{spare: pair}")})
    )
    assert problem.field == "rig_groups.spare"
    assert problem.message == f"group 'spare' of the inventory {tmp_path / 'hosts.ini'} has no hosts"


def test_host_both_written_and_in_the_inventory(tmp_path: Path) -> None:
    rig = rig_text(extra="hosts:\n  - {name: gpu-b, rig: pair}\n")
    problem = only(problems(tmp_path, {"rig.yaml": rig}))
    assert (problem.line, problem.field) == (line_of(rig, "gpu-b"), "hosts[0].name")
    assert problem.message == (
        f"host 'gpu-b' is also in the inventory {tmp_path / 'hosts.ini'} (group 'gpu_3090'): list each "
        "host once, under `hosts:` or in the inventory"
    )


def test_two_inventory_hosts_on_one_box_are_refused_naming_both(tmp_path: Path) -> None:
    # DeepOps-style: two names for one machine (a renamed node left in the file).
    ini = INI.replace("gpu-b ansible_host=10.0.0.12", "gpu-b ansible_host=10.0.0.11 ansible_port=2222")
    rig = rig_text()
    problem = only(problems(tmp_path, {"rig.yaml": rig, "hosts.ini": ini}))
    assert (problem.line, problem.field) == (line_of(rig, "rig_groups"), "rig_groups.gpu_3090")
    inventory = tmp_path / "hosts.ini"
    assert problem.message == (
        "hosts 'gpu-a' and 'gpu-b' are the same box (10.0.0.11 port 2222): "
        f"'gpu-a' in the inventory {inventory} line 2, 'gpu-b' in the inventory {inventory} line 3; "
        "one apply would converge it twice at once: list each box once"
    )


def test_a_written_host_and_an_inventory_host_on_one_box(tmp_path: Path) -> None:
    rig = rig_text(extra="hosts:\n  - {name: old-a, address: 10.0.1.1, rig: h100}\n")
    problem = only(problems(tmp_path, {"rig.yaml": rig}))
    same = "hosts 'old-a' and 'hgx-1' are the same box (10.0.1.1 port 22): 'old-a' at hosts[0]"
    assert same in problem.message
    assert f"'hgx-1' in the inventory {tmp_path / 'hosts.ini'} line 6" in problem.message


def test_one_address_behind_two_jump_hosts_is_two_boxes(tmp_path: Path) -> None:
    rig = rig_text(extra="hosts:\n  - {name: far-a, address: 10.0.1.1, jump: bastion-2, rig: h100}\n")
    hosts = load(tmp_path, {"rig.yaml": rig}).spec.hosts
    assert [h.name for h in hosts] == ["far-a", "gpu-a", "gpu-b", "hgx-1"]


def test_port_that_is_not_a_number_points_into_the_inventory(tmp_path: Path) -> None:
    ini = INI.replace("gpu-b ansible_host=10.0.0.12", "gpu-b ansible_host=10.0.0.12 ansible_port=ssh")
    problem = only(problems(tmp_path, {"hosts.ini": ini}))
    assert (problem.file, problem.line) == (str(tmp_path / "hosts.ini"), line_of(ini, "gpu-b"))
    assert problem.message == "inventory host 'gpu-b': ansible_port: expected an integer, got 'ssh'"


def test_bad_value_in_group_vars_points_at_that_file(tmp_path: Path) -> None:
    found = problems(tmp_path, {"group_vars/gpu_h100.yml": "# the HGX boxes\nansible_port: 70000\n"})
    problem = only(found)
    assert (problem.file, problem.line) == (str(tmp_path / "group_vars" / "gpu_h100.yml"), 2)
    assert problem.message == "inventory host 'hgx-1': ansible_port: must be at most 65535, got 70000"


def test_address_with_a_template_is_refused(tmp_path: Path) -> None:
    ini = INI.replace("ansible_host=10.0.0.12", 'ansible_host="{{ inventory_hostname }}.lab"')
    problem = only(problems(tmp_path, {"hosts.ini": ini}))
    assert problem.line == line_of(ini, "gpu-b")
    assert problem.message.startswith("inventory host 'gpu-b': ansible_host: expected text matching")


def test_connection_become_and_name_that_cannot_be_used(tmp_path: Path) -> None:
    ini = (
        "[gpu_3090]\n"
        "win-1 ansible_connection=winrm\n"
        "gpu-c ansible_become=sometimes\n"
        "gpu-d ansible_become_method=su\n"
        "gpu-e ansible_become=true ansible_become_user=postgres\n"
        "gpu_f@lab\n"
    )
    found = problems(tmp_path, {"hosts.ini": ini, "rig.yaml": rig_text(groups="{gpu_3090: pair}")})
    assert [(p.line, p.message) for p in found] == [
        (
            2,
            "inventory host 'win-1': ansible_connection: 'winrm' cannot be used: mgpu-provision reaches "
            "hosts over ssh or runs on this machine (local)",
        ),
        (3, "inventory host 'gpu-c': ansible_become: expected true or false, got 'sometimes'"),
        (
            4,
            "inventory host 'gpu-d': ansible_become_method: 'su' cannot be used: the agent runs with sudo -n",
        ),
        (5, "inventory host 'gpu-e': ansible_become_user: 'postgres' cannot be used: the agent becomes root"),
        (
            6,
            "inventory host 'gpu_f@lab' cannot be a host name here: letters, digits, '.', '_' and '-' only "
            "(starting with a letter or digit), 63 at most",
        ),
    ]
    assert {p.file for p in found} == {str(tmp_path / "hosts.ini")}


def test_ini_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    ini = "[gpu_3090]\ngpu-a ansible_host=10.0.0.11 ansible_port=22\ngpu-b port 22\n"
    problem = only(problems(tmp_path, {"hosts.ini": ini, "rig.yaml": rig_text(groups="{gpu_3090: pair}")}))
    assert (problem.file, problem.line) == (str(tmp_path / "hosts.ini"), 3)
    assert "Expected key=value host variable assignment, got: port" in problem.message


def test_ini_undefined_child_group_names_its_section(tmp_path: Path) -> None:
    ini = "[gpu_3090]\ngpu-a\n\n[gpu:children]\ngpu_3090\ngpu_4090\n"
    problem = only(problems(tmp_path, {"hosts.ini": ini, "rig.yaml": rig_text(groups="{gpu_3090: pair}")}))
    assert (problem.file, problem.line) == (str(tmp_path / "hosts.ini"), 6)
    assert "Section [gpu:children] includes undefined group" in problem.message
    assert "gpu_4090" in problem.message


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    inventory = "all:\n  children:\n    gpus:\n      hosts:\n"
    inventory += "        gpu-a: {ansible_host: 10.0.0.11\n        gpu-b:\n"
    problem = only(
        problems(tmp_path, {"hosts.yaml": inventory, "rig.yaml": rig_text("hosts.yaml", "{gpus: pair}")})
    )
    assert problem.file == str(tmp_path / "hosts.yaml")
    assert problem.line == 6
    assert problem.message.startswith(("YAML parsing failed", "Syntax Error while loading YAML."))


def test_vault_encrypted_variables_file_is_named(tmp_path: Path) -> None:
    vaulted = "$ANSIBLE_VAULT;1.1;AES256\n62313365396662343061393464336163\n"
    problem = only(problems(tmp_path, {"group_vars/gpu_3090.yml": vaulted}))
    assert (problem.file, problem.line) == (str(tmp_path / "group_vars" / "gpu_3090.yml"), 1)
    assert problem.message.endswith(
        "(mgpu-provision asks for no vault password, so it cannot read a variables file that Ansible Vault "
        "encrypted whole)"
    )


def test_missing_inventory_points_at_the_rig_file(tmp_path: Path) -> None:
    rig = rig_text("inventories/prod.ini")
    problem = only(problems(tmp_path, {"rig.yaml": rig}))
    assert (problem.file, problem.line, problem.field) == (
        str(tmp_path / "rig.yaml"),
        line_of(rig, "inventory:"),
        "inventory",
    )
    assert problem.message == f"inventory {tmp_path / 'inventories' / 'prod.ini'} does not exist"


def test_unreadable_inventory_is_the_only_problem_about_its_hosts(tmp_path: Path) -> None:
    rig = rig_text("missing.ini", extra="groups:\n  rack1: [gpu-b]\n")
    rig = rig.replace("count: 2}\n", "count: 2}\n    ddp: {master: gpu-a}\n")
    problem = only(problems(tmp_path, {"rig.yaml": rig}))  # not "ddp master 'gpu-a' is not a host"
    assert problem.message == f"inventory {tmp_path / 'missing.ini'} does not exist"


def test_inventory_path_the_schema_refuses_is_reported_once(tmp_path: Path) -> None:
    rig = rig_text('"my hosts.ini"')
    problem = only(problems(tmp_path, {"rig.yaml": rig}))
    assert (problem.field, problem.line) == ("inventory", line_of(rig, "inventory:"))
    assert problem.message.startswith("expected a path of letters, digits")


def _run(tmp_path: Path, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=60,
        check=False,
    )


def test_a_rig_without_inventory_never_imports_ansible(tmp_path: Path) -> None:
    (tmp_path / "rig.yaml").write_text(
        "version: 1\nhosts:\n  - {name: gpu-a, rig: pair}\n" + RIGS.replace("  h100:\n", "  h100x:\n")
    )
    code = """
        import sys
        from mgpu_provision.cli import main
        code = main(["validate", "rig.yaml"])
        print(code, sorted(name for name in sys.modules if name.split(".")[0] == "ansible"))
    """
    done = _run(tmp_path, code)
    assert done.stdout.splitlines()[-1] == "0 []", done.stdout + done.stderr


BLOCK_ANSIBLE = """
    import sys
    class NoAnsible:
        def find_spec(self, name, path=None, target=None):
            if name == "ansible" or name.startswith("ansible."):
                raise ModuleNotFoundError(f"No module named '{name}'", name=name)
            return None
    sys.meta_path.insert(0, NoAnsible())
"""


def test_without_ansible_the_error_names_the_extra(tmp_path: Path) -> None:
    write(tmp_path, {"rig.yaml": rig_text(), "hosts.ini": INI})
    code = (
        BLOCK_ANSIBLE
        + """
    from mgpu_provision.cli import main
    sys.exit(main(["validate", "rig.yaml"]))
    """
    )
    done = _run(tmp_path, code)
    assert done.returncode == 1
    assert done.stdout + done.stderr == (
        "rig.yaml:2:12: inventory: reading an Ansible inventory needs ansible-core, which is not installed "
        "(No module named 'ansible'): pip install 'mgpu-provision[ansible]'\n"
        "rig.yaml: invalid, 1 problem\n"
    )


def test_reading_an_inventory_keeps_home_and_terminal_clean(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # Ansible warns about a group name with '-' and about a group named like a host: not on this terminal.
    ini = INI + "\n[rack-1]\ngpu-a\n\n[www1]\nwww1\n"
    write(tmp_path, {"rig.yaml": rig_text(), "hosts.ini": ini})
    env = {"HOME": str(home), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    code = """
        import os, sys
        from mgpu_provision.cli import main
        os.environ.pop("ANSIBLE_LOCAL_TEMP", None)
        sys.exit(main(["validate", "rig.yaml"]))
    """
    done = _run(tmp_path, code, env)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "rig.yaml: valid, 3 hosts, 2 rigs\n"
    assert list(home.iterdir()) == []  # no ~/.ansible
    assert list((tmp_path / "tmp").iterdir()) == []  # Ansible's temporary folder is gone at exit
