"""The agent also runs on Python 3.10 (Ubuntu 22.04 GPU containers), not only Debian's 3.11.

Runs the whole job cycle (launch -> status -> exit recorded) with a 3.10 interpreter when
this machine has one; the other agent tests cover 3.11 in depth.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import typing as t
import uuid

import pytest

from tests.agent_helper import run_agent
from tests.paths import REPO
from tests.waiting import wait_for_value

CANDIDATES = [*sorted(glob.glob("/root/.pyenv/versions/3.10*/bin/python3")), shutil.which("python3.10"),
              "/usr/bin/python3.10"]


def _is_310(python: str | None) -> bool:
    if not python or not os.access(python, os.X_OK):
        return False
    check = "import sys; sys.exit(sys.version_info[:2] != (3, 10))"
    return subprocess.run([python, "-c", check], capture_output=True, check=False).returncode == 0


PY310 = next((p for p in CANDIDATES if _is_310(p)), None)

pytestmark = pytest.mark.skipif(PY310 is None, reason="no Python 3.10 interpreter on this machine")


def test_a_job_runs_and_ends_succeeded_under_a_python_3_10_agent(tmp_path):
    socket = f"opsctl-test-py310-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPSCTL_TMUX_SOCKET": socket}
    env.pop("TMUX", None)

    def agent(verb: str, *args: str) -> dict:
        return run_agent(tmp_path, verb, *args, python=PY310, tmux_socket=socket, timeout=60).reply

    try:
        spec = {"job_id": "py310-20261129-000000-abcd", "name": "py310",
                "command": ["sh", "-c", "echo hello from 3.10"], "env": {}, "workdir": str(tmp_path),
                "healthy_when": {"started": True}, "timeout_s": 30}
        launched = agent("launch", "--spec-json", json.dumps(spec))
        assert launched["ok"], launched

        def status() -> dict[str, t.Any]:
            st = agent("status")
            assert st["ok"], st
            return st

        st = wait_for_value(status, lambda st: st["data"]["state"] == "SUCCEEDED", 15)
        assert (st["data"]["state"], st["data"]["exit_code"]) == ("SUCCEEDED", 0)
        assert "hello from 3.10" in st["data"]["output_tail"]
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)
