"""``opsctl push`` of a large file against a raw ``ssh host "pct exec CT -- sh -c 'cat > file'"``,
and an unchanged re-push, side by side in one run.

    python3 benchmarks/transfer.py [--size-mib 1024] [--runs 2] [--sandbox-home DIR] [--json out.json]

Through the sandbox (``sandbox up``; ``--sandbox-home`` or ``$OPSCTL_TEST_SANDBOX_HOME``):
its sshd on 127.0.0.1, ``pct exec`` into container 200. The raw copy and each push method run
interleaved into fresh destinations (a load spike hits all alike); medians are reported.
Goals: rsync push ≥ 80 % of the raw throughput; an unchanged re-push < 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402
from opsctl.sandbox import host as sandbox_host  # noqa: E402

CT = 200
DEST = "/root/opsctl-transfer-bench"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--sandbox-home", default=os.environ.get("OPSCTL_TEST_SANDBOX_HOME"))
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()

    info = sandbox_host.up(Path(args.sandbox_home) if args.sandbox_home else None, containers=(CT,))
    work = Path(tempfile.mkdtemp(prefix="opsctl-transfer-", dir="/var/tmp"))
    home = work / "home"
    (home / "inventory").mkdir(parents=True)
    shutil.copy(info.inventory_file, home / "inventory" / "sandbox.yaml")
    env = {**os.environ, "OPSCTL_HOME": str(home), "OPSCTL_INVENTORY_DIRS": str(home / "inventory"),
           "PYTHONPATH": str(REPO)}
    size = args.size_mib << 20
    src = work / "big.bin"
    with src.open("wb") as f:
        for _ in range(args.size_mib):
            f.write(os.urandom(1 << 20))

    def ct(*argv: str) -> None:
        subprocess.run([*info.ssh_argv(), shlex.join(["pct", "exec", str(CT), "--", *argv])],
                       check=True, capture_output=True)

    def raw() -> float:
        ct("rm", "-rf", DEST)
        ct("mkdir", "-p", DEST)
        command = shlex.join(["pct", "exec", str(CT), "--", "sh", "-c", f"cat > {DEST}/raw.bin"])
        start = time.perf_counter()
        with src.open("rb") as f:
            subprocess.run([*info.ssh_argv(), command], stdin=f, check=True)
        return time.perf_counter() - start

    def push(method: str, fresh: bool = True) -> tuple[float, dict[str, object]]:
        if fresh:
            ct("rm", "-rf", DEST)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "opsctl", "push", "--host", "sandbox", "--ct",
                               str(CT), str(src), f"{DEST}/big.bin", "--method", method, "--json"],
                              env=env, capture_output=True, cwd=REPO)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"push failed: {proc.stdout[-2000:]!r} {proc.stderr[-2000:]!r}")
        return elapsed, json.loads(proc.stdout)

    times: dict[str, list[float]] = {"raw": [], "rsync": [], "tar": [], "repush_rsync": [],
                                     "repush_tar": []}
    load_start = os.getloadavg()[0]
    for _ in range(args.runs):
        times["raw"].append(raw())
        for method in ("rsync", "tar"):
            times[method].append(push(method)[0])
            elapsed, doc = push(method, fresh=False)
            assert doc["bytes"] == 0, doc  # unchanged: nothing sent
            times[f"repush_{method}"].append(elapsed)
    ct("rm", "-rf", DEST)
    shutil.rmtree(work, ignore_errors=True)

    mib = size / (1 << 20)
    results: dict[str, float] = {"size_mib": mib, "load_avg_1m_start": load_start}
    for key, values in times.items():
        results[f"{key}_s"] = harness.median(values)
    for key in ("raw", "rsync", "tar"):
        results[f"{key}_mib_s"] = mib / results[f"{key}_s"]
    results["rsync_vs_raw"] = results["rsync_mib_s"] / results["raw_mib_s"]
    results["tar_vs_raw"] = results["tar_mib_s"] / results["raw_mib_s"]
    results["load_avg_1m_end"] = os.getloadavg()[0]
    goals = {"rsync_vs_raw": (0.8, "≥"), "repush_rsync_s": (2.0, "≤")}
    for key, value in results.items():
        mark = ""
        if key in goals:
            goal, how = goals[key]
            met = value >= goal if how == "≥" else value <= goal
            mark = " ✓" if met else f" ✗ (goal {how} {goal})"
        print(f"{key:20s} {value:9.3f}{mark}")
    if args.json_out:
        harness.write_result("transfer", results, args.json_out, params=vars(args))


if __name__ == "__main__":
    main()
