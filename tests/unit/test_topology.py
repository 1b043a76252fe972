"""`nvidia-smi topo -m` parsing: real published matrices, older driver layouts, garbage with line numbers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mgpu_provision.catalog.topology import (
    MAX_TOPOLOGY_BYTES,
    TopologyParseError,
    format_topology,
    gpu_matrix,
    nvlink_count,
    parse_topology,
    read_topology_text,
)

# Verbatim copies of published matrices, and hand-written ones for layouts nobody published.
REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "topologies"

# Older driver: NIC columns named after the device, no GPU NUMA ID column, spaces instead of tabs.
OLD_DRIVER_MLX = """\
        GPU0    GPU1    mlx5_0  mlx5_1  CPU Affinity    NUMA Affinity
GPU0     X      NV2     PIX     SYS     0-19,40-59      0
GPU1    NV2      X      SYS     PIX     20-39,60-79     1
mlx5_0  PIX     SYS      X      SYS
mlx5_1  SYS     PIX     SYS      X

Legend:

  X    = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing a single PCIe switch
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# Very old driver: SOC between sockets, no NUMA columns beyond CPU Affinity.
VERY_OLD_SOC = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity
GPU0\t X \tPIX\tSOC\tSOC\t0-7
GPU1\tPIX\t X \tSOC\tSOC\t0-7
GPU2\tSOC\tSOC\t X \tPIX\t8-15
GPU3\tSOC\tSOC\tPIX\t X \t8-15
"""

# DGX-1 (V100) hybrid cube mesh: NV1/NV2 between some pairs, SYS/NODE for the rest.
DGX1_MESH = """\
nvidia-smi topo -m
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    CPU Affinity    NUMA Affinity
GPU0     X      NV1     NV1     NV2     NV2     SYS     SYS     SYS     0-19,40-59      0
GPU1    NV1      X      NV2     NV1     SYS     NV2     SYS     SYS     0-19,40-59      0
GPU2    NV1     NV2      X      NV2     SYS     SYS     NV1     SYS     0-19,40-59      0
GPU3    NV2     NV1     NV2      X      SYS     SYS     SYS     NV1     0-19,40-59      0
GPU4    NV2     SYS     SYS     SYS      X      NV1     NV1     NV2     20-39,60-79     1
GPU5    SYS     NV2     SYS     SYS     NV1      X      NV2     NV1     20-39,60-79     1
GPU6    SYS     SYS     NV1     SYS     NV1     NV2      X      NV2     20-39,60-79     1
GPU7    SYS     SYS     SYS     NV1     NV2     NV1     NV2      X      20-39,60-79     1
"""

# 4x A100 PCIe in two NVLink-bridged pairs (NV12 each), one NIC with a NIC legend after the matrix.
A100_4X_NV12 = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV12\tSYS\tSYS\tNODE\t0-31\t0\t\tN/A
GPU1\tNV12\t X \tSYS\tSYS\tNODE\t0-31\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tNV12\tSYS\t32-63\t1\t\tN/A
GPU3\tSYS\tSYS\tNV12\t X \tSYS\t32-63\t1\t\tN/A
NIC0\tNODE\tNODE\tSYS\tSYS\t X \t\t\t\t

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
"""

A100_8X_NVSWITCH = (
    "\t"
    + "\t".join(f"GPU{i}" for i in range(8))
    + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    + "".join(
        f"GPU{i}\t"
        + "\t".join(" X " if i == j else "NV12" for j in range(8))
        + f"\t{'0-63' if i < 4 else '64-127'}\t{0 if i < 4 else 1}\t\tN/A\n"
        for i in range(8)
    )
)


@pytest.mark.parametrize(
    "path",
    sorted(REFERENCE.glob("*.txt")),
    ids=lambda p: f"{p.parent.parent.name}/{p.name}",
)
def test_every_published_reference_matrix_parses(path: Path) -> None:
    matrix = parse_topology(path.read_text())
    assert matrix.gpu_count >= 1
    assert all(matrix.gpu_cell(i, i) == "X" for i in range(matrix.gpu_count))


def test_a_capture_with_the_shell_prompt_before_the_command() -> None:
    matrix = parse_topology((REFERENCE / "1x-tesla-p4-after-prompt.txt").read_text())
    assert matrix.devices == ("GPU0",)
    row = matrix.rows["GPU0"]
    assert (row.cpu_affinity, row.numa_affinity, row.gpu_numa_id) == ("0-7", "N/A", "N/A")


@pytest.mark.parametrize(
    "prompt",
    ["user@host:~$ nvidia-smi topo -m", "[root@gpu01 ~]# sudo nvidia-smi topo -m", "$ nvidia-smi topo -m"],
)
def test_every_kind_of_prompt_before_the_command(prompt: str) -> None:
    assert parse_topology(f"{prompt}\n{OLD_DRIVER_MLX}").nvlinks(0, 1) == 2


@pytest.mark.parametrize(
    "label",
    ["GPU Topology:", "   Topology matrix of gpu-07", "$ nvidia-smi tpo -m", "GPU Topology:\n\n  (node 3)"],
)
def test_a_label_line_before_a_whole_matrix_is_skipped(label: str) -> None:
    """Issue 37 item 12: a capture that starts with a label (`GPU Topology:`, an indented heading, a shell
    line with a typo) was refused at line 1 although the matrix below it is whole."""
    assert parse_topology(f"{label}\n{OLD_DRIVER_MLX}").nvlinks(0, 1) == 2


def test_a_note_and_a_prompt_after_the_rows_end_the_matrix() -> None:
    matrix = parse_topology((REFERENCE / "2x-rtx5090-prompt-and-note.txt").read_text())
    assert matrix.devices == ("GPU0", "GPU1")
    assert matrix.gpu_cell(0, 1) == "PHB"
    row = matrix.rows["GPU1"]
    assert (row.cpu_affinity, row.numa_affinity, row.gpu_numa_id) == ("0-63", "0", "N/A")


def test_a_note_before_a_missing_row_is_named_in_the_refusal() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-5\n# die P100 ist GPU0\nGPU1\tNV4\t X \t0-5\n"
    with pytest.raises(TopologyParseError) as caught:
        parse_topology(text)
    assert caught.value.line == 3
    ended = "the matrix ends at '# die P100 ist GPU0', which is not a row"
    assert f"no row for GPU1 ({ended})" in str(caught.value)


def test_empty_affinity_cells_of_a_windows_capture_do_not_shift_the_columns() -> None:
    matrix = parse_topology((REFERENCE / "2x-windows-empty-affinity.txt").read_text())
    for label in ("GPU0", "GPU1"):
        row = matrix.rows[label]
        assert (row.cpu_affinity, row.numa_affinity, row.gpu_numa_id) == (None, None, "N/A")


def test_rtx3090_bridge() -> None:
    matrix = parse_topology((REFERENCE / "2x-rtx3090-nvlink-bridge.txt").read_text())
    assert matrix.devices == ("GPU0", "GPU1")
    assert matrix.nvlinks(0, 1) == 4 == matrix.nvlinks(1, 0)
    row = matrix.rows["GPU1"]
    assert (row.cpu_affinity, row.numa_affinity, row.gpu_numa_id) == ("0-5", "0", "N/A")


def test_h100_with_nic_columns_and_cut_nic_rows() -> None:
    matrix = parse_topology((REFERENCE / "8x-h100-hgx-nvswitch-with-nics.txt").read_text())
    assert matrix.gpu_count == 8
    assert len(matrix.devices) == 18
    assert all(matrix.nvlinks(i, j) == 18 for i in range(8) for j in range(8) if i != j)
    assert matrix.cell("GPU3", "NIC5") == "PIX"
    assert matrix.cell("NIC9", "GPU7") == "PIX"  # NIC9's row was cut: taken from GPU7's row
    assert matrix.rows["GPU4"].cpu_affinity == "56-111,168-223"
    assert matrix.rows["NIC0"].cpu_affinity is None  # NIC rows leave the affinity cells empty


def test_rtx4090_pcie_classes() -> None:
    matrix = parse_topology((REFERENCE / "5x-rtx4090-pcie-dual-socket.txt").read_text())
    assert [matrix.gpu_cell(1, j) for j in range(5)] == ["SYS", "X", "PHB", "NODE", "NODE"]
    assert matrix.nvlinks(1, 2) == 0


def test_older_driver_with_mlx5_columns_and_no_gpu_numa_id() -> None:
    matrix = parse_topology(OLD_DRIVER_MLX)
    assert matrix.devices == ("GPU0", "GPU1", "mlx5_0", "mlx5_1")
    assert matrix.titles == ("CPU Affinity", "NUMA Affinity")
    assert matrix.rows["GPU1"].numa_affinity == "1"
    assert matrix.rows["GPU1"].gpu_numa_id is None
    assert matrix.cell("mlx5_1", "GPU1") == "PIX"


def test_very_old_driver_with_soc() -> None:
    matrix = parse_topology(VERY_OLD_SOC)
    assert matrix.titles == ("CPU Affinity",)
    assert matrix.gpu_cell(0, 2) == "SOC"
    assert matrix.rows["GPU3"].cpu_affinity == "8-15"


def test_dgx1_hybrid_cube_mesh_after_command_line() -> None:
    matrix = parse_topology(DGX1_MESH)
    assert matrix.nvlinks(0, 3) == 2
    assert matrix.nvlinks(0, 1) == 1
    assert matrix.nvlinks(0, 5) == 0
    assert sum(matrix.nvlinks(0, j) for j in range(1, 8)) == 6  # V100 has six links


def test_a100_pairs_with_nic_legend() -> None:
    matrix = parse_topology(A100_4X_NV12)
    assert matrix.nvlinks(0, 1) == 12 and matrix.nvlinks(2, 3) == 12 and matrix.nvlinks(1, 2) == 0
    assert matrix.nic_names == {"NIC0": "mlx5_0"}
    assert matrix.rows["GPU2"].numa_affinity == "1"


def test_a100_nvswitch() -> None:
    matrix = parse_topology(A100_8X_NVSWITCH)
    assert {matrix.gpu_cell(i, j) for i in range(8) for j in range(8) if i != j} == {"NV12"}


def test_ansi_underlined_header_as_nvidia_smi_prints_it_to_a_terminal() -> None:
    # nvidia-smi underlines the header row (ESC[4m ... ESC[0m); saved captures keep the codes.
    lines = A100_4X_NV12.splitlines(keepends=True)
    lines[0] = "\x1b[4m" + lines[0].rstrip("\n") + "\x1b[0m\n"
    matrix = parse_topology("".join(lines))
    assert matrix == parse_topology(A100_4X_NV12)
    bold_row = DGX1_MESH.replace("GPU3    NV2", "\x1b[1mGPU3\x1b[0m    NV2")
    assert parse_topology(bold_row).gpu_cell(3, 0) == "NV2"


def test_crlf_line_endings() -> None:
    matrix = parse_topology(OLD_DRIVER_MLX.replace("\n", "\r\n"))
    assert matrix.nvlinks(0, 1) == 2


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("", 1, "no matrix found"),
        ("hello world\n", 1, "no 'CPU Affinity' column"),
        ("\tNIC0\tGPU0\tCPU Affinity\n", 1, "must start with GPU columns"),
        ("\tGPU0\tGPU0\tCPU Affinity\n", 1, "names a device column twice"),
        ("\tGPU0\tCPU Affinity\tColour\n", 1, "unknown columns after the devices: 'CPU Affinity Colour'"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-5\nGPUX\tNV4\t X \t0-5\n", 3, "row label 'GPUX'"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n", 2, "row GPU0 has 1 cells, the header has 2"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNVX\t0\n", 2, "GPU0/GPU1: unknown cell 'NVX'"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\tPIX\tNV4\t0\n", 2, "GPU0/GPU0: 'X' belongs on the diagonal only"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \t X \t0\n", 2, "GPU0/GPU1: 'X' belongs on the diagonal only"),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-5\t0\t7\n", 2, "more values than columns"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0\n", 3, "no row for GPU1"),
        (
            "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0\nGPU0\t X \tNV4\t0\n",
            3,
            "row GPU0 appears twice",
        ),
        (
            "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0\nGPU1\tNV2\t X \t0\n",
            3,
            "GPU0/GPU1 is NV4 but GPU1/GPU0 is NV2",
        ),
    ],
)
def test_garbage_is_refused_with_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(TopologyParseError) as caught:
        parse_topology(text)
    assert caught.value.line == line
    assert f"line {line}: " in str(caught.value)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("text", [OLD_DRIVER_MLX, VERY_OLD_SOC, DGX1_MESH, A100_4X_NV12, A100_8X_NVSWITCH])
def test_format_then_parse_is_the_same_matrix(text: str) -> None:
    matrix = parse_topology(text)
    printed = format_topology(matrix)
    assert parse_topology(printed) == matrix
    assert printed.splitlines()[1].split("\t")[:3] == ["GPU0", " X ", matrix.gpu_cell(0, 1)]


def test_format_prints_the_reference_h100_as_nvidia_smi_does() -> None:
    original = (REFERENCE / "8x-h100-hgx-nvswitch-with-nics.txt").read_text()
    printed = format_topology(parse_topology(original))
    # nvidia-smi pads the NUMA column with an extra tab; apart from that the rows are the same text.
    assert [line.replace("\t\t", "\t").rstrip("\t") for line in original.splitlines()] == [
        line.rstrip("\t") for line in printed.splitlines()
    ]


_PCIE = st.sampled_from(["PIX", "PXB", "PHB", "NODE", "SYS"])


@given(st.integers(min_value=1, max_value=8).flatmap(lambda n: st.tuples(st.just(n), st.data())))
def test_gpu_matrix_roundtrips(args: tuple[int, st.DataObject]) -> None:
    count, data = args
    cells: dict[tuple[int, int], str] = {}
    for i in range(count):
        for j in range(i + 1, count):
            links = data.draw(st.integers(min_value=0, max_value=18))
            cells[(i, j)] = f"NV{links}" if links else data.draw(_PCIE)
    matrix = gpu_matrix(count, lambda i, j: cells[(min(i, j), max(i, j))])
    again = parse_topology(format_topology(matrix))
    for (i, j), cell in cells.items():
        assert again.gpu_cell(i, j) == cell == again.gpu_cell(j, i)
        assert again.nvlinks(i, j) == nvlink_count(cell)


def test_a_captured_file_is_read_within_bounds(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text((REFERENCE / "2x-rtx3090-nvlink-bridge.txt").read_text())
    assert parse_topology(read_topology_text(str(good))).gpu_count == 2
    huge = tmp_path / "huge.txt"
    huge.write_bytes(b" " * (MAX_TOPOLOGY_BYTES + 1))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe GPU0")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, reason in [
        ("/dev/zero", "not a regular file"),
        (str(fifo), "not a regular file"),
        (str(huge), "larger than 1 MiB"),
        (str(binary), "not UTF-8 text"),
    ]:
        with pytest.raises(OSError) as caught:
            read_topology_text(path)
        assert caught.value.strerror.startswith(reason)
