"""tests/gpu/whole_chain.py, the GPU machine's whole-chain check, run here on CPU against this
machine's own OpenSSH (its own sshd on a free loopback port, a private opsctl root, the tiny
preset), so the script a device run depends on cannot rot between device runs.

It needs what the sandbox needs (root, openssh-server, tmux, torch on CPU) but not the sandbox
itself: the script brings up its own sshd and uses this machine as a direct target.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "gpu" / "whole_chain.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/sbin/sshd").exists() or shutil.which("tmux") is None,
                       reason="needs this machine's OpenSSH server and tmux"),
    pytest.mark.skipif(os.geteuid() != 0, reason="sshd's privilege separation needs root"),
]


def test_the_whole_chain_runs_on_cpu_through_this_machines_openssh(tmp_path: Path) -> None:
    out = tmp_path / "chain.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TMUX", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--sshd-prefix", "/",
                           "--device", "cpu", "--preset", "tiny", "--goodput-s", "3", "--redeploy-s", "3",
                           "--probe-threads", "1",
                           "--budget-s", "300", "--work", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=420, check=False)
    print(proc.stdout[-20000:], proc.stderr[-20000:], sep="\n")
    doc = json.loads(out.read_text())
    assert proc.returncode == 0 and doc["ok"] is True, doc.get("failed_checks") or doc.get("failure")
    names = [c["name"] for c in doc["checks"]]
    for needed in ("host trust prints the sshd's fingerprint and records it",
                   "doctor: pct is not applicable on a direct host",
                   "deploy: the job is healthy", "status: loss and tok/s are the trainer's own",
                   "stacks shows the job's Python frames",
                   "the restart resumed from a checkpoint before the crash",
                   "the re-deploy resumed from the stop's checkpoint",
                   "no process of the job is left", "probe compile-race: the guarded mode passes"):
        assert needed in names, (needed, names)
    res = doc["results"]
    assert res["trust"]["fingerprint"].startswith("SHA256:")
    assert res["goodput_scenario"]["status_after_restart"]["attempt"] == 2
    assert res["goodput_scenario"]["checkpoints"], "the checkpoint events' blocked_s"
    assert set(doc["timings_s"]) >= {"setup", "deploy_to_healthy", "stop", "probe_compile_race"}
    # everything it made lives in its work dir, removed at the end
    assert not list(tmp_path.glob("whole-chain-*"))
