"""What ships to nodes stays shippable: Python 3.8 syntax, the standard library, nothing of the control side.

Shipped: `node/`, `protocol.py` and the judge (`judge/`), which the node imports and which imports no node.

The agent runs on whatever `python3` a GPU box has, with nothing installed: a control-side import (pydantic,
Fabric, another package module) or newer syntax in node/ would break every node at once, so it is checked here
rather than found on a fleet.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mgpu_provision"
JUDGE = sorted((PACKAGE / "judge").rglob("*.py"))
SHIPPED = [
    *sorted((PACKAGE / "node").rglob("*.py")),
    *JUDGE,
    PACKAGE / "protocol.py",
    PACKAGE / "__init__.py",
]
ALLOWED_PACKAGE_MODULES = {"mgpu_provision", "mgpu_provision.protocol"}


def imported_modules(source: str, package: list[str]) -> list[str]:
    """Absolute names of every module `source` imports (relative imports resolved against `package`)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.append(module)
    return names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_shipped_module_parses_as_python_3_8(path: Path) -> None:
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


# What shipped code may import besides the stdlib: shipped modules (by prefix), pynvml (shipped beside it) and
# torch (imported inside smoke's ranks). The judge, which the node imports, may import only itself and the
# protocol (a leaf): a judge importing node code would make the two one circle.
NODE_MAY_IMPORT = ("mgpu_provision.node", "mgpu_provision.judge", "pynvml", "torch")
JUDGE_MAY_IMPORT = ("mgpu_provision.judge",)


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
    package = ["mgpu_provision", *path.relative_to(PACKAGE).parent.parts]
    assert outside_imports(path.read_text(), package) == [], path.name


def test_control_side_and_third_party_imports_are_caught() -> None:
    source = "from ..spec import models\nfrom .. import protocol\nimport yaml\nfrom . import procs\n"
    assert outside_imports(source, ["mgpu_provision", "node"]) == ["mgpu_provision.spec", "yaml"]


@pytest.mark.parametrize("path", JUDGE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_judge_imports_only_the_standard_library_itself_and_the_protocol(path: Path) -> None:
    package = ["mgpu_provision", *path.relative_to(PACKAGE).parent.parts]
    assert outside_imports(path.read_text(), package, JUDGE_MAY_IMPORT) == [], path.name


def test_a_judge_importing_node_code_is_caught() -> None:
    source = "from ..node.nvidia import topology\nfrom .. import protocol\nfrom .records import Finding\n"
    caught = outside_imports(source, ["mgpu_provision", "judge"], JUDGE_MAY_IMPORT)
    assert caught == ["mgpu_provision.node.nvidia"]
