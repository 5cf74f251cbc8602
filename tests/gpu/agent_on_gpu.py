"""The container agent on a real GPU machine: launch the trainer, watch, stacks, stop.

    python3 tests/gpu/agent_on_gpu.py --out DIR [--preset qwen3-0.6b --device cuda]

Runs the agent verbs exactly as opsctl calls them (one process per verb, one JSON reply)
against a scratch root whose payload is this checkout, and records what `status` says at
each state change (real nvidia-smi GPU table, step metrics, diagnosis), then `stacks` and
`stop`. No SSH here: the transport is exercised by the sandbox tests; this checks the
remote half on real hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def agent(root: Path, *args: str, timeout: float = 120) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root / "payload"), "OPSCTL_TMUX_SOCKET": "opsctl-gpu-smoke"}
    proc = subprocess.run([sys.executable, "-m", "remote_payload.agent", "--root", str(root), *args,
                           "--json"], capture_output=True, text=True, env=env, timeout=timeout)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--attn", default="flex")
    ap.add_argument("--steps", default="200")
    ap.add_argument("--compile", default="auto")
    ap.add_argument("--healthy-timeout", type=float, default=240)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path("/tmp/opsctl-gpu-smoke-root")
    root.mkdir(parents=True, exist_ok=True)
    link = root / "payload"
    if not link.exists():
        link.symlink_to(REPO)
    command = [sys.executable, "-m", "remote_payload.trainer", "--preset", args.preset,
               "--device", args.device, "--attn", args.attn, "--steps", args.steps,
               "--compile", args.compile,
               "--log-every", "5", "--seq-buckets", "2048", "--token-budget", "16384",
               "--out-dir", str(root / "run")]
    spec = {"job_id": f"gpu-smoke-{int(time.time())}", "name": "gpu-smoke", "command": command,
            "env": {}, "workdir": str(REPO), "healthy_when": {"event": "step"},
            "timeout_s": args.healthy_timeout, "expect_tok_s": None}
    record: dict = {"command": command}
    t0 = time.monotonic()
    record["launch"] = agent(root, "launch", "--spec-json", json.dumps(spec), "--replace")
    seen = []
    status = None
    while time.monotonic() - t0 < args.healthy_timeout:
        t_call = time.monotonic()
        status = agent(root, "status", "--lines", "15")
        call_s = time.monotonic() - t_call
        data = status.get("data") or {}
        key = (data.get("state"), data.get("phase"))
        if not seen or seen[-1]["key"] != list(key):
            seen.append({"key": list(key), "t": round(time.monotonic() - t0, 2),
                         "status_call_s": round(call_s, 3)})
            print(f"{seen[-1]['t']:7.1f}s {key} (status verb {call_s * 1000:.0f} ms)", flush=True)
        if data.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED", "LOST"):
            break
        if data.get("state") == "RUNNING" and (data.get("last_step") or {}).get("tok_s"):
            break
        time.sleep(1)  # scenario: one status sample a second, each recorded with its timing
    record["transitions"] = seen
    record["status_running"] = status
    time.sleep(3)  # scenario: the job trains a few more steps before its stacks are asked
    record["stacks"] = agent(root, "stacks", "--timeout", "10")
    if not record["stacks"].get("ok"):  # say why: who got the signal, where their stderr goes
        info = {}
        for pid in (record["stacks"].get("error") or {}).get("fields", {}).get("pids", []):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200].decode()
                sig = [x for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if x.startswith(("SigCgt", "PPid"))]
                info[pid] = {"cmd": cmd, "status": sig, "fd2": os.readlink(f"/proc/{pid}/fd/2")}
            except OSError as exc:
                info[pid] = {"error": str(exc)}
        record["stacks_debug"] = info
        log = Path((status or {}).get("data", {}).get("output_log") or "/nonexistent")
        if log.exists():
            record["log_tail"] = log.read_bytes()[-6000:].decode("utf-8", "replace")
        print(json.dumps(info, indent=1)[:3000], flush=True)
    record["stop"] = agent(root, "stop", "--grace", "30", timeout=120)
    record["status_final"] = agent(root, "status", "--lines", "15")
    (out / "agent_gpu.json").write_text(json.dumps(record, indent=1))
    d = (record["status_running"] or {}).get("data") or {}
    print("gpus:", json.dumps(d.get("gpus")), "\nlast_step:", json.dumps(d.get("last_step")),
          "\ndiagnosis:", json.dumps(d.get("diagnosis")),
          "\nstacks threads:", (record["stacks"].get("data") or {}).get("threads"),
          "\nstop:", json.dumps(record["stop"].get("data") or record["stop"].get("error")),
          "\nfinal:", (record["status_final"].get("data") or {}).get("state"), flush=True)


if __name__ == "__main__":
    main()
