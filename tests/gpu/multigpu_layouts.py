"""Multi-GPU check of the trainer's process layouts and of opsctl's hang reporting, in one call.

The user's run is 5 target + 3 drafter ranks in one container; this checks the same code path
on 2 GPUs (1 + 1 split, 2 colocated; `--nproc 8 --target-ranks 5` for the user's 5 + 3) with the
Qwen3-8B-shaped random target, through the
``device`` tool (``nvidia-h200-x2``), well inside its 10-minute limit::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 \\
        python3 tests/gpu/multigpu_layouts.py --out $OUT/multigpu.json

Runs, in this order (the first seeds the on-disk compile cache the later ones reuse):

1. ``warmup-colocated``  ``--warmup-only`` on 2 colocated ranks (cold compile)
2. ``warmup-split``      ``--warmup-only`` on 1 target + 1 drafter rank
3. ``split``             train, checkpoint at ``--stop-at-step``
4. ``split-resume``      ``--resume auto`` from that checkpoint to ``--steps``
5. ``colocated``         train 2 colocated ranks
6. ``split-sigint``      SIGINT to the whole process group after two step events: every rank
                         must checkpoint and exit 0
   ``split-raise``       the target rank raises at step 3: the drafter must not outlive it
7. ``agent-hang``        the split job launched by the container agent exactly as ``deploy``
                         does, with ``--debug-fault hang``: how long until ``status`` names the
                         hang, and where each rank waits (from the stacks the agent took itself)

Each run is its own process group with a hard timeout; before a kill every process dumps its
stacks (the sitehook's per-process files), which land in the JSON. Per run: exit code, time to
first step, tok/s, MFU (of the 790 TFLOP/s measured matmul rate per GPU), this rank's peak
memory. One JSON document (``--out``) and a table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import typing as t

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from remote_payload import wire  # noqa: E402

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "4"}


def split(a: argparse.Namespace) -> list[str]:
    return ["--topology", "split", "--target-ranks", str(a.target_ranks)]


def trainer_args(a: argparse.Namespace) -> list[str]:
    return ["--preset", a.preset, "--nproc", str(a.nproc), "--seq-buckets", a.seq, "--data", "synthetic",
            "--block-size", "32", "--max-anchors", "64", "--token-budget", str(a.token_budget),
            "--max-batch", "64", "--log-every", str(a.log_every), "--warmup-steps", "2",
            *a.extra.split()]


class Run:
    """One trainer process tree, its output lines with timestamps, and what it reported."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], job_dir: pathlib.Path,
                 timeout_s: float):
        self.name, self.argv, self.timeout_s, self.job_dir = name, argv, timeout_s, job_dir
        self.env = env
        self.lines: list[tuple[float, str]] = []
        self.t0 = 0.0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=ROOT, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append((time.monotonic() - self.t0, raw.decode("utf-8", "replace").rstrip()))

    def events(self, kind: str | None = None) -> list[tuple[float, dict[str, t.Any]]]:
        out = []
        for at, ln in list(self.lines):
            ev = wire.parse_event(ln)
            if ev is not None and (kind is None or ev["event"] == kind):
                out.append((at, ev))
        return out

    def wait(self, until: t.Callable[[Run], bool] | None = None) -> int | None:
        """Wait for exit (or ``until``); on timeout dump stacks, kill the group, return None."""
        assert self.proc is not None
        deadline = self.t0 + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                time.sleep(0.3)  # scenario: the pump's last lines after the exit
                return self.proc.returncode
            if until is not None and until(self):
                return -1
            time.sleep(0.2)  # scenario: one loop both waits for the exit and samples ``until``
        self.stacks_then_kill()
        return None

    def stacks_then_kill(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, wire.STACKS_SIGNAL)
        time.sleep(3.0)  # scenario: the ranks get time to write their stacks before SIGKILL
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stacks(self) -> dict[str, str]:
        folder = self.job_dir / wire.PROCS_DIR
        return {p.name: p.read_text(errors="replace")[-4000:] for p in sorted(folder.glob("*.stacks"))
                if p.stat().st_size} if folder.is_dir() else {}

    def report(self, rc: int | None, **extra: t.Any) -> dict[str, t.Any]:
        steps = self.events("step")
        errors = [ev for _, ev in self.events("error")]
        last = steps[-1][1] if steps else {}
        timed = [ev for _, ev in steps if ev.get("tok_s")]
        best = max(timed, key=lambda e: e["tok_s"]) if timed else {}
        out = {
            "name": self.name, "rc": rc, "timed_out": rc is None,
            "wall_s": round(time.monotonic() - self.t0, 1),
            "first_step_s": round(steps[0][0], 1) if steps else None,
            "steps": last.get("step"), "tok_s": best.get("tok_s"), "mfu": best.get("mfu"),
            "mem_gib": last.get("mem_gib"), "loss_last": last.get("loss"),
            "compile_s": [ev.get("seconds") for _, ev in self.events("compile")],
            "checkpoints": [ev.get("step") for _, ev in self.events("checkpoint")],
            "resumed_at": next((ev.get("step") for _, ev in self.events("resume")), None),
            "done": next((ev.get("reason") for _, ev in self.events("done")), None),
            "errors": errors,
            "tail": [ln for _, ln in self.lines[-12:]],
            **extra,
        }
        if rc is None or rc not in (0, -1):
            out["stacks"] = self.stacks()
        return out


def trainer_run(a: argparse.Namespace, name: str, extra: list[str], base: pathlib.Path,
                env: dict[str, str], timeout_s: float) -> Run:
    job_dir = base / name
    argv = [sys.executable, "-m", "remote_payload.trainer", *trainer_args(a), *extra]
    run_env = {**env, wire.ENV_JOB_DIR: str(job_dir)}
    return Run(name, argv, run_env, job_dir, timeout_s)


def agent_hang(a: argparse.Namespace, base: pathlib.Path, env: dict[str, str]) -> dict[str, t.Any]:
    """Launch the split job through the agent (tmux + wrapper), with a rank that hangs."""
    root = base / "agent-root"
    sock = f"opsctl-mgpu-{os.getpid()}"
    agent_env = {**env, "PYTHONPATH": str(ROOT)}
    agent_env.pop("TMUX", None)

    def agent(*args: str) -> dict[str, t.Any]:
        p = subprocess.run([sys.executable, "-m", "remote_payload.agent", "--root", str(root),
                            "--tmux-socket", sock, *args, "--json"], capture_output=True,
                           env=agent_env, timeout=120, check=False)
        return t.cast(dict[str, t.Any], json.loads(p.stdout.decode().splitlines()[-1]))

    cmd = [sys.executable, "-m", "remote_payload.trainer", *trainer_args(a), "--topology", "split",
           "--target-ranks", "1", "--steps", "200", "--out-dir", str(base / "agent-out"),
           "--debug-fault", "hang", "--debug-fault-rank", "1", "--debug-fault-step", "3"]
    spec = {"name": "agent-hang", "command": cmd, "workdir": str(ROOT), "env": SAFE_ENV,
            "healthy_when": {"event": "step"}, "phase_budgets_s": {"training": a.hang_budget}}
    try:
        return _agent_hang_run(a, agent, spec, sock)
    finally:  # a job left hanging would hold both GPUs after this script is gone
        with contextlib.suppress(Exception):
            agent("stop", "--grace", "5")
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, check=False)


def _agent_hang_run(a: argparse.Namespace, agent: t.Callable[..., dict[str, t.Any]],
                    spec: dict[str, t.Any], sock: str) -> dict[str, t.Any]:
    t0 = time.monotonic()
    launched = agent("launch", "--spec-json", json.dumps(spec))
    out: dict[str, t.Any] = {"name": "agent-hang", "launch": launched["ok"],
                             "launch_error": launched.get("error"),
                             "preflight": (launched.get("data") or {}).get("preflight")}
    named_at = None
    st: dict[str, t.Any] = {}
    while time.monotonic() - t0 < a.hang_timeout:
        st = agent("status").get("data") or {}
        if st.get("state") in ("FAILED", "SUCCEEDED", "LOST", "CANCELLED"):
            break
        if st.get("hang") and any(d["cause"] == "hang" for d in st.get("diagnosis") or []):
            named_at = time.monotonic() - t0
            break
        time.sleep(2)  # scenario: the loop records when the hang was first named
    out["state"] = st.get("state")
    out["named_after_s"] = round(named_at, 1) if named_at else None
    out["quiet_s_when_named"] = (st.get("hang") or {}).get("idle_s")
    out["diagnosis"] = [d["summary"] for d in st.get("diagnosis") or []]
    out["hang_summary"] = (st.get("hang") or {}).get("summary")
    stacks = agent("stacks")
    data = stacks.get("data") or {}
    out["stacks_verb"] = {"ok": stacks.get("ok"), "summary": data.get("summary"),
                          "processes": [{k: p.get(k) for k in ("pid", "rank", "role", "gpu", "label",
                                                                "threads")}
                                        for p in data.get("processes") or []],
                          "error": stacks.get("error")}
    out["stop"] = agent("stop", "--grace", "5").get("data")
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def main(argv: t.Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--seq", default="3072", help="sequence buckets, comma-separated")
    p.add_argument("--nproc", type=int, default=2, help="ranks (one per GPU)")
    p.add_argument("--target-ranks", type=int, default=1, help="target ranks of the split runs")
    p.add_argument("--token-budget", type=int, default=49152)
    p.add_argument("--log-every", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--stop-at", type=int, default=6)
    p.add_argument("--only", default="", help="comma list of run names")
    p.add_argument("--hang-budget", type=float, default=30.0)
    p.add_argument("--hang-timeout", type=float, default=150.0)
    p.add_argument("--extra", default="", help="more trainer flags for every run (one string)")
    p.add_argument("--out", default="multigpu.json")
    p.add_argument("--cache-dir", default=None,
                   help="compile caches here (kept between calls on a warm machine)")
    a = p.parse_args(argv)
    # `timeout` sends SIGTERM: unwind (finally blocks stop what was started) instead of dying
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    base = pathlib.Path(tempfile.mkdtemp(prefix="opsctl-mgpu-"))
    cache = pathlib.Path(a.cache_dir) if a.cache_dir else base
    hook = ROOT / "remote_payload" / "sitehook"
    env = {**os.environ, **SAFE_ENV, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}",
           "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}
    only = {x for x in a.only.split(",") if x}
    results: list[dict[str, t.Any]] = []
    t_all = time.monotonic()

    def want(name: str) -> bool:
        return not only or name in only

    def record(res: dict[str, t.Any]) -> None:
        """Keep every result on disk at once: a call cut off at its limit still reports."""
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k not in ("tail", "stacks")}), flush=True)
        doc = {"date": time.strftime("%Y-%m-%d"), "argv": sys.argv,
               "wall_s": round(time.monotonic() - t_all, 1), "runs": results}
        pathlib.Path(a.out).write_text(json.dumps(doc, indent=1))

    def simple(name: str, extra: list[str], timeout_s: float) -> None:
        if not want(name):
            return
        r = trainer_run(a, name, extra, base, env, timeout_s)
        r.start()
        record(r.report(r.wait()))

    ckpt = str(base / "ckpt-split")
    simple("warmup-colocated", ["--warmup-only", "--save-cache-artifacts", str(base / "mega.bin")], 240)
    simple("warmup-split", [*split(a), "--warmup-only"], 150)
    simple("split", [*split(a), "--steps", str(a.steps),
                     "--stop-at-step", str(a.stop_at), "--out-dir", ckpt], 150)
    simple("split-resume", [*split(a), "--steps", str(a.steps),
                            "--resume", "auto", "--out-dir", ckpt], 150)
    simple("colocated", ["--steps", str(a.steps), "--out-dir", str(base / "ckpt-colo")], 240)
    if want("split-sigint"):
        r = trainer_run(a, "split-sigint", [*split(a),
                                            "--steps", "1000", "--out-dir", str(base / "ckpt-int")],
                        base, env, 200)
        r.start()
        rc = r.wait(until=lambda run: len(run.events("step")) >= 2)
        sent_at = None
        if rc == -1 and r.proc is not None:
            os.killpg(r.proc.pid, signal.SIGINT)  # what `opsctl stop` sends first
            sent_at = time.monotonic()
            rc = r.wait()
        record(r.report(rc, exit_after_sigint_s=round(time.monotonic() - sent_at, 1)
                        if sent_at else None))
    simple("split-raise", [*split(a), "--steps", "50",
                           "--out-dir", str(base / "ckpt-raise"), "--debug-fault", "raise",
                           "--debug-fault-rank", "1", "--debug-fault-step", "3"], 150)
    if want("agent-hang") and shutil.which("tmux"):
        record(agent_hang(a, base, env))
    doc = {"date": time.strftime("%Y-%m-%d"), "argv": sys.argv, "wall_s": round(time.monotonic() - t_all, 1),
           "gpus": _gpus(), "torch": _torch_version(), "runs": results}
    pathlib.Path(a.out).write_text(json.dumps(doc, indent=1))
    _table(results)
    return 0


def _gpus() -> list[str]:
    p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                       check=False) if shutil.which("nvidia-smi") else None
    return p.stdout.decode().split("\n")[:-1] if p and p.returncode == 0 else []


def _torch_version() -> str:
    p = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                       capture_output=True, check=False)
    return p.stdout.decode().strip()


def _table(results: list[dict[str, t.Any]]) -> None:
    cols = ("name", "rc", "first_step_s", "steps", "tok_s", "mfu", "mem_gib", "wall_s")
    print("\n" + " | ".join(f"{c:>16}" for c in cols))
    for r in results:
        print(" | ".join(f"{r.get(c)!s:>16}" for c in cols))
        if r.get("name") == "agent-hang":
            print(f"{'':>16}   hang named after {r.get('named_after_s')} s: {r.get('hang_summary')}")


if __name__ == "__main__":
    sys.exit(main())
