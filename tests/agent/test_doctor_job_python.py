"""doctor's CUDA row runs the python a job would run, opsctl's torch build or not.

A container whose torch was installed by hand (no ``envs/current``) runs its jobs on its own
``python3``; the row used to skip there, though the job and the probe ran that very torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from remote_payload.agent import doctor


def _python3_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, site: bool) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python3"
    flags = "" if site else " -S"  # -S: no site-packages, so no torch
    shim.write_text(f"#!/bin/sh\nexec {sys.executable}{flags} \"$@\"\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    return shim


def test_without_an_opsctl_build_the_row_runs_the_containers_python3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    shim = _python3_on_path(tmp_path, monkeypatch, site=True)
    row = doctor.check_torch("550.54", str(tmp_path / "opt-opsctl"), 120)
    # this machine's torch is a CPU build: it ran, and it says it sees no GPU
    assert row["status"] == "fail" and row["reason"] == "torch sees no GPU"
    assert row["evidence"].startswith(f"{shim}: torch ")


def test_a_python3_without_torch_is_a_skip_that_names_it_and_the_real_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shim = _python3_on_path(tmp_path, monkeypatch, site=False)
    row = doctor.check_torch("550.54", str(tmp_path / "opt-opsctl"), 60)
    assert row["status"] == "skip"
    assert row["reason"] == f"no torch in {shim}, the python a job would run"
    assert row["fix"].startswith("opsctl swap-torch VARIANT --host H --ct N")


def test_no_python_at_all_is_a_skip_with_the_real_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    row = doctor.check_torch("550.54", str(tmp_path / "opt-opsctl"), 60)
    assert row["status"] == "skip" and row["fix"].startswith("opsctl swap-torch ")
