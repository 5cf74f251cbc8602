"""What ``--report-to`` costs the trainer: the same run with and without trackers, tok/s of each.

Runs the real trainer (``python -m remote_payload.trainer``) as a child process, alternately
with ``--report-to none`` and with the trackers (default all three, W&B offline, MLflow's
SQLite store in the run directory), ``--repeats`` times each, and compares the median
steady-state ``tok_s`` of their ``step`` events (the first ``--skip`` step events, which hold
compiles and warm-up, are left out). ``--log-every 1`` (the default here) is the trackers'
worst case: one metric event per step.

On an H200 (one GPU; the trackers' packages unpacked in /tmp/site, e.g. ``pip install
--target /tmp/site tensorboard wandb mlflow``)::

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/trackers_overhead.py --steps 80 --repeats 2

On this machine's CPU, a quick check of the script itself::

    python3 benchmarks/trackers_overhead.py --steps 12 --skip 2 --repeats 1 -- \\
        --preset tiny --device cpu --attn sdpa --compile off --token-budget 768

Prints one line per run and a summary on stderr: tok/s without, with, and the ratio (the target is
>= 0.99), then writes the result through :mod:`benchmarks.harness` (``--json FILE``, else on
stdout). Exit 0 unless a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import typing as t
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402

GPU_DEFAULTS = ["--preset", "qwen3-8b", "--device", "cuda"]


def _args(argv: t.Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=80, help="optimizer steps per run")
    p.add_argument("--skip", type=int, default=10, help="first step events left out (warm-up)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each kind, alternating")
    p.add_argument("--trackers", default="tensorboard,wandb,mlflow", help="--report-to of the runs with")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--json", dest="json_out", default=None, help="the result file (default: stdout)")
    a = p.parse_args(argv)
    if a.trackers.strip().lower() == "none":
        p.error("--trackers none: the runs with trackers need at least one")
    return a, rest or list(GPU_DEFAULTS)


def run_once(report_to: str, a: argparse.Namespace, trainer_args: list[str], out: Path) -> dict[str, t.Any]:
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
           "WANDB_SILENT": "true", "WANDB_DIR": str(out), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(REPO)) if p)
    argv = [sys.executable, "-m", "remote_payload.trainer", *trainer_args, "--steps", str(a.steps),
            "--log-every", str(a.log_every), "--out-dir", str(out), "--report-to", report_to]
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    events = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"event":')]
    if proc.returncode != 0:
        raise SystemExit(f"run with --report-to {report_to} failed (rc {proc.returncode}):\n"
                         + "\n".join(proc.stdout.splitlines()[-10:] + proc.stderr.splitlines()[-20:]))
    rates = [e["tok_s"] for e in events if e["event"] == "step" and e.get("tok_s")][a.skip:]
    if not rates:
        raise SystemExit(f"run with --report-to {report_to}: no step events after the first {a.skip}")
    warnings = [e.get("message", "") for e in events if e["event"] == "warning"]
    return {"report_to": report_to, "tok_s": statistics.median(rates), "steps": len(rates),
            "wall_s": round(time.monotonic() - t0, 1), "warnings": warnings}


def main(argv: t.Sequence[str] | None = None) -> int:
    a, trainer_args = _args(argv)
    results: dict[str, list[float]] = {"none": [], a.trackers: []}
    for i in range(a.repeats):
        for kind in ("none", a.trackers):
            # each run's directory goes as soon as its events are read: an 8B drafter's
            # checkpoints fill a 64 GB disk in two runs
            with tempfile.TemporaryDirectory(prefix="trackers-bench-") as tmp:
                r = run_once(kind, a, trainer_args, Path(tmp) / f"{i}-{kind.replace(',', '_')}")
            results[kind].append(r["tok_s"])
            print(f"run {i + 1} --report-to {kind}: {r['tok_s']:,.1f} tok/s (median of "
                  f"{r['steps']} step events, {r['wall_s']} s){'; WARNINGS: ' if r['warnings'] else ''}"
                  + "; ".join(r["warnings"]), file=sys.stderr, flush=True)
    without, with_ = harness.median(results["none"]), harness.median(results[a.trackers])
    ratio = with_ / without if without else None
    print(f"tok/s without trackers {without:,.1f}, with {a.trackers} {with_:,.1f}: ratio "
          + (f"{ratio:.4f} ({(1 - ratio) * 100:+.2f} % overhead; target <= 1 %)" if ratio is not None
             else "unknown (no tokens without trackers)"), file=sys.stderr, flush=True)
    harness.write_result("trackers_overhead", {
        "tok_s_without": without, "tok_s_with": with_, "ratio": ratio,
        "runs": results},
        a.json_out, params={**{k: v for k, v in vars(a).items() if k != "json_out"},
                            "trainer_args": trainer_args})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
