"""The package's own metadata and the test suite's output: nothing for pip or pytest to warn about."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_reads_without_deprecation_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message).splitlines()[0] for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"


@pytest.mark.torch
def test_importing_torch_under_the_suites_config_prints_no_numpy_warning(tmp_path: Path) -> None:
    """torch warns at import when NumPy is absent; nothing here converts tensors to NumPy, so it is noise."""
    pytest.importorskip("torch")
    (tmp_path / "test_torch_import.py").write_text("def test_import():\n    import torch  # noqa: F401\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), str(tmp_path / "test_torch_import.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NumPy" not in done.stdout + done.stderr, done.stdout
