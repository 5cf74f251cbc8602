"""How long training stops for a periodic checkpoint: none vs background vs synchronous.

One process builds the trainer's step once (a ``qwen3-8b``-shaped random target, fused and
compiled as the trainer runs it, and the 5-layer drafter with its fused AdamW), then runs the
same steps three times, side by side:

* ``none``: no checkpoints (the baseline tok/s);
* ``background``: ``--ckpt-write background`` (:mod:`remote_payload.trainer.saver`: copied
  into pinned host buffers, written by the writer thread);
* ``sync``: ``--ckpt-write sync``, the previous behaviour (:func:`checkpoint.save` on the
  training thread: pageable ``.cpu()`` copies, then the disk).

Each mode takes a checkpoint every ``--ckpt-every`` steps through the trainer's own
:class:`~remote_payload.trainer.saver.Checkpointer` (``--keep-last 1``, so the disk holds at
most two), and reports per checkpoint how long the training thread was blocked (max and
mean), the steady tok/s over all its steps (a device sync only at the ends), and for
``background`` the host memory the staging holds and how long pinning it took (done once,
before the timed steps, as a run does it on the writer thread during its first steps). The
checkpoints go to a temporary directory on the local disk (``--ckpt-dir``), removed at the
end. Targets (docs/benchmarks.md): blocked <= 1 s per checkpoint, background tok/s within 2 %
of ``none``.

Usage (one GPU; ~5 minutes with the defaults, most of it the three modes' 100 steps)::

    PYTHONUNBUFFERED=1 python benchmarks/checkpoint_stall.py --out $OUT/checkpoint_stall.json
    python benchmarks/checkpoint_stall.py --preset tiny --device cpu --steps 6 --ckpt-every 3 \\
        --seq 96 --token-budget 384 --out /tmp/stall.json      # plumbing check
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import typing as t

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

MODES = ("none", "background", "sync")


def parse(argv: t.Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (one bucket)")
    p.add_argument("--token-budget", type=int, default=16384, help="padded tokens per step")
    p.add_argument("--steps", type=int, default=100, help="timed steps per mode")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiles)")
    p.add_argument("--modes", default=",".join(MODES), help="comma list, run in this order")
    p.add_argument("--ckpt-dir", default=None,
                   help="where the checkpoints go (default: a temporary directory in /var/tmp)")
    p.add_argument("--out", default=None, help="result JSON (default: stdout)")
    a = p.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.modes if m not in MODES]
    if bad or a.steps < 1 or a.ckpt_every < 1:
        p.error(f"--modes from {', '.join(MODES)}; --steps and --ckpt-every >= 1 (got {bad})")
    return a


class Bench:
    def __init__(self, a: argparse.Namespace):
        import torch

        from remote_payload.trainer.config import preset
        from remote_payload.trainer.data import SyntheticSource
        from remote_payload.trainer.engine import Engine
        from remote_payload.trainer.target import build_target

        self.a, self.torch = a, torch
        self.dev = torch.device(a.device)
        self.cuda = self.dev.type == "cuda"
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
        self.cfg = preset(a.preset)
        dtype = torch.bfloat16 if self.cuda else torch.float32
        t0 = time.perf_counter()
        self.target = build_target(self.cfg, self.dev, dtype)
        if self.cuda:
            self.target.compile()
        self.engine = Engine(self.cfg, attn="flex" if self.cuda else "sdpa", device=self.dev,
                             autocast_dtype=torch.bfloat16 if self.cuda else None,
                             compile_model=self.cuda, embed=self.target.embed,
                             head_weight=self.target.head_weight, lr=1e-4, weight_decay=0.01,
                             grad_clip=1.0, ce_chunk=4096)
        self.src = SyntheticSource(self.cfg.vocab_size, buckets=[a.seq], token_budget=a.token_budget,
                                   max_batch=64, n_anchors=self.cfg.max_anchors,
                                   block_size=self.cfg.block_size, seed=0)
        self.batches = [self.src.batch(j) for j in range(4)]
        self.gbatches = [b.to(self.dev) for b in self.batches]
        self.build_s = round(time.perf_counter() - t0, 1)
        self.j = 0

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def step(self) -> int:
        """One training step (the target's features, the drafter's step); its tokens."""
        b = self.gbatches[self.j % len(self.gbatches)]
        n = self.batches[self.j % len(self.batches)].n_tokens
        self.j += 1
        self.engine.train_step(self.target.features(b.input_ids), b, 1e-4)
        return n

    def warm(self) -> float:
        t0 = time.perf_counter()
        for _ in range(self.a.warmup):
            self.step()
        self.sync()
        return round(time.perf_counter() - t0, 1)

    def mode(self, name: str, ckpt_root: pathlib.Path) -> dict[str, t.Any]:
        from remote_payload.trainer import saver

        a = self.a
        out = ckpt_root / name
        ck = None
        res: dict[str, t.Any] = {}
        if name != "none":
            ck = saver.Checkpointer(str(out), self.engine.raw, self.engine.opt, self.dev,
                                    mode=name, keep_last=1, owners={"bench"})
            engine = self.engine
            ck.engine_hook = lambda done: setattr(engine, "pending_copy", done)
            if name == "background":  # pin the buffers first, as a run does in its first steps
                ck.step_end(0, False, dict)
                ck.drain()
                res["staging_bytes"] = ck.staging.bytes
                res["staging_gib"] = round(ck.staging.bytes / 2**30, 3)
                res["staging_pinned_by"] = ck.staging.how
                res["staging_allocate_s"] = ck.staging.allocate_s
        meta = {"run_id": "bench", "benchmark": "checkpoint_stall"}
        calls: list[float] = []
        events: list[dict[str, t.Any]] = []
        tokens = 0
        self.sync()
        t0 = time.perf_counter()
        for i in range(1, a.steps + 1):
            tokens += self.step()
            if ck is not None:
                due = i % a.ckpt_every == 0
                c0 = time.perf_counter()
                got = ck.step_end(i, due, lambda: meta)
                if due:
                    calls.append(time.perf_counter() - c0)
                events += [f for k, f in got if k == "checkpoint"]
        self.sync()
        wall = time.perf_counter() - t0
        if ck is not None:
            events += [f for k, f in ck.drain() if k == "checkpoint"]
            ck.close()
        shutil.rmtree(out, ignore_errors=True)
        res.update(steps=a.steps, wall_s=round(wall, 3), tok_s=round(tokens / wall, 1),
                   step_s=round(wall / a.steps, 4), checkpoints=len(events))
        if ck is not None:
            # due ones, written or not: the last one due while a write was still in flight is
            # deferred, and the loop ends before it is taken (a run's final checkpoint covers it)
            res["due"] = len(calls)
        if calls:
            res.update(blocked_max_s=round(max(calls), 4),
                       blocked_mean_s=round(statistics.fmean(calls), 4),
                       blocked_s=[round(x, 4) for x in calls],
                       write_s=[e["write_s"] for e in events],
                       deferred=[e["deferred_from"] for e in events if "deferred_from" in e])
        return res


def run(a: argparse.Namespace) -> dict[str, t.Any]:
    import torch

    bench = Bench(a)
    doc: dict[str, t.Any] = {"torch": torch.__version__, "preset": a.preset, "build_s": bench.build_s,
                             "warmup_s": bench.warm()}
    if bench.cuda:
        doc["gpu"] = torch.cuda.get_device_name(bench.dev)
    root = pathlib.Path(a.ckpt_dir) if a.ckpt_dir else pathlib.Path(
        tempfile.mkdtemp(prefix="ckpt-stall-", dir="/var/tmp"))
    try:
        for name in a.modes:
            doc[name] = bench.mode(name, root)
            print(f"{name}: {doc[name]}", file=sys.stderr, flush=True)
    finally:
        if not a.ckpt_dir:
            shutil.rmtree(root, ignore_errors=True)
    if "none" in doc:
        base = doc["none"]["tok_s"]
        for name in ("background", "sync"):
            if name in doc:
                doc[name]["tok_s_vs_none"] = round(doc[name]["tok_s"] / base, 4)
    if "background" in doc and "none" in doc:
        bg = doc["background"]
        doc["targets"] = {"blocked_at_most_1s": bg.get("blocked_max_s", 0.0) <= 1.0,
                          "tok_s_within_2pct": bg["tok_s_vs_none"] >= 0.98}
    return doc


def main(argv: t.Sequence[str] | None = None) -> int:
    a = parse(argv)
    doc = run(a)
    harness.write_result("checkpoint_stall", doc, a.out, params=vars(a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
