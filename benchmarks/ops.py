"""Operational speed of opsctl on the sandbox, side by side in one run (issue 2 targets).

    python3 benchmarks/ops.py [--runs 10] [--json out.json] [--opsctl PATH] [--status-only]
                              [--baseline PATH] [--human]

``--opsctl``: the ``opsctl`` to measure (default: the console script beside this python, so a
pyenv shim's own start-up is never counted). ``--baseline``: a second ``opsctl`` (e.g. a normal
install of main) whose ``status`` rows are measured in the same interleaved runs, with its own
``OPSCTL_HOME`` and container root (``/opt/opsctl-baseline``, so each runs its own payload): a
before/after pair that one load spike cannot split. The numbers in docs/benchmarks.md are for
a normal install (``python3 -m venv V && V/bin/pip install .``, then ``V/bin/python benchmarks/ops.py``): an
editable install adds its import finder (~25 ms) to every start.

1. ``opsctl status --json`` wall time vs a raw ``ssh … pct exec 200 -- true`` on the same
   sshd (target ratio ≤ 0.9 with the multiplexer warm, ≤ 1.3 for the first command);
2. crash detection: from the job printing its traceback to ``opsctl status --follow``
   reporting FAILED (target ≤ 3 s at default settings);
3. re-deploy of an unchanged payload, launch included, no waiting (target ≤ 2 s).

Raw and opsctl runs are interleaved (so a load spike from other work hits both) and
medians are reported with the load average. By default opsctl runs as a user sees it
after the first command: with its connection multiplexer warm (opsctl/mux.py); the
``status_cold`` rows repeat the status measurement with ``OPSCTL_MUX=0`` (own SSH
connection per command) for comparison.

Uses its own OPSCTL_HOME so it never touches your last target.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opsctl.sandbox import host as sandbox  # noqa: E402

CRASH_JOB = """
import sys, time
print("warming up", flush=True)
time.sleep(3)
t = time.time()
sys.stderr.write(f"CRASH_AT={t!r}\\n"); sys.stderr.flush()
raise RuntimeError("benchmark crash")
"""

LONG_JOB = "import time\nprint('x', flush=True)\ntime.sleep(600)\n"


def timed(argv: list[str], env: dict[str, str],
          check: bool = True) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    if check and proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return elapsed, proc


def wait_for_mux(home: Path, env: dict[str, str], timeout: float = 20.0) -> None:
    """The warm deploy left a multiplexer behind; measure once it answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = subprocess.run([sys.executable, "-m", "opsctl", "mux", "status", "--json"], env=env,
                              capture_output=True, cwd=REPO)
        if proc.returncode == 0 and json.loads(proc.stdout or b"[]"):
            return
        time.sleep(0.2)
    print("warning: no multiplexer came up; measuring without it", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--opsctl", default=None, help="the opsctl program to measure")
    ap.add_argument("--status-only", action="store_true", help="only the status round trips")
    ap.add_argument("--human", action="store_true",
                    help="also the human `status` (no --json), warm and cold, in the same runs")
    ap.add_argument("--baseline", default=None,
                    help="another opsctl whose status is measured in the same runs (own home and root)")
    args = ap.parse_args()

    info = sandbox.up()
    home = Path(tempfile.mkdtemp(prefix="opsctl-bench-"))
    (home / "inventory").mkdir()
    shutil.copy(info.inventory_file, home / "inventory" / "sandbox.yaml")
    env = {**os.environ, "OPSCTL_HOME": str(home), "OPSCTL_INVENTORY_DIRS": str(home / "inventory")}
    beside = Path(sys.executable).parent / "opsctl"
    opsctl = [args.opsctl] if args.opsctl else [str(beside)] if beside.is_file() else \
        [sys.executable, "-m", "opsctl"]
    target = ["--host", "sandbox", "--ct", str(info.containers[0])]

    def book(name: str, script: str, **extra: object) -> str:
        p = home / f"{name}.yaml"
        p.write_text(json.dumps({"name": name, "command": ["python3", "-c", script], **extra}))
        return str(p)

    results: dict[str, object] = {}
    # warm: payload present, a long job running so status has something to report
    timed([*opsctl, "deploy", *target, "--playbook", book("bench-long", LONG_JOB), "--replace",
           "--no-wait"], env)

    wait_for_mux(home, env)
    timed([*opsctl, "status", "--json"], env)  # builds the reply shape cache (once per OPSCTL_HOME)
    # (program, its environment) of every opsctl measured: ours, and the --baseline one
    measured = [(opsctl, env)]
    if args.baseline:
        measured.append(([args.baseline], _baseline_env(info, book("bench-long", LONG_JOB), target,
                                                        args.baseline)))
    results["load_avg_1m_start"] = os.getloadavg()[0]
    raw_argv = [*info.ssh_argv(), "pct", "exec", str(info.containers[0]), "--", "true"]
    raw: list[float] = []
    warm: list[list[float]] = [[] for _ in measured]
    cold: list[list[float]] = [[] for _ in measured]
    human: dict[str, list[float]] = {"warm": [], "cold": []}
    for _ in range(args.runs):  # interleaved: a load spike hits all of them alike
        raw.append(timed(raw_argv, env)[0])
        for i, (prog, penv) in enumerate(measured):
            warm[i].append(timed([*prog, "status", "--json"], penv)[0])
            cold[i].append(timed([*prog, "status", "--json"], {**penv, "OPSCTL_MUX": "0"})[0])
        if args.human:
            human["warm"].append(timed([*opsctl, "status"], env)[0])
            human["cold"].append(timed([*opsctl, "status"], {**env, "OPSCTL_MUX": "0"})[0])
    raw_s = results["raw_ssh_pct_exec_true_s"] = statistics.median(raw)
    for kind, times in human.items():
        if times:
            results[f"opsctl_status_human_{kind}_s"] = statistics.median(times)
            results[f"status_human_{kind}_ratio"] = statistics.median(times) / raw_s
    for i, (name, ratio) in enumerate([("opsctl", ""), ("baseline", "baseline_")][:len(measured)]):
        results[f"{name}_status_json_s"] = statistics.median(warm[i])
        results[f"{ratio}status_ratio"] = statistics.median(warm[i]) / raw_s
        results[f"{name}_status_json_cold_s"] = statistics.median(cold[i])
        results[f"{ratio}status_cold_ratio"] = statistics.median(cold[i]) / raw_s

    for prog, penv in measured[1:]:
        timed([*prog, "stop", "--grace", "1"], penv, check=False)
        timed([*prog, "mux", "stop"], penv, check=False)
        shutil.rmtree(penv["OPSCTL_HOME"], ignore_errors=True)
    if args.status_only:
        timed([*opsctl, "stop", "--grace", "1"], env, check=False)
        timed([*opsctl, "mux", "stop"], env, check=False)
        results["load_avg_1m_end"] = os.getloadavg()[0]
        _report(results, args.json_out)
        shutil.rmtree(home, ignore_errors=True)
        return

    redeploy = [timed([*opsctl, "deploy", *target, "--playbook", book("bench-long", LONG_JOB),
                       "--replace", "--no-wait", "--json"], env)[0] for _ in range(max(3, args.runs // 2))]
    results["redeploy_unchanged_payload_s"] = statistics.median(redeploy)

    detections = []
    for _ in range(3):
        timed([*opsctl, "deploy", *target, "--playbook", book("bench-crash", CRASH_JOB),
               "--replace", "--no-wait"], env)
        _, proc = timed([*opsctl, "status", "--follow", "--json"], env, check=False)
        done = time.time()
        doc = json.loads(proc.stdout)
        crash_at = next(float(line.split("=", 1)[1]) for line in doc["output_tail"]
                        if line.startswith("CRASH_AT="))
        assert doc["state"] == "FAILED", doc["state"]
        detections.append(done - crash_at)
    results["crash_detection_s"] = statistics.median(detections)
    results["crash_detection_max_s"] = max(detections)
    timed([*opsctl, "stop", "--grace", "1"], env, check=False)
    timed([*opsctl, "mux", "stop"], env, check=False)
    results["load_avg_1m_end"] = os.getloadavg()[0]

    _report(results, args.json_out)
    shutil.rmtree(home, ignore_errors=True)


def _baseline_env(info: sandbox.SandboxInfo, playbook: str, target: list[str],
                  program: str) -> dict[str, str]:
    """A home and container root of the baseline's own, its job deployed and its mux warm."""
    import yaml

    home = Path(tempfile.mkdtemp(prefix="opsctl-bench-baseline-"))
    (home / "inventory").mkdir()
    inv = yaml.safe_load(Path(info.inventory_file).read_text())
    inv["hosts"]["sandbox"]["root"] = "/opt/opsctl-baseline"
    (home / "inventory" / "sandbox.yaml").write_text(yaml.safe_dump(inv))
    env = {**os.environ, "OPSCTL_HOME": str(home), "OPSCTL_INVENTORY_DIRS": str(home / "inventory")}
    timed([program, "deploy", *target, "--playbook", playbook, "--replace", "--no-wait"], env)
    wait_for_mux(home, env)
    timed([program, "status", "--json"], env)  # its reply shape cache
    return env


def _report(results: dict[str, object], json_out: str | None) -> None:
    targets = {"status_ratio": 0.9, "status_cold_ratio": 1.3, "crash_detection_s": 3.0,
               "redeploy_unchanged_payload_s": 2.0}
    for key, value in results.items():
        goal = targets.get(key)
        mark = "" if goal is None else (" ✓" if float(value) <= goal else f" ✗ (target ≤ {goal})")  # type: ignore[arg-type]
        print(f"{key:34s} {float(value):8.3f}{mark}")  # type: ignore[arg-type]
    if json_out:
        Path(json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
