"""`mgpu-provision facts` without SSH: shared options, rendering, exit codes, and a local simulated host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_provision.cli import build_parser, main
from mgpu_provision.commands import options
from mgpu_provision.commands.facts import as_json, containers_lines, driver_line, health_lines, link_matrix
from mgpu_provision.facts import ContainerFacts, DriverInfo, Facts, GpuPair, HostHealth, LostGpu
from mgpu_provision.fleet.pool import HostOutcome
from tests.support import factories

REPO = Path(__file__).resolve().parents[2]


def facts(
    driver: DriverInfo, gpus: int = 0, pairs: list[GpuPair] | None = None, nvswitch: bool = False
) -> Facts:
    return factories.facts(
        driver=driver.model_dump(),
        gpus=[factories.gpu(i) for i in range(gpus)],
        pairs=[p.model_dump() for p in pairs or []],
        nvswitch=nvswitch,
    )


OK_DRIVER = DriverInfo(nvml="ok", version="550.54.15", cuda="12.4", loaded="550.54.15")


@pytest.mark.parametrize(
    ("driver", "nvswitch", "line"),
    [
        (OK_DRIVER, False, "driver 550.54.15, CUDA 12.4"),
        (OK_DRIVER, True, "driver 550.54.15, CUDA 12.4, NVSwitch"),
        (
            DriverInfo(nvml="ok", version="550.90.07", cuda="12.4", loaded="550.54.15", reboot_required=True),
            False,
            "driver 550.90.07, CUDA 12.4, loaded module 550.54.15, reboot required",
        ),
        (
            DriverInfo(nvml="no-driver", message="no NVIDIA driver installed"),
            False,
            "driver: no NVIDIA driver installed (no-driver)",
        ),
        (
            DriverInfo(
                nvml="driver-not-loaded",
                message="module not loaded",
                installed="535.216.03",
                reboot_required=True,
            ),
            False,
            "driver: module not loaded (driver-not-loaded); installed 535.216.03, reboot required",
        ),
        (
            DriverInfo(nvml="no-driver", message="no NVIDIA driver installed", nouveau=True),
            False,
            "driver: no NVIDIA driver installed (no-driver); nouveau loaded",
        ),
    ],
)
def test_driver_line(driver: DriverInfo, nvswitch: bool, line: str) -> None:
    assert driver_line(facts(driver, nvswitch=nvswitch)) == line


def test_link_matrix_prints_topo_m_cells_and_marks_unknown_pairs() -> None:
    pairs = [GpuPair(a=0, b=1, nvlinks=4, pcie="PHB"), GpuPair(a=0, b=2, pcie="SYS")]
    rows = [line.split() for line in link_matrix(facts(OK_DRIVER, 3, pairs)).splitlines()]
    assert rows == [
        ["GPU0", "GPU1", "GPU2"],
        ["GPU0", "X", "NV4", "SYS"],
        ["GPU1", "NV4", "X", "?"],
        ["GPU2", "SYS", "?", "X"],
    ]


def test_lost_gpus_and_values_not_read_are_said_once() -> None:
    seen = facts(OK_DRIVER, 1).model_copy(
        update={
            "lost_gpus": [LostGpu(index=1, pci_bus_id="0:1", error="GPU is lost")],
            "health": HostHealth(
                not_checked=["ecc: not supported on GPU 0", "xid: no kernel log could be read"]
            ),
        }
    )
    assert health_lines(seen) == [
        "GPU 1 is lost (GPU is lost)",
        "not checked: ecc: not supported on GPU 0; xid: no kernel log could be read",
    ]
    assert [line.split() for line in link_matrix(seen).splitlines()][1:] == [
        ["GPU0", "X", "?"],
        ["GPU1", "?", "X"],
    ]


def test_json_has_status_and_facts_or_error() -> None:
    outcomes = {
        "a": HostOutcome("ok", facts(OK_DRIVER), None, 0.1),
        "b": HostOutcome[Facts]("unreachable", None, "connection refused by b", 0.0),
    }
    answer = as_json(outcomes)
    assert answer["hosts"]["b"] == {"status": "unreachable", "error": "connection refused by b"}
    assert answer["hosts"]["a"]["status"] == "ok"
    assert answer["hosts"]["a"]["facts"]["driver"]["version"] == "550.54.15"
    json.dumps(answer)  # serialisable as is


RIG = """\
version: 1
defaults: {{connect_timeout_s: 7}}
hosts:
  - {{name: box, rig: pair, connection: local, python: {python}, simulate: {twin}}}
  - {{name: far, address: 10.0.0.1, rig: pair}}
rigs:
  pair: {{gpus: {{model: "NVIDIA GeForce RTX 3090", count: 2}}}}
files: {{state_dir: {state}}}  # the local host's health sample: the test's folder, not this machine's
"""


@pytest.fixture
def rig(tmp_path: Path) -> Path:
    path = tmp_path / "rig.yaml"
    twin = REPO / "examples/twins/rtx3090-nvlink.yaml"
    path.write_text(RIG.format(python="/usr/bin/python3", twin=twin, state=tmp_path / "state"))
    return path


def test_prepare_applies_limit_timeout_and_options(rig: Path) -> None:
    args = build_parser().parse_args(
        ["facts", str(rig), "--limit", "box", "--timeout", "2.5", "--forks", "3", "--known-hosts", "/kh"]
    )
    run = options.prepare(args)
    assert [t.name for t in run.targets] == ["box"]
    assert run.targets[0].connect_timeout_s == 2.5
    assert (run.options.forks, run.options.known_hosts, run.options.accept_new_host_keys) == (
        3,
        Path("/kh"),
        False,
    )
    unlimited = options.prepare(build_parser().parse_args(["facts", str(rig)]))
    assert [t.connect_timeout_s for t in unlimited.targets] == [7.0, 7.0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--forks", "0"], "argument --forks: must be between 1 and 64"),
        (["--forks", "x"], "argument --forks: invalid _positive_int value: 'x'"),
        (["--timeout", "0"], "argument --timeout: must be more than 0 and at most 600 seconds"),
    ],
)
def test_bad_option_values_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["facts", "rig.yaml", *argv])
    assert message in capsys.readouterr().err


def test_limit_matching_nothing_is_an_error(rig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["facts", str(rig), "--limit", "nope"]) == 1
    assert "--limit: 'nope' matches no host" in capsys.readouterr().err


def test_local_simulated_host_reports_the_twin(
    rig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the agent cache of a local host lives in ~/.cache
    assert main(["facts", str(rig), "--limit", "box", "--json"]) == 0
    box = json.loads(capsys.readouterr().out)["hosts"]["box"]
    assert box["status"] == "ok"
    assert [g["name"] for g in box["facts"]["gpus"]] == ["NVIDIA GeForce RTX 3090"] * 2
    assert box["facts"]["pairs"][0]["nvlinks"] == 4
    assert box["facts"]["host"]["simulated"] is True


def test_unreachable_host_makes_exit_2_and_is_listed(
    rig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "rig2.yaml"
    path.write_text(rig.read_text().replace("10.0.0.1", "127.0.0.1").replace("far, ", "far, port: 1, "))
    assert main(["facts", str(path), "--known-hosts", str(tmp_path / "kh")]) == 2
    out = capsys.readouterr().out
    assert "far  unreachable: connection refused by far (127.0.0.1:1)" in out
    assert "NVIDIA GeForce RTX 3090" in out


def test_containers_lines_say_the_toolkit_each_spec_and_each_runtime() -> None:
    found = ContainerFacts.model_validate({
        "toolkit": "1.17.8",
        "specs": [
            {"path": "/etc/cdi/nvidia.yaml", "kind": "nvidia.com/gpu", "devices": ["0", "all"],
             "paths": [{"role": "mount", "path": "/usr/lib/libcuda.so.1.2", "exists": False}]},
            {"path": "/var/run/cdi/x.json", "error": "not valid JSON: Expecting value"},
        ],
        "runtimes": {"podman": {"installed": True}, "docker": {"installed": False, "configured": False}},
    })  # fmt: skip
    seen = facts(OK_DRIVER, 1).model_copy(update={"containers": found})
    assert containers_lines(seen) == [
        "NVIDIA Container Toolkit 1.17.8",
        "CDI /etc/cdi/nvidia.yaml: nvidia.com/gpu, 2 devices, 1 path(s) missing",
        "CDI /var/run/cdi/x.json: not valid JSON: Expecting value",
        "podman: reads CDI",
        "docker: not installed",
    ]
    assert containers_lines(facts(OK_DRIVER, 1)) == []
