"""The job history on a real GPU machine: nvidia-smi samples reach ``history.json``.

    python3 tests/gpu/history_on_gpu.py [--out DIR] [--seconds 16]

Launches one job with the real agent (tmux + wrapper, no SSH) that loads GPU 0 when torch with
CUDA is there (else it only sleeps: utilisation stays ~0 but memory is still sampled), waits for
its end, then prints what ``status`` and ``history`` say: rows, ``gpu_util``/``gpu_mem_gib``
columns, marks, and the status verb's time with that history.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

JOB = """
import json, time, sys
def ev(**k): print(json.dumps(k), flush=True)
end = time.time() + SECONDS
try:
    import torch
    cuda = torch.cuda.is_available()
except Exception:
    cuda = False
ev(event="phase", phase="training")
step = 0
if cuda:
    a = torch.randn(8192, 8192, device="cuda")
while time.time() < end:
    step += 1
    if cuda:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    else:
        time.sleep(0.2)
    ev(event="step", step=step, loss=round(3.0 / step, 4), tok_s=1000.0)
print("cuda" if cuda else "no cuda", flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--seconds", type=float, default=16.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="opsctl-hist-gpu-"))
    socket = f"opsctl-hist-gpu-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPSCTL_TMUX_SOCKET": socket}
    env.pop("TMUX", None)

    def agent(*a: str) -> dict:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "remote_payload.agent", "--root", str(root), *a],
                           capture_output=True, text=True, env=env, timeout=120)
        doc = json.loads(p.stdout.strip().splitlines()[-1])
        doc["_elapsed_s"] = round(time.perf_counter() - t0, 4)
        return doc

    job_id = f"histgpu-20261130-000000-{uuid.uuid4().hex[:4]}"
    spec = {"job_id": job_id, "name": "histgpu", "workdir": str(root),
            "command": [sys.executable, "-c", JOB.replace("SECONDS", str(args.seconds))],
            "env": {}, "healthy_when": {"event": "step"}, "timeout_s": 120}
    try:
        launched = agent("launch", "--spec-json", json.dumps(spec))
        assert launched["ok"], launched
        mid = None
        deadline = time.time() + args.seconds + 60
        while time.time() < deadline:
            st = agent("status", "--job", job_id)
            if mid is None and (st["data"].get("history") or {}).get("gpu_util"):
                mid = st
            if st["data"]["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "LOST"):
                break
            time.sleep(1.0)  # scenario: one status sample a second, the mid-run one kept
        hist = agent("history", "--job", job_id)
        h = hist["data"]["history"]
        final = st["data"]
        report = {
            "state": final["state"], "output_tail": final["output_tail"][-3:],
            "gpus": [{k: g.get(k) for k in ("index", "name", "util_pct", "mem_used_mib")}
                     for g in (mid or st)["data"]["gpus"]],
            "status_while_running": None if mid is None else {
                "elapsed_s": mid["_elapsed_s"], "rows": len(mid["data"]["history"]["t"]),
                "gpu_util": mid["data"]["history"]["gpu_util"]},
            "history_verb": {"rows": len(h["t"]), "bucket_s": h["bucket_s"],
                             "columns": sorted(k for k in h if isinstance(h[k], list)),
                             "gpu_util": h.get("gpu_util"), "gpu_mem_gib": h.get("gpu_mem_gib"),
                             "marks": h["marks"], "source": hist["data"]["source"]},
        }
        text = json.dumps(report, indent=1)
        print(text)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            Path(args.out, "history-gpu-smoke.json").write_text(text)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


if __name__ == "__main__":
    main()
