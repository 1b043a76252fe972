"""What ships to nodes stays shippable: Python 3.8 syntax, the standard library, nothing of the control side;
and the line between the two ends holds: nothing outside `node/` imports the node package.

Shipped: `node/`, `protocol.py`, the judge (`judge/`) and the catalog (`catalog/`): the node imports both,
and neither imports the node. The control side shares the judge and the catalog, never the agent's code.

The agent runs on whatever `python3` a GPU box has, with nothing installed: a control-side import (pydantic,
Fabric, another package module) or newer syntax in node/ would break every node at once, so it is checked here
rather than found on a fleet.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from mgpu_provision.fleet.bundle import agent_files
from tests.support.imports import (
    PACKAGE,
    import_graph,
    imported_modules,
    package_files,
    package_of,
    write_package,
)

JUDGE = sorted((PACKAGE / "judge").rglob("*.py"))
CATALOG = sorted((PACKAGE / "catalog").rglob("*.py"))
SHIPPED = [
    *sorted((PACKAGE / "node").rglob("*.py")),
    *JUDGE,
    *CATALOG,
    PACKAGE / "protocol.py",
    PACKAGE / "typing_lite.py",
    PACKAGE / "__init__.py",
]
ALLOWED_PACKAGE_MODULES = {"mgpu_provision", "mgpu_provision.protocol", "mgpu_provision.typing_lite"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_shipped_module_parses_as_python_3_8(path: Path) -> None:
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


# What shipped code may import besides the stdlib: shipped modules (by prefix), pynvml (shipped beside it) and
# torch (imported inside smoke's ranks). The judge and the catalog, which the node imports, may import only
# themselves and the protocol (a leaf), and the catalog the judge: either importing node code would make
# it one circle with the node, and put the node back under the control side that imports them.
NODE_MAY_IMPORT = ("mgpu_provision.node", "mgpu_provision.judge", "mgpu_provision.catalog", "pynvml", "torch")
JUDGE_MAY_IMPORT = ("mgpu_provision.judge",)
CATALOG_MAY_IMPORT = ("mgpu_provision.catalog", "mgpu_provision.judge")


def outside_imports(source: str, package: list[str], allowed: tuple[str, ...] = NODE_MAY_IMPORT) -> list[str]:
    """The imports a shipped module may not make: neither stdlib, the package marker, the protocol nor one
    of `allowed` (a module or a module inside it)."""
    return [
        name
        for name in imported_modules(source, package)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name not in ALLOWED_PACKAGE_MODULES
        and not any(name == prefix or name.startswith(prefix + ".") for prefix in allowed)
    ]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_shipped_module_imports_only_the_standard_library_and_node_code(path: Path) -> None:
    assert outside_imports(path.read_text(), package_of(path)) == [], path.name


def test_control_side_and_third_party_imports_are_caught() -> None:
    source = "from ..spec import models\nfrom .. import protocol\nimport yaml\nfrom . import procs\n"
    assert outside_imports(source, ["mgpu_provision", "node"]) == ["mgpu_provision.spec", "yaml"]


@pytest.mark.parametrize("path", JUDGE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_judge_imports_only_the_standard_library_itself_and_the_protocol(path: Path) -> None:
    assert outside_imports(path.read_text(), package_of(path), JUDGE_MAY_IMPORT) == [], path.name


@pytest.mark.parametrize("path", CATALOG, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_catalog_imports_only_the_standard_library_itself_the_judge_and_the_protocol(path: Path) -> None:
    assert outside_imports(path.read_text(), package_of(path), CATALOG_MAY_IMPORT) == [], path.name


def test_a_judge_importing_node_code_is_caught() -> None:
    source = "from ..node.nvidia import topology\nfrom .. import protocol\nfrom .records import Finding\n"
    caught = outside_imports(source, ["mgpu_provision", "judge"], JUDGE_MAY_IMPORT)
    assert caught == ["mgpu_provision.node.nvidia"]


def test_a_catalog_importing_node_code_is_caught() -> None:
    source = "from ..node.packages import apt\nfrom ..judge import topology\nfrom . import names\n"
    caught = outside_imports(source, ["mgpu_provision", "catalog"], CATALOG_MAY_IMPORT)
    assert caught == ["mgpu_provision.node.packages"]


def test_every_shipped_module_is_in_the_agent_bundle() -> None:
    """A shipped package the bundle leaves out imports on this machine and fails on every node."""
    bundled = set(agent_files())
    assert {f"mgpu_provision/{p.relative_to(PACKAGE).as_posix()}" for p in SHIPPED} <= bundled


def node_importers(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> node module` for every module outside the node package that imports one."""

    def in_node(name: str) -> bool:
        return name == "mgpu_provision.node" or name.startswith("mgpu_provision.node.")

    return sorted(f"{m} -> {t}" for m, found in graph.items() if not in_node(m) for t in found if in_node(t))


def test_nothing_outside_node_imports_the_node_package() -> None:
    """The control side shares the catalog and the judge with the agent, never the agent's own modules (as
    ansible-core's controller imports `module_utils/`, never `modules/`): a table the plan needs from a
    node module belongs in catalog/."""
    assert package_files(), PACKAGE
    assert node_importers(import_graph()) == []


def test_an_import_of_node_code_from_outside_is_caught(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "node/__init__.py": "",
            "node/host/__init__.py": "",
            "node/host/machine.py": "from ...catalog import cpulist\n",
            "catalog/__init__.py": "",
            "catalog/cpulist.py": "",
            "plan/__init__.py": "",
            "plan/slurm.py": "def cores():\n    from ..node.host import machine\n",
            "rig/__init__.py": "from .. import node\n",
        },
    )
    assert node_importers(import_graph(package)) == [
        "mgpu_provision.plan.slurm -> mgpu_provision.node.host.machine",
        "mgpu_provision.rig -> mgpu_provision.node",
    ]
