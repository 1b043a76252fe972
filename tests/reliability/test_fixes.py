"""Regression tests for the bugs the reliability work found in the control side (each fixed minimally)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_provision.errors import SpecError
from mgpu_provision.rig import load_rig
from tests.support.trial import Trial


@pytest.mark.parametrize("char", ["\x80", "\x9f", "\ufffe"])
def test_characters_yaml_refuses_are_a_located_spec_error(tmp_path: Path, trial: Trial, char: str) -> None:
    # Found by the loader fuzz test: PyYAML's ReaderError escaped load_rig as a traceback.
    trial.area, trial.tried = (
        "fuzz",
        f"rig loader: character U+{ord(char):04X} (found by fuzzing: a traceback)",
    )
    trial.expect = "SpecError at file:line:col"
    trial.count("examples")
    rig = tmp_path / "rig.yaml"
    rig.write_text(f"version: 1\nhosts: [a{char}]\n", encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_rig(rig)
    assert str(caught.value) == (
        f"{rig}:2:10: control character U+{ord(char):04X} in the text; is this a binary file?"
    )


@pytest.mark.parametrize(
    "key", ["profile_d", "environment_file", "launcher", "xorg_conf", "state_dir", "systemd_dir"]
)
def test_managed_paths_with_dot_dot_are_refused(tmp_path: Path, trial: Trial, key: str) -> None:
    # Found by the injection test: `files.state_dir: /var/lib/x/../../../tmp/y` put the lock in /tmp.
    trial.area, trial.tried = "injection", f"files.{key} = /etc/x/../../tmp/y (path traversal)"
    trial.expect = "SpecError naming the field and '..'"
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "version: 1\nhosts: [{name: a, rig: r}]\nrigs: {r: {gpus: {model: X, count: 1}}}\n"
        f"files: {{{key}: /etc/x/../../tmp/y}}\n"
    )
    with pytest.raises(SpecError) as caught:
        load_rig(rig)
    assert str(caught.value) == (
        f"{rig}:4:{11 + len(key)}: files.{key}: '/etc/x/../../tmp/y' contains '..': name the managed file's "
        "folder directly, without climbing out"
    )
    trial.count("examples")
