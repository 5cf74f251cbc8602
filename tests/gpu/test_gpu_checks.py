"""The integration checks that need real NVIDIA GPUs, as tests: each runs its check script
(beside this file, also runnable by hand with more options) in a fresh process and states what
it must show. Skipped without a GPU; the two-GPU checks without two.

    python3 -m pytest tests/gpu            # on the H200 machine (`nvidia-h200-x2` for all four)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: NCCL's NVLink multicast is off on the lent machines (their KINDS.md says why).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "LOST")


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


GPUS = _gpu_count()
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no NVIDIA GPU (nvidia-smi lists none)")
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 GPUs, this machine has {GPUS}")


def run_check(script: str, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python3 tests/gpu/SCRIPT ARGS`` from the repository root; its output is printed so a
    failure shows it (pytest captures it)."""
    env = {**os.environ, **NCCL_ENV, "PYTHONUNBUFFERED": "1"}
    env.pop("TMUX", None)
    proc = subprocess.run([sys.executable, str(HERE / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    print(proc.stdout[-20000:], proc.stderr[-20000:], sep="\n")
    return proc


def test_the_agent_drives_a_trainer_job_on_a_gpu_from_launch_to_stop(tmp_path: Path) -> None:
    proc = run_check("agent_on_gpu.py", "--out", str(tmp_path), timeout_s=900)
    assert proc.returncode == 0
    record = json.loads((tmp_path / "agent_gpu.json").read_text())
    states = [t["key"][0] for t in record["transitions"]]
    assert "RUNNING" in states and not set(states) & {"FAILED", "LOST"}
    running = record["status_running"]["data"]
    assert running["last_step"]["tok_s"] > 0
    assert running["gpus"], "the GPU table from nvidia-smi is empty"
    assert record["stop"]["ok"], record["stop"]
    assert record["status_final"]["data"]["state"] == "CANCELLED"


def test_the_job_history_samples_the_gpus_while_a_job_runs(tmp_path: Path) -> None:
    proc = run_check("history_on_gpu.py", "--out", str(tmp_path), "--seconds", "16", timeout_s=300)
    assert proc.returncode == 0
    report = json.loads((tmp_path / "history-gpu-smoke.json").read_text())
    assert report["state"] == "SUCCEEDED"
    assert report["gpus"] and report["history_verb"]["rows"] > 0
    assert "gpu_util" in report["history_verb"]["columns"]


@two_gpus
def test_every_multi_gpu_layout_trains_resumes_stops_and_names_a_hang(tmp_path: Path) -> None:
    out = tmp_path / "multigpu.json"
    proc = run_check("multigpu_layouts.py", "--out", str(out), timeout_s=1500)
    assert proc.returncode == 0
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    for name in ("warmup-colocated", "warmup-split", "split", "split-resume", "colocated"):
        assert runs[name]["rc"] == 0, (name, runs[name].get("tail"))
    assert runs["split-raise"]["rc"] not in (0, None), "the drafter outlived the failed target rank"
    if "agent-hang" in runs:
        assert runs["agent-hang"]["hang_summary"], "the agent did not name the hang"
        assert runs["agent-hang"]["stacks_verb"]["ok"]


@two_gpus
def test_two_torchrun_nodes_train_one_run_in_both_topologies(tmp_path: Path) -> None:
    out = tmp_path / "multinode.json"
    proc = run_check("multinode_torchrun.py", "--out", str(out), timeout_s=900)
    assert proc.returncode == 0, "a topology did not train on both nodes with agreeing losses"
