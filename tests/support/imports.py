"""The package's import graph, read from the source with `ast` (nothing is imported): every module of
`mgpu_provision/` and the package modules it imports, relative imports resolved.

One reading for the tests that hold the layout's rules (tests/unit/test_node_boundary.py: what ships stays
shippable and nothing outside node/ imports node; tests/unit/test_architecture_imports.py: each folder
imports only what docs/ARCHITECTURE.md allows) and for `tools/import-graph`, which prints the figures.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mgpu_provision"
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"


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


def write_package(folder: Path, files: dict[str, str]) -> Path:
    """A stand-in `mgpu_provision/` under `folder` with these files (path -> text), for the rule tests'
    own checks that a breach is caught."""
    package = folder / "mgpu_provision"
    for rel, text in files.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    return package


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


def unit_of(module: str, units: Iterable[str]) -> str | None:
    """The unit of docs/ARCHITECTURE.md's import rules a module belongs to: the longest of `units` (a folder
    `plan/`, a module `cli.py`, relative to the package) that holds it; None when none does (the package
    marker `mgpu_provision/__init__.py`)."""
    path = "/".join(module.split(".")[1:])
    found = [u for u in units if u == path + ".py" or (u.endswith("/") and (path + "/").startswith(u))]
    return max(found, key=len) if found else None


def unit_edges(graph: dict[str, set[str]], units: Iterable[str], within: str = "") -> dict[str, set[str]]:
    """Unit -> the other units its modules import, for the modules under `within` (a folder; every module
    when empty) and the imports that stay under it."""
    chosen = list(units)
    prefix = "mgpu_provision." + within.strip("/").replace("/", ".") if within else "mgpu_provision"
    edges: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if not _under(module, prefix):
            continue
        source = unit_of(module, chosen)
        for target in targets:
            goal = unit_of(target, chosen) if _under(target, prefix) else None
            if source is not None and goal is not None and goal != source:
                edges.setdefault(source, set()).add(goal)
    return edges


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each set of modules that reach one another (Tarjan's strongly connected
    components of more than one module, and a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def climbing(edges: dict[str, set[str]], order: list[str]) -> list[tuple[str, str]]:
    """The edges that point up `order` (a unit importing one listed above it)."""
    rank = {unit: n for n, unit in enumerate(order)}
    return sorted((a, b) for a, targets in edges.items() for b in targets if rank[b] < rank[a])


def longest_functions(package_dir: Path = PACKAGE, count: int = 10) -> list[tuple[int, str]]:
    """The `count` longest functions and methods of the package: (lines, `module:qualified.name`)."""
    found = [item for path in package_files(package_dir) for item in _functions(path, package_dir)]
    return sorted(found, key=lambda item: (-item[0], item[1]))[:count]


def _functions(path: Path, package_dir: Path) -> list[tuple[int, str]]:
    name = module_name(path, package_dir)
    found: list[tuple[int, str]] = []
    pending: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text()), "")]
    while pending:
        node, prefix = pending.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualified = prefix + child.name
                if not isinstance(child, ast.ClassDef) and child.end_lineno is not None:
                    found.append((child.end_lineno - child.lineno + 1, f"{name}:{qualified}"))
                pending.append((child, qualified + "."))
    return found


_TABLE = re.compile(
    r"<!-- import rules: (?P<title>[^>]*?) -->\n\| unit \| imports \|\n\|---\|---\|\n(?P<rows>(?:\|.*\|\n)+)"
)
_NAME = re.compile(r"`([^`]+)`")


def rule_tables(text: str) -> dict[str, dict[str, set[str]]]:
    """Each table of import rules in `text`, by title: unit -> the units it imports, in the table's order."""
    tables: dict[str, dict[str, set[str]]] = {}
    for match in _TABLE.finditer(text):
        rows: dict[str, set[str]] = {}
        for line in match["rows"].splitlines():
            unit, imports = line.strip("|").split("|")
            (name,) = _NAME.findall(unit)
            rows[name] = set(_NAME.findall(imports))
        tables[match["title"]] = rows
    return tables
