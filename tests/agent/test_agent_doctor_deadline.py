"""The agent's ``doctor`` verb answers within its ``--deadline`` with a row for every check,
however its children behave: an nvidia-smi and a torch that hang and ignore SIGTERM are ended
in time (procgroup), and a check with no time left is a ``skip`` row that says so. Real
processes on this machine; only the driver's presence is stood in for."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from opsctl.ops.doctor import AGENT_ROWS
from remote_payload.agent import doctor

HANGS = "#!/bin/sh\ntrap '' TERM\nsleep 60 & wait\nsleep 60\n"


@pytest.fixture
def wedged_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A driver is loaded, and nvidia-smi and the torch build's python hang, deaf to SIGTERM."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("nvidia-smi", "python"):
        (bin_dir / name).write_text(HANGS)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(doctor, "driver_version", lambda: "580.159.04")
    monkeypatch.setattr(doctor, "torch_python", lambda root: str(bin_dir / "python"))
    return tmp_path


@pytest.mark.parametrize("deadline", [4.0, 9.0])
def test_doctor_answers_within_its_deadline_with_every_row(wedged_gpu, deadline):
    start = time.monotonic()
    doc = doctor.run_all(str(wedged_gpu), expect_gpus=1, torch_timeout_s=60.0, deadline_s=deadline)
    took = time.monotonic() - start
    assert took <= deadline + 0.5, f"doctor took {took:.1f} s of its {deadline:g} s"
    rows = {r["name"]: r for r in doc["rows"]}
    assert tuple(rows) == AGENT_ROWS
    assert rows["gpu-count"]["status"] == "fail" and "did not answer within" in rows["gpu-count"]["evidence"]
    for name in ("torch-matmul", "leftover-gpu-processes"):
        assert rows[name]["status"] in ("skip", "fail")
        if rows[name]["status"] == "skip":
            assert "deadline left no time" in rows[name]["reason"]
    for row in doc["rows"]:  # durations as doctor prints them: never 13.8869 s
        for word in (row["reason"] + " " + row.get("evidence", "")).split():
            if word.replace(".", "", 1).isdigit() and "." in word:
                assert len(word.split(".")[1]) <= 1, row


def test_without_a_deadline_the_verb_runs_every_check(wedged_gpu, monkeypatch):
    from remote_payload.agent import gpus

    monkeypatch.setattr(doctor, "SMI_TIMEOUT_S", 0.5)
    monkeypatch.setattr(gpus, "SMI_TIMEOUT_S", 0.5)
    doc = doctor.run_all(str(wedged_gpu), expect_gpus=1, torch_timeout_s=1.0, torch=False)
    rows = {r["name"]: r for r in doc["rows"]}
    assert rows["torch-matmul"]["reason"] == "--no-torch"
    assert "deadline" not in rows["leftover-gpu-processes"]["reason"]
