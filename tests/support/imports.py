"""The package's import graph, read from the source with `ast` (nothing is imported): every module of
`mgpu_provision/` and the package modules it imports, relative imports resolved.

One reading for the tests that hold the layout's rules (tests/unit/test_node_boundary.py: what ships stays
shippable and nothing outside node/ imports node; tests/unit/test_architecture_imports.py: each folder
imports only what docs/ARCHITECTURE.md allows) and for `tools/import-graph`, which prints the figures.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mgpu_provision"


def module_name(path: Path, package_dir: Path = PACKAGE) -> str:
    """`mgpu_provision.plan.host` of `mgpu_provision/plan/host.py` (a package is its `__init__`'s name)."""
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path, package_dir: Path = PACKAGE) -> list[str]:
    """The package a module's relative imports start from, as parts."""
    return [package_dir.name, *path.relative_to(package_dir).parent.parts]


def imported_modules(source: str, package: list[str], modules: Iterable[str] = ()) -> list[str]:
    """Absolute names of every module `source` imports, at any depth (a function's deferred import
    counts). `from X import a` names `X.a` where that is one of `modules` (a submodule), else `X`."""
    known = set(modules)
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            subs = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in known]
            names += subs if len(subs) == len(node.names) else [module, *subs]
    return names


def package_files(package_dir: Path = PACKAGE) -> list[Path]:
    return sorted(package_dir.rglob("*.py"))


def import_graph(package_dir: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package's name stands for its `__init__`)."""
    files = package_files(package_dir)
    modules = {module_name(path, package_dir) for path in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        name = module_name(path, package_dir)
        found = imported_modules(path.read_text(), package_of(path, package_dir), modules)
        graph[name] = {target for target in found if target in modules and target != name}
    return graph
