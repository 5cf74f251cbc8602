"""Two torchrun "nodes" on one machine, launched with exactly the argv ``deploy --nodes`` builds.

Checks the trainer under a multi-node torchrun (c10d rendezvous on 127.0.0.1, one rank per
node, node i pinned to GPU i) in both topologies: ``colocated`` (both ranks drafters, DDP) and
``split --target-ranks 1`` (one node runs only the target; which one is the rendezvous'
choice). Per topology: every node's exit code, its step events (a target-only node prints
``role: target`` progress events), and whether the drafters' losses agree across nodes. On a
GPU machine with 2 GPUs (``nvidia-h200-x2``)::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
        python3 tests/gpu/multinode_torchrun.py --out $OUT/multinode.json

On CPU (gloo, what the sandbox test runs): ``python3 tests/gpu/multinode_torchrun.py --device cpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from opsctl.ops import torchrun  # noqa: E402

TOPOLOGIES = {"colocated": [], "split": ["--topology", "split", "--target-ranks", "1"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def trainer(device: str, steps: int) -> list[str]:
    if device == "cpu":
        shape = ["--preset", "tiny", "--device", "cpu", "--attn", "sdpa", "--compile", "off",
                 "--token-budget", "768", "--seq-buckets", "48,96"]
    else:
        shape = ["--preset", "qwen3-0.6b", "--device", "cuda", "--token-budget", "8192",
                 "--seq-buckets", "2048"]
    return [sys.executable, "-m", "remote_payload.trainer", *shape, "--steps", str(steps),
            "--warmup-steps", "1", "--log-every", "1"]


def run_topology(name: str, device: str, steps: int, timeout_s: float, out_dir: Path) -> dict:
    rdzv = torchrun.Rendezvous("127.0.0.1", free_port(), f"check-{name}-{os.getpid()}", 2)
    procs = []
    t0 = time.monotonic()
    for node in range(2):
        argv = torchrun.launcher_command(
            [*trainer(device, steps), *TOPOLOGIES[name], "--out-dir", str(out_dir / name)],
            rdzv, node_index=node, nproc=1, local_addr="127.0.0.1")
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        if device != "cpu":
            env["CUDA_VISIBLE_DEVICES"] = str(node)
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      env=env, text=True, start_new_session=True))
    nodes = []
    for node, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
        events = [json.loads(x) for x in out.splitlines() if x.startswith('{"event"')]
        steps_seen = [e for e in events if e["event"] == "step"]
        nodes.append({"node": node, "rc": proc.returncode, "step_events": len(steps_seen),
                      "roles": sorted({e.get("role", "drafter") for e in steps_seen}),
                      "losses": {e["step"]: e["loss"] for e in steps_seen if "loss" in e},
                      "errors": [e for e in events if e["event"] == "error"][:3],
                      "tail": out.splitlines()[-8:]})
    shared = set(nodes[0]["losses"]) & set(nodes[1]["losses"])
    agree = all(nodes[0]["losses"][s] == nodes[1]["losses"][s] for s in shared)
    ok = all(n["rc"] == 0 and n["step_events"] > 0 for n in nodes) and agree
    for n in nodes:
        n["losses"] = dict(list(n["losses"].items())[-3:])
    return {"topology": name, "ok": ok, "seconds": round(time.monotonic() - t0, 1),
            "losses_agree": agree, "nodes": nodes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=240.0, help="per topology (s)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"multinode-check-{os.getpid()}"
    results = [run_topology(name, args.device, args.steps, args.timeout, out_dir)
               for name in TOPOLOGIES]
    for r in results:
        print(f"{r['topology']:10} ok={r['ok']} {r['seconds']:6.1f}s " + "  ".join(
            f"node{n['node']}: rc={n['rc']} steps={n['step_events']} roles={n['roles']}"
            for n in r["nodes"]))
    doc = {"device": args.device, "results": results}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
