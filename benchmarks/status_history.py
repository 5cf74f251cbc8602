"""What the job history costs ``status``: the agent verb with and without a week's history.

Launches one short local job with the real agent (tmux, wrapper), then times the ``status`` verb
(in-process ``status_document`` and the whole ``python3 -m remote_payload.agent status`` process,
as ``pct exec`` runs it) with no ``history.json`` and with a full one (a week of 2 s GPU samples
and 10 s step events, bounded to CAP rows). Prints one JSON document.

    python3 benchmarks/status_history.py [OUT.json]   # the result (benchmarks/harness.py), else stdout
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402
from remote_payload.agent import history  # noqa: E402
from remote_payload.agent.verbs import jobs as verbs_jobs  # noqa: E402


def week_history() -> history.History:
    h = history.History()
    t0 = time.time() - 7 * 86400
    for i in range(7 * 86400 // 2):
        h.add(t0 + 2 * i, {"gpu_util": 90.0, "gpu_mem_gib": 120.0})
        if i % 5 == 0:
            h.add(t0 + 2 * i, {"loss": 2.0, "tok_s": 20000.0, "mfu": 0.4, "mem_gib": 70.0,
                               "feature_wait_pct": 40.0})
    for i in range(64):
        h.mark(t0 + i * 3600, "compile", "drafter_step")
    return h


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="opsctl-bench-"))
    socket = f"opsctl-bench-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPSCTL_TMUX_SOCKET": socket}
    env.pop("TMUX", None)
    agent = [sys.executable, "-m", "remote_payload.agent", "--root", str(root)]
    spec = {"job_id": "bench-20261130-000000-abcd", "name": "bench",
            "command": ["sh", "-c", "echo done"], "env": {}, "workdir": str(root),
            "healthy_when": {"started": True}, "timeout_s": 30}
    try:
        subprocess.run([*agent, "launch", "--spec-json", json.dumps(spec)], env=env, check=True,
                       capture_output=True)
        job = root / "jobs" / spec["job_id"]
        deadline = time.time() + 20
        while not (job / "exit_code").exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        out: dict[str, object] = {}
        full = week_history()
        for label, doc in (("without_history", None), ("with_week_history", full.columns())):
            (job / history.FILE).unlink(missing_ok=True)
            if doc is not None:
                (job / history.FILE).write_text(json.dumps(doc, separators=(",", ":")))
            os.environ["OPSCTL_TMUX_SOCKET"] = socket
            inproc = harness.timed(
                lambda: verbs_jobs.status_document(str(root), spec["job_id"], lines=20), runs=200)
            proc = harness.timed(lambda: subprocess.run([*agent, "status", "--lines", "20"], env=env,
                                                        capture_output=True), runs=30)
            r = subprocess.run([*agent, "status", "--lines", "20"], env=env, capture_output=True)
            reply = json.loads(r.stdout)
            out[label] = {"status_document_ms": round(inproc.median_s * 1e3, 3),
                          "agent_process_ms": round(proc.median_s * 1e3, 1),
                          "reply_bytes": len(r.stdout),
                          "history_rows": len((reply["data"].get("history") or {}).get("t") or [])}
        out["history_file_bytes"] = len((job / history.FILE).read_bytes())
        out["history_file_rows"] = len(full.starts)
        harness.write_result("status_history", out, sys.argv[1] if len(sys.argv) > 1 else None)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


if __name__ == "__main__":
    main()
