"""Wall time of ``opsctl status --all --json`` for 1, 2 and 8 inventory hosts, side by side.

    python3 benchmarks/fleet_status.py [--runs 7] [--sandbox-home DIR] [--json out.json]

The hosts are aliases of the sandbox's sshd (``sandbox up``; ``--sandbox-home`` or
``$OPSCTL_TEST_SANDBOX_HOME`` picks which sandbox), each with container 200, in a temporary
inventory. ``OPSCTL_MUX=0``: every host gets its own SSH connection, as 8 distinct hosts
would (the aliases share one address, so one multiplexer would serve them all and flatter
the result). The three sizes run interleaved, so a load spike hits all alike; medians are
reported with the load average. Goal: 8 hosts ≤ 2 × 1 host.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from benchmarks import harness  # noqa: E402
from opsctl.sandbox import host as sandbox_host  # noqa: E402

SIZES = (1, 2, 8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--sandbox-home", default=os.environ.get("OPSCTL_TEST_SANDBOX_HOME"))
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()

    info = sandbox_host.up(Path(args.sandbox_home) if args.sandbox_home else None, containers=(200,))
    base = yaml.safe_load(Path(info.inventory_file).read_text())["hosts"]["sandbox"]
    homes: dict[int, Path] = {}
    for n in SIZES:
        home = Path(tempfile.mkdtemp(prefix=f"opsctl-fleet-{n}-"))
        (home / "inventory").mkdir()
        hosts = {f"node{i:02d}": copy.deepcopy(base) for i in range(n)}
        (home / "inventory" / "fleet.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
        homes[n] = home

    def once(n: int) -> float:
        env = {**os.environ, "OPSCTL_HOME": str(homes[n]), "PYTHONPATH": str(REPO),
               "OPSCTL_INVENTORY_DIRS": str(homes[n] / "inventory"), "OPSCTL_MUX": "0"}
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "opsctl", "status", "--all", "--json"],
                              env=env, capture_output=True, cwd=REPO)
        elapsed = time.perf_counter() - start
        doc = json.loads(proc.stdout)
        if proc.returncode != 0 or len(doc["rows"]) != n:
            raise SystemExit(f"{n} hosts: exit {proc.returncode}: {proc.stdout[-2000:]!r}")
        return elapsed

    for n in SIZES:  # warm-up: imports in the page cache, the container's agent compiled
        once(n)
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    load_start = os.getloadavg()[0]
    for _ in range(args.runs):
        for n in SIZES:
            times[n].append(once(n))
    results: dict[str, float] = {"load_avg_1m_start": load_start}
    for n in SIZES:
        results[f"hosts_{n}_s"] = harness.median(times[n])
    results["ratio_8_to_1"] = results["hosts_8_s"] / results["hosts_1_s"]
    results["load_avg_1m_end"] = os.getloadavg()[0]
    for key, value in results.items():
        mark = (" ✓" if value <= 2.0 else " ✗ (goal ≤ 2)") if key == "ratio_8_to_1" else ""
        print(f"{key:20s} {value:7.3f}{mark}")
    if args.json_out:
        harness.write_result("fleet_status", results, args.json_out, params={"runs": args.runs})
    for home in homes.values():
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
