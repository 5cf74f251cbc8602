"""The goodput ledger of a real trainer run (tiny preset, CPU torch) through the real agent,
wrapper and tmux: the first job crashes at step 30 (``--debug-fault raise``) after its
checkpoint at step 20; a re-deploy under a new job id resumes from that checkpoint
(``--resume auto``) and finishes. The ledger joins both jobs into one run and counts the ten
steps computed twice as lost progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t
import uuid
from pathlib import Path

import pytest

from remote_payload.agent import goodput
from tests.agent_helper import run_agent
from tests.paths import REPO
from tests.waiting import wait_for_value

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not any((Path(d) / "tmux").exists() for d in os.environ.get("PATH", "").split(os.pathsep)),
    reason="needs tmux")]

TRAINER = ["python3", "-m", "remote_payload.trainer", "--preset", "tiny", "--device", "cpu",
           "--attn", "sdpa", "--compile", "off", "--seq-buckets", "48,96", "--log-every", "1",
           "--steps", "40", "--ckpt-every", "20", "--resume", "auto"]


@pytest.fixture
def agent(tmp_path: Path) -> t.Iterator[t.Callable[..., t.Any]]:
    socket = f"opsctl-test-goodput-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("TMUX", None)
    root = tmp_path / "root"

    def call(verb: str, *args: str) -> t.Any:
        return run_agent(root, verb, *args, tmux_socket=socket, env=env).data

    yield call
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def _launch_and_wait(agent: t.Callable[..., t.Any], out_dir: Path, *extra: str) -> str:
    spec = {"name": "gp", "python": sys.executable, "workdir": str(out_dir.parent),
            "command": [*TRAINER, "--out-dir", out_dir.name, *extra]}
    job = agent("launch", "--spec-json", json.dumps(spec))["job_id"]
    done = wait_for_value(lambda: agent("status", "--job", job),
                          lambda d: d["state"] in ("SUCCEEDED", "FAILED", "LOST"), 240,
                          interval=0.5)
    assert done["state"] in ("SUCCEEDED", "FAILED"), done
    return str(job)


def test_a_real_crash_and_re_deploy_make_one_run_with_the_lost_steps_counted(agent, tmp_path):
    out = tmp_path / "run"
    first = _launch_and_wait(agent, out, "--debug-fault", "raise", "--debug-fault-step", "30")
    second = _launch_and_wait(agent, out)
    doc = agent("goodput", "--job", second)
    assert doc["jobs"] == [first, second] and doc["out_dir"] == str(out)
    assert [a["ended"] for a in doc["attempts"]] == ["failed", "done: finished"]
    assert [(a["start_step"], a["last_step"], a["lost_steps"]) for a in doc["attempts"]] == [
        (0, 30, 10), (20, 40, 0)]
    assert (doc["crashes"], doc["redeploys"], doc["surviving_steps"]) == (1, 1, 40)
    assert [p["phase"] for p in doc["attempts"][1]["startup"]][-2:] == ["resumed", "first_step"]
    causes = doc["causes"]
    assert sum(causes.values()) == pytest.approx(doc["wall_s"], abs=0.01)
    assert all(causes[c] > 0 for c in (goodput.PRODUCTIVE, goodput.STARTUP, goodput.LOST,
                                       goodput.QUEUE_WAIT, goodput.RESTART_GAP))
    # every checkpoint says how long it blocked training (blocked_s, the final one seconds)
    assert not any("no duration" in note for note in doc["unknown"]), doc["unknown"]
    assert causes[goodput.CHECKPOINT] > 0
    assert doc["effective_tok_s"] > 0
