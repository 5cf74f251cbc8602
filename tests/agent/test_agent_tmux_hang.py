"""A target whose ``tmux`` hangs (a wedged server, a broken build on a direct host's PATH):
the launch fails within the agent's tmux deadline, naming tmux, and the job it made is
FAILED at once, never left PENDING for status to find later."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.agent_helper import agent_env, run_agent


def test_a_hanging_tmux_fails_the_launch_naming_tmux_and_the_job_is_failed(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hang = bin_dir / "tmux"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    env = {**agent_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    root = tmp_path / "root"
    spec = {"name": "t", "command": [sys.executable, "-c", "print('never')"],
            "python": sys.executable}
    run = run_agent(root, "launch", "--spec-json", json.dumps(spec), env=env, timeout=60,
                    tmux_socket=f"opsctl-test-hang-{os.getpid()}")
    error = run.reply["error"]
    assert error["type"] == "TmuxFailed", run.reply
    assert "tmux" in error["message"] and "no answer within 3 s" in error["message"], error
    assert run.wall_s < 30, run.wall_s
    (job,) = [p for p in (root / "jobs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    status = json.loads((job / "status.json").read_text())
    assert status["state"] == "FAILED", status
