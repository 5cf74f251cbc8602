"""Start-up and wind-down of the trainer, this tree against a baseline tree, in one run.

Each code runs the trainer as a restart does: a new process, ``python -m remote_payload.trainer``,
the ``qwen3-8b`` preset on synthetic data (block 32, 64 anchors, S 3072, budget 49152, a few
steps). Per code, twice in a row on one cache folder of its own (inductor, Triton and, for the
new code, the bytecode of a torch env that cannot keep its own): ``cold`` (the folder empty, no
seeded mega-cache) and ``warm`` (the same folder, a new process). Then, with
``--target-path`` (unless ``--no-target-path``), the new code (and with ``--path-baseline`` the
base code) reads one generated checkpoint of the preset's shape (16 GB of bf16 safetensors,
written by ``target.save_target``, the e2e recipe's writer) with warm compile caches, the
checkpoint's pages dropped from the page cache first (fsync + ``POSIX_FADV_DONTNEED``), so the
read comes from the disk.

Times are taken here, from the spawn of the trainer, as each line arrives (the same clock for
both codes, whatever events they print); the new code adds its ``startup`` event, which splits
the build into target and drafter and gives the checkpoint's read rate. Columns: ``base`` (the
``--baseline`` tree, e.g. the trainer that built its target with transformers) and ``new`` (this tree).

Usage (one H200; ~8 min, as run on 2026-12-02: new cold ~90 s, new warm ~35 s,
the seed and the seeded start ~50 s, the 16 GB checkpoint ~45 s, the new code's read ~45 s,
base cold ~160 s, base warm ~75 s; ``--budget`` cuts the whole. The new code runs first and reads the
checkpoint before the baseline runs, so a cut drops baseline runs)::

    mkdir -p benchmarks/baseline-00924ac
    git archive 00924ac remote_payload | tar -x -C benchmarks/baseline-00924ac  # once, with git
    python benchmarks/startup.py --baseline benchmarks/baseline-00924ac --out $OUT/startup.json \
        --modes cold,warm,seeded --base-modes cold,warm --work /dev/shm --target-dir /tmp/disk

    python benchmarks/startup.py --smoke --baseline DIR --out /tmp/s.json   # CPU, tiny, ~1 min

``seeded`` is a fresh container with ``opsctl cache seed``'s mega-cache: a ``--warmup-only
--save-cache-artifacts`` run on the code's warm cache, then a start on an empty cache folder
with that mega-cache loaded. ``--work /dev/shm`` keeps the runs' final checkpoints in memory;
``--target-dir`` puts the generated checkpoint on the local disk, which the read is about.

It prints one markdown table (phases by run) and writes it next to ``--out`` (``.md``).
"""

from __future__ import annotations

import argparse
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from remote_payload import wire  # noqa: E402

#: The issue's shape (the qwen3-8b preset's block 32 and 64 anchors, named for clarity)
FULL = ["--preset", "qwen3-8b", "--data", "synthetic", "--block-size", "32", "--max-anchors", "64",
        "--seq-buckets", "3072", "--token-budget", "49152", "--log-every", "1"]
SMOKE = ["--preset", "tiny", "--data", "synthetic", "--device", "cpu", "--attn", "sdpa",
         "--seq-buckets", "48", "--token-budget", "192", "--log-every", "1"]
#: on the GPU machine: NVLink multicast stays off (KINDS.md)
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

#: (key, row label): the table's rows, in the order a run reaches them
ROWS: list[tuple[str, str]] = [
    ("first_event", "first event: python + imports (s after spawn)"),
    ("pg_ready", "process groups ready (s after spawn)"),
    ("target_built", "target built (s after spawn; new code only)"),
    ("built", "target + drafter built (s after spawn)"),
    ("load_gb_per_s", "checkpoint read (GB/s; new code only)"),
    ("target_compile_s", "target graph, first call (s)"),
    ("drafter_compile_s", "drafter step, first call (s)"),
    ("first_step", "first step event (s after spawn)"),
    ("last_step_to_done", "last step event -> done (s)"),
    ("ckpt_s", "of which the final checkpoint (s)"),
    ("done_to_exit", "done -> exit (s)"),
    ("total", "spawn -> exit (s)"),
]


def child_env(root: pathlib.Path, cache: pathlib.Path, gpu: bool,
              artifacts: pathlib.Path | None = None) -> dict[str, str]:
    """The trainer's environment: ``root``'s code first, its own compile caches (and, as the
    agent gives a job, ``OPSCTL_CACHE_DIR``: where the new code keeps bytecode the torch env
    cannot keep itself), no seeded mega-cache unless ``artifacts`` (a cold run is cold),
    multicast off on the GPU."""
    env = {k: v for k, v in os.environ.items()
           if k not in (wire.ENV_ARTIFACTS, "PYTHONPATH", "PYTHONPYCACHEPREFIX")}
    env.update({"PYTHONPATH": str(root), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
                "TRITON_CACHE_DIR": str(cache / "triton"), wire.ENV_CACHE_DIR: str(cache),
                "PYTHONUNBUFFERED": "1"})
    if artifacts is not None:
        env[wire.ENV_ARTIFACTS] = str(artifacts)  # as the agent exports a seeded build's
    if gpu:
        env.update(GPU_ENV)
    return env


def phases(lines: list[tuple[float, str]], exit_at: float | None) -> dict[str, t.Any]:
    """The per-phase figures of one run from its stdout lines (arrival time, text).

    Both codes print the ``process groups ready`` phase, the ``dflash trainer:`` line once the
    model is built, ``compile`` and ``step`` events and ``done``; the ``startup`` event (the new
    code) adds the target's own build time and the checkpoint's read rate."""
    out: dict[str, t.Any] = {}
    steps: list[float] = []
    for at, text in lines:
        if text.startswith("dflash trainer:"):
            out.setdefault("built", at)
        ev = wire.parse_event(text)
        if ev is None:
            continue
        out.setdefault("first_event", at)
        kind = ev["event"]
        if kind == "phase" and "torch" in ev:
            out.setdefault("torch", ev["torch"])
        if kind == "phase" and ev.get("detail") == "process groups ready":
            out.setdefault("pg_ready", at)
        elif kind == "compile" and ev.get("name") == "target_features":
            out.setdefault("target_compile_s", ev.get("seconds"))
        elif kind == "compile" and ev.get("name") == "drafter_step":
            out.setdefault("drafter_compile_s", ev.get("seconds"))
        elif kind == "step":
            steps.append(at)
        elif kind == "startup":
            out["startup"] = ev
            # the trainer counts from its own start; shift by the gap to our clock's pg mark
            if "pg_ready" in out and "target_built_at" in ev and "pg_ready_at" in ev:
                out["target_built"] = out["pg_ready"] + ev["target_built_at"] - ev["pg_ready_at"]
            if "load_gb_per_s" in ev:
                out["load_gb_per_s"] = ev["load_gb_per_s"]
        elif kind == "done":
            out["done"] = at
            out["done_event"] = ev
            if "ckpt_s" in ev:
                out["ckpt_s"] = ev["ckpt_s"]
        elif kind == "error":
            out.setdefault("errors", []).append(ev)
    if steps:
        out["first_step"] = steps[0]
        out["last_step"] = steps[-1]
        out["steps_seen"] = len(steps)
    if "done" in out and steps:
        out["last_step_to_done"] = out["done"] - steps[-1]
    if exit_at is not None:
        out["total"] = exit_at
        if "done" in out:
            out["done_to_exit"] = exit_at - out["done"]
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()}


def run_trainer(root: pathlib.Path, argv: list[str], env: dict[str, str], log: pathlib.Path,
                timeout_s: float) -> dict[str, t.Any]:
    """One trainer process; its stdout lines timed on arrival, stderr to ``log``."""
    cmd = [sys.executable, "-m", "remote_payload.trainer", *argv]
    lines: list[tuple[float, str]] = []
    with open(log, "w") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=err,
                                text=True, start_new_session=True)
        assert proc.stdout is not None
        killer = threading.Timer(timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
        killer.start()
        try:
            for line in proc.stdout:
                lines.append((time.monotonic() - t0, line.rstrip("\n")))
            rc = proc.wait()
        finally:
            killer.cancel()
        exit_at = time.monotonic() - t0
    res = phases(lines, exit_at)
    res["rc"] = rc
    if rc == -signal.SIGKILL:
        res["timed_out_s"] = round(timeout_s, 1)
    if rc != 0:
        res["stderr_tail"] = log.read_text(errors="replace")[-1500:]
    with open(log.with_suffix(".stdout"), "w") as f:
        f.writelines(f"{at:9.3f} {text}\n" for at, text in lines)
    return res


def write_target(out: str, preset_name: str, device: str) -> None:
    """Child mode: a random target of ``preset_name`` written as the e2e recipe writes its
    target (``target.save_target``), then flushed and dropped from the page cache."""
    import torch

    from remote_payload.trainer.config import preset
    from remote_payload.trainer.target import _materialize_random, save_target

    cfg = preset(preset_name)
    dev = torch.device(device)
    model = _materialize_random(cfg, dev, torch.bfloat16, seed=0, body=True)
    save_target(model, out)
    drop_page_cache(pathlib.Path(out))


def drop_page_cache(folder: pathlib.Path) -> int:
    """fsync and evict every file of ``folder`` from the page cache (no root needed: the
    pages are clean once fsynced); returns the bytes."""
    total = 0
    for p in folder.iterdir():
        if not p.is_file():
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        total += p.stat().st_size
    return total


def table(results: dict[str, dict[str, t.Any]]) -> str:
    """The markdown table: a row per phase, a column per trainer run."""
    cols = [c for c in results if c != "target checkpoint"]
    cols.sort(key=lambda c: not c.startswith("base"))  # base first, each code's runs in order
    head = "| phase | " + " | ".join(cols) + " |"
    rule = "|---|" + "---:|" * len(cols)
    rows = [head, rule]
    for key, label in ROWS:
        cells = []
        for c in cols:
            v = results[c].get(key)
            cells.append("—" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v)))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def parse(argv: t.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True,
                   help="a folder holding the base commit's remote_payload/")
    p.add_argument("--out", required=True, help="JSON result file (the table goes to .md)")
    p.add_argument("--smoke", action="store_true", help="tiny preset on CPU (checks the script)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    p.add_argument("--modes", default="cold,warm",
                   help="comma-separated: cold, warm, seeded (a fresh cache folder with the "
                        "mega-cache a --warmup-only --save-cache-artifacts run saved, as "
                        "`opsctl cache seed` installs it)")
    p.add_argument("--base-modes", default=None,
                   help="the baseline's modes, when not --modes' (e.g. cold,warm: its seeded "
                        "figures are on record, and its runs are the slow ones)")
    p.add_argument("--no-target-path", action="store_true", help="skip the checkpoint read")
    p.add_argument("--path-baseline", action="store_true",
                   help="the baseline reads the checkpoint too (~1 min more on an H200)")
    p.add_argument("--budget", type=float, default=530.0,
                   help="seconds for the whole run: each run is cut at the budget, and one "
                        "with less than 20 s left is skipped (the table says so)")
    p.add_argument("--work", default=None, help="scratch folder (caches, the 16 GB checkpoint)")
    p.add_argument("--target-dir", default=None,
                   help="folder on the local disk for the generated checkpoint, when --work is "
                        "in memory (/dev/shm: the runs' final checkpoints write faster there)")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds per trainer run")
    a = p.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    a.base_modes = a.modes if a.base_modes is None else [m for m in a.base_modes.split(",") if m]
    for flag, modes in (("--modes", a.modes), ("--base-modes", a.base_modes)):
        if not set(modes) <= {"cold", "warm", "seeded"} or (flag == "--modes" and not modes):
            p.error(f"{flag} {','.join(modes)}: cold, warm, seeded")
    if not (pathlib.Path(a.baseline) / "remote_payload" / "trainer").is_dir():
        p.error(f"--baseline {a.baseline}: no remote_payload/trainer there")
    if a.steps < 2:
        p.error("--steps must be at least 2 (a first and a last step)")
    return a


def main(argv: t.Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_write-target"]:
        write_target(argv[1], argv[2], argv[3])
        return 0
    a = parse(argv)
    gpu = not a.smoke
    shape = SMOKE if a.smoke else FULL
    # the new code first: when --budget runs out, the baseline's runs are the ones cut (base's
    # cold start alone took 146 s on 2026-12-02, and it once squeezed out the new code's runs)
    codes = {"new": ROOT, "base": pathlib.Path(a.baseline).resolve()}
    work = pathlib.Path(tempfile.mkdtemp(prefix="startup-bench-", dir=a.work))
    out = pathlib.Path(a.out)
    logs = out.parent / (out.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, t.Any]] = {}
    began = time.monotonic()

    def left() -> float:
        return float(min(a.timeout, a.budget - (time.monotonic() - began)))

    def over_budget(name: str) -> bool:
        if left() >= 20:
            return False
        results[name] = {"skipped": f"over --budget {a.budget:g} s"}
        print(f"    {name}: skipped, over --budget", flush=True)
        return True
    disk = pathlib.Path(tempfile.mkdtemp(prefix="startup-target-", dir=a.target_dir or work))
    ckpt = disk / "target"
    gen: dict[str, t.Any] = {}

    def write_checkpoint() -> None:
        """The generated checkpoint, once (the first code that reads it writes it)."""
        if gen or over_budget("target checkpoint"):
            return
        print(f"[{time.monotonic() - began:6.1f}s] writing the target checkpoint ...", flush=True)
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()),
                            "_write-target", str(ckpt), "tiny" if a.smoke else "qwen3-8b",
                            "cpu" if a.smoke else "cuda"],
                           env=child_env(ROOT, work / "cache-new", gpu), check=True,
                           timeout=left())
            size = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
            gen.update(gb=round(size / 1e9, 3), write_s=round(time.monotonic() - t0, 1))
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            gen.update(error=f"writing the checkpoint failed: {e}")
        print(f"    {gen}", flush=True)
        results["target checkpoint"] = {"rc": 0 if "gb" in gen else 1, **gen}

    try:
        # per code: its modes, then its checkpoint read; the new code's read comes before the
        # baseline's runs, so a budget cut drops baseline runs, not the read
        for code, root in codes.items():
            cache = work / f"cache-{code}"
            cache.mkdir()
            for mode in (a.modes if code == "new" else a.base_modes):
                name = f"{code} {mode}"
                run_dir = work / f"run-{code}-{mode}"
                if over_budget(name):
                    continue
                env = child_env(root, cache, gpu)
                if mode == "seeded":  # `cache seed`: a warm-up saves the mega-cache (on this
                    art = work / f"artifacts-{code}.bin"  # code's cache: warm after cold/warm)
                    print(f"[{time.monotonic() - began:6.1f}s] {code} seed ...", flush=True)
                    seed = run_trainer(root, [*shape, "--warmup-only", "--save-cache-artifacts",
                                              str(art), "--out-dir", str(run_dir)],
                                       env, logs / f"{code}-seed.log", left())
                    results[f"{code} seed run"] = seed
                    fresh = work / f"cache-{code}-seeded"
                    fresh.mkdir()
                    env = child_env(root, fresh, gpu, art if art.is_file() else None)
                argv_run = [*shape, "--steps", str(a.steps), "--out-dir", str(run_dir)]
                print(f"[{time.monotonic() - began:6.1f}s] {name} ...", flush=True)
                results[name] = run_trainer(root, argv_run, env, logs / f"{code}-{mode}.log",
                                            left())
                print(f"    {json.dumps(results[name])[:400]}", flush=True)
                shutil.rmtree(run_dir, ignore_errors=True)
            if a.no_target_path or (code == "base" and not a.path_baseline):
                continue
            write_checkpoint()
            name = f"{code} --target-path"
            if "gb" not in gen or over_budget(name):
                continue
            drop_page_cache(ckpt)
            run_dir = work / f"run-{code}-path"
            argv_run = [*shape, "--steps", str(a.steps), "--out-dir", str(run_dir),
                        "--target-path", str(ckpt)]
            print(f"[{time.monotonic() - began:6.1f}s] {name} ...", flush=True)
            results[name] = run_trainer(root, argv_run, child_env(root, cache, gpu),
                                        logs / f"{code}-path.log", left())
            results[name]["checkpoint_gb"] = gen["gb"]
            print(f"    {json.dumps(results[name])[:400]}", flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    md = table(results)
    if "target checkpoint" in results:
        md += f"\n\n--target-path checkpoint: {json.dumps(results['target checkpoint'])}"
    doc = {"shape": shape, "steps": a.steps, "smoke": a.smoke, "baseline": str(codes["base"]),
           "wall_s": round(time.monotonic() - began, 1), "runs": results, "table": md}
    harness.write_result("startup", doc, out, params={k: str(v) for k, v in vars(a).items()})
    out.with_suffix(".md").write_text(md + "\n")
    print(md)
    print(f"wall {doc['wall_s']} s; {out} and {out.with_suffix('.md')}, logs in {logs}")
    return 0 if all(r.get("rc", 0) == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
