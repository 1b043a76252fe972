"""Read and print `nvidia-smi topo -m` link matrices.

The matrix is the one description of a box's GPU wiring that people already know, publish and paste into
issues, so the tool accepts it verbatim: as a twin's source of NVLink facts, and as an expected layout
captured from a known-good box. Real output varies (tabs or spaces, NIC columns named `NIC0` or `mlx5_0`,
with or without the `GPU NUMA ID` column, legends after the matrix), so the parser is lenient about layout
and strict about content: anything it cannot place is an error naming the line.

Shipped to nodes inside the agent: standard library only, Python 3.8.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from ..judge.topology import nvlink_count as nvlink_count  # re-exported: the parser of these cells
from ..typing_lite import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

# Cell tokens: self, PCIe classes (SOC is the old drivers' word for the socket interconnect, PSB comes from
# DCGM's variant of the legend) and bonded NVLink sets.
_CELL = re.compile(r"^(X|SOC|SYS|NODE|PHB|PXB|PIX|PSB|NV[1-9][0-9]*)$")
_GPU_LABEL = re.compile(r"^GPU([0-9]+)$")
_TRAILING_TITLES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NIC_LEGEND_ENTRY = re.compile(r"^\s*(NIC[0-9]+)\s*:\s*(\S+)\s*$")
# The command as people paste it: bare, after `$ `, or after a whole prompt (`user@host:~$`, `[root@h ~]#`,
# `PS C:\>`), with or without sudo.
_COMMAND_LINE = re.compile(r"^(.*[$#>%]\s*)?(sudo\s+)?nvidia-smi(\.exe)?\s+topo\b")
# Terminal escapes (CSI sequences): nvidia-smi underlines the header row on a TTY, and captures keep them.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class TopologyParseError(ValueError):
    """The text is not a `nvidia-smi topo -m` matrix; the message names the line (1-based)."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}")


# NamedTuples, not dataclasses: every agent call loads this module, and `dataclasses` (with `inspect`) would
# be the costliest import of the facts verb.
class TopoRow(NamedTuple):
    """One device's row: its cells in column order and, for GPUs, where it sits relative to CPUs."""

    cells: Tuple[str, ...]
    cpu_affinity: Optional[str] = None
    numa_affinity: Optional[str] = None
    gpu_numa_id: Optional[str] = None


class TopoMatrix(NamedTuple):
    """A parsed matrix. `devices` are the column labels in order (GPUs first, then NICs). Never changed once
    made (`_replace` makes another), so the empty `nic_names` default can be one shared dict."""

    devices: Tuple[str, ...]
    rows: Dict[str, TopoRow]
    titles: Tuple[str, ...] = _TRAILING_TITLES
    nic_names: Dict[str, str] = {}  # noqa: RUF012 - never changed, see the docstring

    @property
    def gpu_count(self) -> int:
        return sum(1 for d in self.devices if _GPU_LABEL.match(d))

    def cell(self, a: str, b: str) -> str:
        """The cell between two devices, taken from the other row when a row was cut from the copy."""
        for row_label, col_label in ((a, b), (b, a)):
            row = self.rows.get(row_label)
            if row is not None:
                return row.cells[self.devices.index(col_label)]
        raise KeyError(f"neither {a} nor {b} has a row in the matrix")

    def gpu_cell(self, i: int, j: int) -> str:
        return self.cell(f"GPU{i}", f"GPU{j}")

    def nvlinks(self, i: int, j: int) -> int:
        """Bonded NVLinks between GPU i and GPU j (0 when they talk over PCIe)."""
        return nvlink_count(self.gpu_cell(i, j))


MAX_TOPOLOGY_BYTES = 1 << 20  # a real matrix is a few KiB; anything near this is not one


def read_topology_text(path: str) -> str:
    """The text of a captured matrix file, refusing what could hang or flood: not a regular file (a FIFO,
    /dev/zero), over MAX_TOPOLOGY_BYTES, or not UTF-8. Every refusal is an OSError with a plain strerror."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer; the check below then refuses it.
    with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        data = handle.read(MAX_TOPOLOGY_BYTES + 1)
    if len(data) > MAX_TOPOLOGY_BYTES:
        raise OSError(errno.EFBIG, "larger than 1 MiB, which no `nvidia-smi topo -m` output is", path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise OSError(errno.EILSEQ, "not UTF-8 text", path) from None


def parse_topology(text: str) -> TopoMatrix:
    """Parse `nvidia-smi topo -m` output as printed or as pasted; raise TopologyParseError on garbage."""
    lines = _ANSI.sub("", text).replace("\r\n", "\n").split("\n")
    index = _skip_preamble(lines)
    if index >= len(lines):
        raise TopologyParseError(len(lines), "no matrix found (expected a header row of GPU columns)")
    devices, titles = _parse_header(lines[index], index + 1)
    rows: Dict[str, TopoRow] = {}
    row_lines: Dict[str, int] = {}
    index += 1
    while index < len(lines) and _is_row(lines[index]):
        label, row = _parse_row(lines[index], index + 1, devices, titles)
        if label in rows:
            raise TopologyParseError(index + 1, f"row {label} appears twice")
        rows[label] = row
        row_lines[label] = index + 1
        index += 1
    missing_gpus = [d for d in devices if _GPU_LABEL.match(d) and d not in rows]
    if missing_gpus:
        ended = lines[index].strip() if index < len(lines) else ""
        why = ""
        if ended and not _is_legend(ended):
            why = f" (the matrix ends at {ended!r}, which is not a row)"
        raise TopologyParseError(index + 1, f"no row for {', '.join(missing_gpus)}{why}")
    matrix = TopoMatrix(devices=devices, rows=rows, titles=titles, nic_names=_nic_legend(lines[index:]))
    _check_symmetry(matrix, row_lines)
    return matrix


def _skip_preamble(lines: Sequence[str]) -> int:
    """Where the matrix's header row is: the first line of GPU columns with the affinity columns. What comes
    before it is a label a capture may start with (`GPU Topology:`, an indented heading, a shell line with a
    typo) and is skipped; without such a header the first line that is not blank nor a command is taken,
    so that the parser says what is wrong with it."""
    for index, line in enumerate(lines):
        tokens = line.split()
        if tokens and _GPU_LABEL.match(tokens[0]) and "CPU Affinity" in line:
            return index
    index = 0
    while index < len(lines) and (not lines[index].strip() or _COMMAND_LINE.match(lines[index])):
        index += 1
    return index


def _is_row(line: str) -> bool:
    """Whether a line after the header continues the matrix: a label and a cell. A note (`# die P100 ist
    GPU0`), a blank line, a legend or a prompt after the output ends it."""
    tokens = line.split()
    return len(tokens) >= 2 and bool(_CELL.match(tokens[1])) and not _is_legend(line)


def _is_legend(line: str) -> bool:
    return line.strip() in ("Legend:", "NIC Legend:")


def _parse_header(line: str, lineno: int) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    tokens = line.split()
    cut = next((k for k in range(len(tokens) - 1) if tokens[k : k + 2] == ["CPU", "Affinity"]), None)
    if cut is None:
        raise TopologyParseError(lineno, "header has no 'CPU Affinity' column; is this `nvidia-smi topo -m`?")
    devices = tuple(tokens[:cut])
    if not devices or not _GPU_LABEL.match(devices[0]):
        raise TopologyParseError(lineno, "header must start with GPU columns (GPU0 GPU1 ...)")
    if len(set(devices)) != len(devices):
        raise TopologyParseError(lineno, "header names a device column twice")
    trailing = " ".join(tokens[cut:])
    titles = tuple(t for t in _TRAILING_TITLES if t in trailing)
    if " ".join(titles) != trailing:
        raise TopologyParseError(lineno, f"unknown columns after the devices: {trailing!r}")
    return devices, titles


def _parse_row(
    line: str, lineno: int, devices: Tuple[str, ...], titles: Tuple[str, ...]
) -> Tuple[str, TopoRow]:
    tokens = line.split()
    label = tokens[0]
    if label not in devices:
        raise TopologyParseError(lineno, f"row label {label!r} is not a column of the header")
    cells = tokens[1 : 1 + len(devices)]
    if len(cells) < len(devices):
        raise TopologyParseError(lineno, f"row {label} has {len(cells)} cells, the header has {len(devices)}")
    for column, cell in ((devices[k], cells[k]) for k in range(len(devices))):
        if not _CELL.match(cell):
            raise TopologyParseError(lineno, f"{label}/{column}: unknown cell {cell!r}")
        if (cell == "X") != (column == label):
            raise TopologyParseError(lineno, f"{label}/{column}: 'X' belongs on the diagonal only")
    extra = tokens[1 + len(devices) :]
    if len(extra) > len(titles):
        raise TopologyParseError(lineno, f"row {label} has more values than columns: {' '.join(extra)!r}")
    values: Dict[str, Optional[str]] = {title: None for title in _TRAILING_TITLES}
    # Short rows lack their leading values: Windows prints no CPU or NUMA affinity, only the GPU NUMA ID,
    # so the values that are there belong to the last columns (a CPU affinity never reads a NUMA id).
    first = len(titles) - len(extra)
    values.update((titles[first + k], value) for k, value in enumerate(extra))
    return label, TopoRow(
        cells=tuple(cells),
        cpu_affinity=values["CPU Affinity"],
        numa_affinity=values["NUMA Affinity"],
        gpu_numa_id=values["GPU NUMA ID"],
    )


def _nic_legend(lines: Sequence[str]) -> Dict[str, str]:
    names: Dict[str, str] = {}
    for line in lines:
        match = _NIC_LEGEND_ENTRY.match(line)
        if match:
            names[match.group(1)] = match.group(2)
    return names


def _check_symmetry(matrix: TopoMatrix, row_lines: Dict[str, int]) -> None:
    labels = [d for d in matrix.devices if d in matrix.rows]
    for a in labels:
        for b in labels:
            ab = matrix.rows[a].cells[matrix.devices.index(b)]
            ba = matrix.rows[b].cells[matrix.devices.index(a)]
            if ab != ba:
                lineno = max(row_lines[a], row_lines[b])
                raise TopologyParseError(lineno, f"{a}/{b} is {ab} but {b}/{a} is {ba}")


if TYPE_CHECKING:
    Affinity = Tuple[Optional[str], Optional[str], Optional[str]]


def gpu_matrix(
    gpu_count: int,
    cell: Callable[[int, int], str],
    affinity: Callable[[int], Affinity] = lambda i: (None, None, None),
) -> TopoMatrix:
    """Build a GPU-only matrix from a cell function (e.g. from facts) so it can be printed or compared."""
    devices = tuple(f"GPU{i}" for i in range(gpu_count))
    rows = {}
    for i in range(gpu_count):
        cpu, numa, gpu_numa = affinity(i)
        cells = tuple("X" if i == j else cell(i, j) for j in range(gpu_count))
        rows[devices[i]] = TopoRow(cells=cells, cpu_affinity=cpu, numa_affinity=numa, gpu_numa_id=gpu_numa)
    return TopoMatrix(devices=devices, rows=rows)


def format_topology(matrix: TopoMatrix) -> str:
    """Print a matrix as `nvidia-smi topo -m` does: tab-separated, ` X ` on the diagonal, NIC legend after."""
    out: List[str] = ["\t" + "\t".join(matrix.devices + matrix.titles)]
    for label in matrix.devices:
        row = matrix.rows.get(label)
        if row is None:
            continue
        cells = [" X " if c == "X" else c for c in row.cells]
        by_title = {
            "CPU Affinity": row.cpu_affinity,
            "NUMA Affinity": row.numa_affinity,
            "GPU NUMA ID": row.gpu_numa_id,
        }
        values = [by_title[t] or "" for t in matrix.titles]
        out.append("\t".join([label, *cells, *values]).rstrip("\t"))
    if matrix.nic_names:
        out += ["", "NIC Legend:", ""]
        out += [f"  {nic}: {name}" for nic, name in sorted(matrix.nic_names.items(), key=_nic_order)]
    return "\n".join(out) + "\n"


def _nic_order(item: Tuple[str, str]) -> int:
    return int(item[0][3:])
