"""The tests' own layout: what test modules share lives in `tests/support/`, and no test module imports
another (a test module imported for its helpers drags its fixtures, imports and tests into every
importer, and an edit to its tests breaks unrelated files). The tests of the rig package are named for it."""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import imported_modules

TESTS = Path(__file__).resolve().parents[1]


def is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def outside_support(source: str, package: list[str]) -> list[str]:
    """The modules of `tests` that `source` imports other than `tests.support` and its modules, and any
    test module it imports by its bare name (pytest's rootdir on sys.path makes that work, by accident)."""
    return [
        name
        for name in imported_modules(source, package)
        if (name == "tests" or name.startswith("tests.") or is_test_module(Path(name.split(".")[0] + ".py")))
        and name != "tests.support"
        and not name.startswith("tests.support.")
    ]


def test_no_test_module_imports_another_test_module() -> None:
    found = {}
    for path in sorted(p for p in TESTS.rglob("*.py") if is_test_module(p)):
        imported = outside_support(path.read_text(), ["tests", *path.relative_to(TESTS).parent.parts])
        if imported:
            found[str(path.relative_to(TESTS))] = imported
    assert found == {}


def test_a_test_module_importing_another_is_caught() -> None:
    source = (
        "from tests.unit.test_agent_bundle import run_agent\nfrom tests import hosts\n"
        "from tests.support import nvml\nfrom . import test_judge\nfrom test_rig_rules import problems_of\n"
    )
    assert outside_support(source, ["tests", "unit"]) == [
        "tests.unit.test_agent_bundle",
        "tests",
        "tests.unit",
        "test_rig_rules",
    ]


def test_support_holds_no_test_module() -> None:
    assert not [p.name for p in (TESTS / "support").glob("*.py") if is_test_module(p)]


def test_the_rig_package_tests_are_named_for_it() -> None:
    """`spec/` became `rig/`: a test file still named for the old package is not found where it belongs."""
    assert not sorted(p.name for p in TESTS.rglob("test_spec_*.py"))
