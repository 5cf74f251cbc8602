"""Operational speed of opsctl on the sandbox, side by side in one run.

    python3 benchmarks/ops.py [--runs 10] [--json out.json] [--status-only] [--human]
                              [--baseline REV] [--sandbox-home DIR] [--checkout | --opsctl PATH]

What is measured is opsctl as README tells a user to install it: this checkout is
``pip install``-ed into a fresh virtual environment (offline, :func:`_install`), and its
``opsctl`` console script runs, so it pays none of what this machine's own interpreter adds
to every start (``.pth`` hooks of other packages, an editable install's import finder:
~25-40 ms here).
``--checkout``: run ``python3 -m opsctl`` from the checkout instead (``PYTHONPATH``), as a
developer does, byte-code caching on even where ``PYTHONDONTWRITEBYTECODE`` is set.
``--opsctl``: a given ``opsctl`` program. ``--baseline REV``: a git revision (e.g. ``main``)
checked out into a temporary worktree and installed (or run) the same way; its ``status``
rows are measured in the same interleaved runs, with its own ``OPSCTL_HOME`` and container
root (``/opt/opsctl-baseline``, so each runs its own payload): a before/after pair that one
load spike cannot split. ``--sandbox-home``: the sandbox to run against (default:
``$OPSCTL_HOME``'s).

1. ``opsctl status --json`` wall time vs a raw ``ssh … pct exec 200 -- true`` on the same
   sshd (target ratio ≤ 1.3 with the multiplexer warm, ≤ 2.0 for the first command of a
   session, ``OPSCTL_MUX=0``: its own SSH connection);
2. crash detection: from the job printing its traceback to ``opsctl status --follow``
   reporting FAILED (target ≤ 3 s at default settings);
3. re-deploy of an unchanged payload, launch included, no waiting (target ≤ 2 s).

Raw and opsctl runs are interleaved (so a load spike from other work hits both) and
medians are reported with the load average. By default opsctl runs as a user sees it
after the first command: with its connection multiplexer warm (opsctl/remote/mux_client.py); the
``status_cold`` rows repeat the status measurement with ``OPSCTL_MUX=0`` (own SSH
connection per command) for comparison.

Prints one row per figure; with ``--json`` the figures also go to that file as the result of
``benchmarks/harness.py`` (with the git revision, the machine and the date).
Uses its own OPSCTL_HOME so it never touches your last target.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402
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
    # cwd: the run's own home, never a checkout (``python -m`` puts the cwd first on sys.path)
    proc = subprocess.run(argv, env=env, capture_output=True, cwd=env["OPSCTL_HOME"])
    elapsed = time.perf_counter() - start
    if check and proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return elapsed, proc


def cpu_timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run: the CPU (user + system of the child and what it reaped) is
    what load cannot inflate much, the wall what a user waits."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, _ = timed(argv, env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def wait_for_mux(program: list[str], home: Path, env: dict[str, str], timeout: float = 20.0) -> None:
    """The warm deploy left a multiplexer behind; measure once it answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = subprocess.run([*program, "mux", "status", "--json"], env=env,
                              capture_output=True, cwd=home)
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
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="a git revision whose status is measured in the same runs (own home and root)")
    ap.add_argument("--sandbox-home", default=None, help="the sandbox's OPSCTL_HOME")
    ap.add_argument("--checkout", action="store_true",
                    help="run `python3 -m opsctl` from each tree, not its pip-installed console script")
    args = ap.parse_args()
    installed = not (args.checkout or args.opsctl)

    info = sandbox.up(Path(args.sandbox_home) if args.sandbox_home else None)
    home = Path(tempfile.mkdtemp(prefix="opsctl-bench-"))
    (home / "inventory").mkdir()
    shutil.copy(info.inventory_file, home / "inventory" / "sandbox.yaml")
    venvs = home / "venvs"  # removed with the home
    env = {**_installed_like(), "OPSCTL_HOME": str(home), "OPSCTL_INVENTORY_DIRS": str(home / "inventory")}
    if installed:
        opsctl = _install(REPO, venvs / "checkout")
    else:
        env["PYTHONPATH"] = str(REPO)
        opsctl = [args.opsctl] if args.opsctl else [sys.executable, "-m", "opsctl"]
    target = ["--host", "sandbox", "--ct", str(info.containers[0])]

    def book(name: str, script: str, **extra: object) -> str:
        p = home / f"{name}.yaml"
        p.write_text(json.dumps({"name": name, "command": ["python3", "-c", script], **extra}))
        return str(p)

    results: dict[str, object] = {}
    # warm: payload present, a long job running so status has something to report
    timed([*opsctl, "deploy", *target, "--playbook", book("bench-long", LONG_JOB), "--replace",
           "--no-wait"], env)

    wait_for_mux(opsctl, home, env)
    timed([*opsctl, "status", "--json"], env)  # warm-up (caches, the page cache)
    # (program, its environment) of every opsctl measured: ours, and the --baseline one
    measured = [(opsctl, env)]
    results["revision"] = _describe(REPO)
    tree = None
    if args.baseline:
        tree = _checkout(args.baseline)
        results["baseline_revision"] = _describe(tree)
        program = _install(tree, venvs / "baseline") if installed else None
        measured.append(_baseline(info, book("bench-long", LONG_JOB), target, tree, program))
    for prog, penv in measured:  # warm-up of the direct path too (its modules' byte-code)
        timed([*prog, "status", "--json"], {**penv, "OPSCTL_MUX": "0"})
    results["runs"] = args.runs
    results["load_avg_1m_start"] = os.getloadavg()[0]
    raw_argv = [*info.ssh_argv(), "pct", "exec", str(info.containers[0]), "--", "true"]
    raw: list[tuple[float, float]] = []
    warm: list[list[tuple[float, float]]] = [[] for _ in measured]
    cold: list[list[tuple[float, float]]] = [[] for _ in measured]
    human: dict[str, list[float]] = {"warm": [], "cold": []}
    for _ in range(args.runs):  # interleaved: a load spike hits all of them alike
        raw.append(cpu_timed(raw_argv, env))
        for i, (prog, penv) in enumerate(measured):
            warm[i].append(cpu_timed([*prog, "status", "--json"], penv))
            cold[i].append(cpu_timed([*prog, "status", "--json"], {**penv, "OPSCTL_MUX": "0"}))
        if args.human:
            human["warm"].append(timed([*opsctl, "status"], env)[0])
            human["cold"].append(timed([*opsctl, "status"], {**env, "OPSCTL_MUX": "0"})[0])
    raw_s = results["raw_ssh_pct_exec_true_s"] = harness.median([w for w, _ in raw])
    results["raw_ssh_pct_exec_true_cpu_s"] = harness.median([c for _, c in raw])
    for kind, times in human.items():
        if times:
            results[f"opsctl_status_human_{kind}_s"] = harness.median(times)
            results[f"status_human_{kind}_ratio"] = harness.median(times) / raw_s
    for i, (name, ratio) in enumerate([("opsctl", ""), ("baseline", "baseline_")][:len(measured)]):
        for kind, rows in (("", warm[i]), ("_cold", cold[i])):
            wall = harness.median([w for w, _ in rows])
            results[f"{name}_status_json{kind}_s"] = wall
            results[f"{ratio}status{kind}_ratio"] = wall / raw_s
            results[f"{name}_status_json{kind}_cpu_s"] = harness.median([c for _, c in rows])

    for prog, penv in measured[1:]:
        timed([*prog, "stop", "--grace", "1"], penv, check=False)
        timed([*prog, "mux", "stop"], penv, check=False)
        shutil.rmtree(penv["OPSCTL_HOME"], ignore_errors=True)
    if tree is not None:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       capture_output=True, check=False)
    results["installed"] = ("pip install into a fresh venv" if installed
                            else args.opsctl or "checkout (python3 -m opsctl)")
    if args.status_only:
        timed([*opsctl, "stop", "--grace", "1"], env, check=False)
        timed([*opsctl, "mux", "stop"], env, check=False)
        results["load_avg_1m_end"] = os.getloadavg()[0]
        _report(results, args.json_out, vars(args))
        shutil.rmtree(home, ignore_errors=True)
        return

    redeploy = [timed([*opsctl, "deploy", *target, "--playbook", book("bench-long", LONG_JOB),
                       "--replace", "--no-wait", "--json"], env)[0] for _ in range(max(3, args.runs // 2))]
    results["redeploy_unchanged_payload_s"] = harness.median(redeploy)

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
    results["crash_detection_s"] = harness.median(detections)
    results["crash_detection_max_s"] = max(detections)
    timed([*opsctl, "stop", "--grace", "1"], env, check=False)
    timed([*opsctl, "mux", "stop"], env, check=False)
    results["load_avg_1m_end"] = os.getloadavg()[0]

    _report(results, args.json_out, vars(args))
    shutil.rmtree(home, ignore_errors=True)


def _installed_like() -> dict[str, str]:
    """This environment, but with byte-code caching on, as an installed opsctl runs (pip
    compiles every module at install): with ``PYTHONDONTWRITEBYTECODE`` each start would
    compile every module it imports from source, a cost no user pays (the warm-up runs
    write the caches of both trees)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _describe(tree: Path) -> str:
    """The commit a tree is at, with ``+changes`` when it has uncommitted ones."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return head + ("+changes" if dirty else "")


def _checkout(rev: str) -> Path:
    """``rev`` checked out (detached) into a temporary git worktree of this repository."""
    tree = Path(tempfile.mkdtemp(prefix="opsctl-bench-rev-"))
    proc = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tree, ignore_errors=True)
        raise SystemExit(f"--baseline {rev}: git worktree add failed: {proc.stderr.strip()}")
    return tree


def _install(tree: Path, venv: Path) -> list[str]:
    """``tree`` installed as a user installs it (``pip install``) into the fresh virtual
    environment ``venv``; its ``opsctl`` console script.

    Offline (the network rule: loopback only): the tree's wheel is built by this
    interpreter's own setuptools (``--no-index --no-build-isolation``) and installed with
    ``--no-deps``; the venv finds the dependencies in this interpreter's site-packages through
    a path line in a ``.pth`` file, which adds the directory without running the ``.pth``
    hooks in it.
    """
    import sysconfig

    wheels = venv.with_name(venv.name + "-wheel")
    steps = [[sys.executable, "-m", "pip", "wheel", "--quiet", "--no-index", "--no-deps",
              "--no-build-isolation", "--wheel-dir", str(wheels), str(tree)],
             [sys.executable, "-m", "venv", str(venv)]]
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:4])} … failed: {proc.stderr.strip()[-2000:]}")
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "opsctl-bench-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("opsctl-*.whl"))
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--no-deps",
                           str(wheel)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"pip install {wheel} failed: {proc.stderr.strip()[-2000:]}")
    return [str(venv / "bin" / "opsctl")]


def _baseline(info: sandbox.SandboxInfo, playbook: str, target: list[str], tree: Path,
              program: list[str] | None) -> tuple[list[str], dict[str, str]]:
    """(program, environment) of the baseline: a home and container root of its own, its job
    deployed and its mux warm; its code is ``program`` (installed), else ``tree`` first on
    ``PYTHONPATH``."""
    import yaml

    home = Path(tempfile.mkdtemp(prefix="opsctl-bench-baseline-"))
    (home / "inventory").mkdir()
    inv = yaml.safe_load(Path(info.inventory_file).read_text())
    inv["hosts"]["sandbox"]["root"] = "/opt/opsctl-baseline"
    (home / "inventory" / "sandbox.yaml").write_text(yaml.safe_dump(inv))
    env = {**_installed_like(), "OPSCTL_HOME": str(home), "OPSCTL_INVENTORY_DIRS": str(home / "inventory")}
    if program is None:
        env["PYTHONPATH"] = str(tree)
        program = [sys.executable, "-m", "opsctl"]
    timed([*program, "deploy", *target, "--playbook", playbook, "--replace", "--no-wait"], env)
    wait_for_mux(program, home, env)
    timed([*program, "status", "--json"], env)  # warm-up (its caches)
    return program, env


def _report(results: dict[str, object], json_out: str | None,
            params: dict[str, object]) -> None:
    """One row per figure, marked against its target; with ``json_out``, the harness's result
    envelope of the figures (revision, machine, date, the command line's settings)."""
    targets = {"status_ratio": 1.3, "status_cold_ratio": 2.0, "crash_detection_s": 3.0,
               "redeploy_unchanged_payload_s": 2.0}
    for key, value in results.items():
        goal = targets.get(key)
        if not isinstance(value, (int, float)):
            print(f"{key:34s} {value}")
            continue
        mark = "" if goal is None else (" ✓" if float(value) <= goal else f" ✗ (target ≤ {goal})")
        print(f"{key:34s} {float(value):8.3f}{mark}")
    if json_out:
        harness.write_result("ops", results, json_out, params=params)


if __name__ == "__main__":
    main()
