"""The kernel's CPU list form ("0-3,8-11"), as sysfs prints online CPUs and NUMA nodes and NVML prints a
GPU's CPU affinity: the node reads it from sysfs, the plan reads it from facts to bind GPUs to cores.

Shipped to nodes: Python 3.8, standard library only.
"""


from __future__ import annotations

from ..typing_lite import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import List


def parse_cpu_list(text: str) -> List[int]:
    """A kernel CPU list ("0-3,8-11") as ids; an empty or malformed part is skipped."""
    cpus: List[int] = []
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        try:
            cpus.extend(range(int(low), int(high or low) + 1))
        except ValueError:
            continue
    return cpus
