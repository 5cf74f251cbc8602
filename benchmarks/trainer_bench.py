"""Benchmark of the DFlash trainer step on one GPU (the trainer's performance goals).

One run measures, for a Qwen3-8B-shaped random target + 5-layer drafter, block 32,
64 anchors, sequence length 3072, token budget 49152 (16 rows), colocated:

* the target's feature forward alone (tok/s, MFU) -- the ceiling for the whole step --
  as the trainer runs it (fused layers, compiled per shape: compile s, steady s) and as
  transformers' eager forward runs it (the "before"), with their features' agreement;
* the whole step with each of the two targets, side by side (``eager_target_step`` is the
  baseline), and 50 steps' losses of both at the same seed (``loss_curve``);
* the same with the FP8 target (``--target-precision fp8``): its forward and features against
  the bf16 ones (``target_fwd_fp8``), its whole step (``fp8_step``), its loss curve;
* the full step with compiled flex attention: cold compile s, warm compile s (after
  ``torch._dynamo.reset()``, caches on disk), steady tok/s, MFU, peak memory, phase split;
* side by side: compiled flex vs uncompiled flex vs SDPA dense mask (attention fwd+bwd at
  the real shape, and the whole step where it fits);
* flex vs SDPA agreement, forward and backward, on the GPU;
* a torch.profiler table of one compiled step.

Usage (GPU)::

    PYTHONUNBUFFERED=1 python benchmarks/trainer_bench.py --out $OUT
    python benchmarks/trainer_bench.py --preset tiny --device cpu --out /tmp/b   # plumbing check

Writes ``bench.json`` (all numbers) and ``profile.txt`` under ``--out``; prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import tempfile
import time
import traceback
import typing as t

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402


def _args(argv: t.Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seq", type=int, default=3072)
    p.add_argument("--token-budget", type=int, default=49152)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=6, help="timed steady-state steps")
    p.add_argument("--ce-chunk", type=int, default=4096)
    p.add_argument("--peak-tflops", type=float, default=790.0, help="measured matmul rate")
    p.add_argument("--datasheet-tflops", type=float, default=989.0,
                   help="H200 datasheet dense bf16 peak")
    p.add_argument("--target-compile-mode", default=None,
                   help="torch.compile mode for the target (e.g. max-autotune-no-cudagraphs)")
    p.add_argument("--curve-steps", type=int, default=50)
    p.add_argument("--curve-seq", type=int, default=1024)
    p.add_argument("--skip", default="", help="comma list of sections to skip")
    p.add_argument("--out", default="bench-out")
    return p.parse_args(argv)


class Bench:
    def __init__(self, a: argparse.Namespace):
        import torch

        from remote_payload.trainer.config import preset
        from remote_payload.trainer.data import SyntheticSource

        self.a, self.torch = a, torch
        self.out = pathlib.Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.dev = torch.device(a.device)
        self.cuda = self.dev.type == "cuda"
        self.cfg = preset(a.preset)
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.res: dict[str, t.Any] = {"preset": a.preset, "seq": a.seq, "torch": torch.__version__}
        self.src = SyntheticSource(self.cfg.vocab_size, buckets=[a.seq], token_budget=a.token_budget,
                                   max_batch=a.max_batch, n_anchors=self.cfg.max_anchors,
                                   block_size=self.cfg.block_size, seed=0)
        self.skip = set(filter(None, a.skip.split(",")))

    # --- utilities ---------------------------------------------------------------

    def save(self) -> None:
        harness.write_result("trainer_bench", self.res, self.out / "bench.json", params=vars(self.a))

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def timed(self, fn: t.Callable[[], t.Any], n: int) -> list[float]:
        out = []
        for _ in range(n):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.sync()
            out.append(time.perf_counter() - t0)
        return out

    def section(self, name: str, fn: t.Callable[[], t.Any]) -> None:
        if name in self.skip:
            return
        print(f"=== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            self.res[name] = fn()
        except Exception as e:
            traceback.print_exc()
            self.res[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            if self.cuda:
                self.torch.cuda.empty_cache()
        self.res.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
        print(json.dumps({name: self.res[name]}, default=str)[:3000], flush=True)
        self.save()

    def mem(self) -> float:
        return self.torch.cuda.max_memory_allocated() / 2**30 if self.cuda else 0.0

    def engine(self, attn: str, compiled: bool) -> t.Any:
        from remote_payload.trainer.engine import Engine

        return Engine(self.cfg, attn=attn, device=self.dev,
                      autocast_dtype=self.torch.bfloat16 if self.cuda else None,
                      compile_model=compiled, embed=self.target.embed,
                      head_weight=self.target.head_weight, lr=1e-4, weight_decay=0.01,
                      grad_clip=1.0, ce_chunk=self.a.ce_chunk)

    # --- sections ----------------------------------------------------------------

    def env(self) -> dict[str, t.Any]:
        torch = self.torch
        info: dict[str, t.Any] = {"python": sys.version.split()[0]}
        try:
            import transformers

            info["transformers"] = transformers.__version__
        except ImportError:
            pass
        if self.cuda:
            info["gpu"] = torch.cuda.get_device_name()
            x = torch.randn(8192, 8192, device=self.dev, dtype=torch.bfloat16)
            y = torch.randn(8192, 8192, device=self.dev, dtype=torch.bfloat16)
            for _ in range(3):
                x @ y
            ts = self.timed(lambda: x @ y, 10)
            info["matmul_8192_tflops"] = round(2 * 8192**3 / harness.median(ts) / 1e12, 1)
            del x, y
        return info

    def build(self) -> dict[str, t.Any]:
        from remote_payload.trainer.target import build_target

        t0 = time.perf_counter()
        self.target = build_target(self.cfg, self.dev, self.dtype)  # fused, as the trainer
        if self.cuda:
            self.target.compile(**({"mode": self.a.target_compile_mode}
                                   if self.a.target_compile_mode else {}))
        self.ref_target = (build_target(self.cfg, self.dev, self.dtype, fused=False)  # same seed
                           if not {"target_fwd_eager", "eager_target_step", "loss_curve"} <= self.skip
                           else None)
        self.fp8_target = (build_target(self.cfg, self.dev, self.dtype, precision="fp8")
                           if not {"target_fwd_fp8", "fp8_step"} <= self.skip else None)
        if self.fp8_target is not None and self.cuda:
            self.fp8_target.compile()
        self.sync()
        self.batches = [self.src.batch(j) for j in range(3)]
        self.gbatches = [b.to(self.dev) for b in self.batches]
        return {"build_s": round(time.perf_counter() - t0, 1),
                "rows": int(self.batches[0].input_ids.shape[0]),
                "target_layers_run": self.cfg.target_layers_run,
                "layer_ids": list(self.cfg.target_layer_ids),
                "mem_gib": round(self.mem(), 2)}

    def target_fwd(self, target: t.Any = None) -> dict[str, t.Any]:
        from remote_payload.trainer.flops import target_flops_per_token

        target = target or self.target
        ids = self.gbatches[0].input_ids
        self.sync()
        t0 = time.perf_counter()
        target.features(ids)  # the fused target compiles here (one graph for every layer)
        self.sync()
        first = time.perf_counter() - t0
        target.features(ids)
        ts = self.timed(lambda: target.features(ids), 4)
        med = harness.median(ts)
        ntok = ids.numel()
        fl = target_flops_per_token(self.cfg, self.a.seq) * ntok
        return {"first_call_s": round(first, 2), "s": round(med, 4), "tok_s": round(ntok / med),
                "tflops": round(fl / med / 1e12, 1),
                "mfu": round(fl / med / (self.a.peak_tflops * 1e12), 4),
                "mfu_datasheet": round(fl / med / (self.a.datasheet_tflops * 1e12), 4),
                "gflop_per_tok": round(fl / ntok / 1e9, 3)}

    def target_fwd_eager(self) -> dict[str, t.Any]:
        """transformers' eager forward (the "before"), and how far the fused features are."""
        r = self.target_fwd(self.ref_target)
        ids = self.gbatches[0].input_ids
        a = self.ref_target.features(ids).float()
        b = self.target.features(ids).float()
        r["fused_vs_eager_rel"] = float((a - b).norm() / a.norm())
        r["fused_vs_eager_max_abs"] = float((a - b).abs().max())
        del a, b
        return r

    def target_fwd_fp8(self) -> dict[str, t.Any]:
        """The FP8 target's forward, and how far its features are from the bf16 ones."""
        r = self.target_fwd(self.fp8_target)
        ids = self.gbatches[0].input_ids
        q = self.fp8_target.features(ids).float()
        for name, other in (("bf16", self.target), ("eager", self.ref_target)):
            if other is not None:
                a = other.features(ids).float()
                r[f"fp8_vs_{name}_rel"] = float((a - q).norm() / a.norm())
                del a
        r["weights_gib"] = round(sum(b.numel() * b.element_size() for b in self.fp8_target.buffers())
                                 / 2**30, 2)
        r["bf16_weights_gib"] = round(sum(b.numel() * b.element_size() for b in self.target.buffers())
                                      / 2**30, 2)
        del q
        return r

    def fp8_step(self) -> dict[str, t.Any]:
        """The compiled-flex step with the FP8 target."""
        from remote_payload.trainer.train import cache_counters

        r = self.step_bench("flex" if self.cuda else "sdpa", True, self.a.steps, self.fp8_target)
        r["cache"] = cache_counters()
        return r

    def step_bench(self, attn: str, compiled: bool, steps: int, target: t.Any = None) -> dict[str, t.Any]:
        """Whole training step (target features + drafter fwd/bwd + CE + AdamW)."""
        from remote_payload.trainer.flops import step_flops

        torch = self.torch
        target = target or self.target
        eng = self.engine(attn, compiled)
        feats0 = target.features(self.gbatches[0].input_ids)
        self.sync()
        t0 = time.perf_counter()
        eng.train_step(feats0, self.gbatches[0], 1e-4)
        self.sync()
        first = time.perf_counter() - t0
        eng.train_step(feats0, self.gbatches[1], 1e-4)  # a second shape-identical call
        del feats0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        phase = {"target": [], "drafter": []}
        total: list[float] = []
        for i in range(steps):
            b = self.gbatches[i % len(self.gbatches)]
            self.sync()
            t0 = time.perf_counter()
            f = target.features(b.input_ids)
            self.sync()
            t1 = time.perf_counter()
            out = eng.train_step(f, b, 1e-4)
            self.sync()
            t2 = time.perf_counter()
            phase["target"].append(t1 - t0)
            phase["drafter"].append(t2 - t1)
            total.append(t2 - t0)
            del f
        loss = float(out.loss)
        med = harness.median(total)
        cb = self.batches[0]
        fl = step_flops(self.cfg, *cb.input_ids.shape, cb.anchors, cb.valid)
        ntok = cb.n_tokens
        res = {"first_step_s": round(first, 2), "step_s": round(med, 4),
               "tok_s": round(ntok / med), "mfu": round(fl["total"] / med / (self.a.peak_tflops * 1e12), 4),
               "mfu_datasheet": round(fl["total"] / med / (self.a.datasheet_tflops * 1e12), 4),
               "target_s": round(harness.median(phase["target"]), 4),
               "drafter_s": round(harness.median(phase["drafter"]), 4),
               "drafter_tflops": round((fl["total"] - fl["target"]) / harness.median(phase["drafter"])
                                       / 1e12, 1),
               "peak_mem_gib": round(self.mem(), 2), "loss": round(loss, 4),
               "flops": {k: float(f"{v:.4g}") for k, v in fl.items()},
               "gflop_per_tok": round(fl["total"] / ntok / 1e9, 3)}
        self._last_engine = eng
        return res

    def compiled_flex(self) -> dict[str, t.Any]:
        from remote_payload.trainer.train import cache_counters

        # CPU plumbing check: compiled flex has no CPU backward, so compile the SDPA model.
        r = self.step_bench("flex" if self.cuda else "sdpa", True, self.a.steps)
        r["cold_compile_s"] = r.pop("first_step_s")
        r["cache_after_cold"] = cache_counters()
        return r

    def overlap_step(self) -> dict[str, t.Any]:
        """The compiled step with the next batch's target forward enqueued on a side stream
        while this batch's drafter step runs on the main one (colocated ranks only)."""
        torch = self.torch
        if not self.cuda:
            return {"skipped": "cuda only"}
        eng = self._last_engine or self.engine("flex", True)
        side = torch.cuda.Stream()
        main = torch.cuda.current_stream()
        n = self.a.steps + 2

        def feats_on_side(b: t.Any) -> tuple[t.Any, t.Any]:
            side.wait_stream(main)  # the batch's ids were copied on the main stream
            with torch.cuda.stream(side):
                f = self.target.features(b.input_ids)
                done = torch.cuda.Event()
                done.record(side)
            return f, done

        def run(target_first: bool) -> dict[str, t.Any]:
            nxt = feats_on_side(self.gbatches[0])
            times = []
            for i in range(n):
                self.sync()
                t0 = time.perf_counter()
                f, done = nxt
                main.wait_event(done)
                f.record_stream(main)
                b = self.gbatches[i % len(self.gbatches)]
                if target_first and i + 1 < n:
                    nxt = feats_on_side(self.gbatches[(i + 1) % len(self.gbatches)])
                out = eng.train_step(f, b, 1e-4)
                if not target_first and i + 1 < n:
                    nxt = feats_on_side(self.gbatches[(i + 1) % len(self.gbatches)])
                del f
                self.sync()
                times.append(time.perf_counter() - t0)
            steady = harness.median(times[2:])
            ntok = self.batches[0].n_tokens
            return {"step_s": round(steady, 4), "tok_s": round(ntok / steady),
                    "peak_mem_gib": round(self.mem(), 2), "loss": round(float(out.loss), 4)}

        return {"target_enqueued_first": run(True), "drafter_enqueued_first": run(False)}

    def eager_target_step(self) -> dict[str, t.Any]:
        """The same compiled-flex step with transformers' eager target (the baseline)."""
        return self.step_bench("flex" if self.cuda else "sdpa", True, self.a.steps, self.ref_target)

    def loss_curve(self) -> dict[str, t.Any]:
        """``--curve-steps`` steps from the same seed and batches, eager vs compiled target."""
        from remote_payload.trainer.data import SyntheticSource

        seq = self.a.curve_seq
        src = SyntheticSource(self.cfg.vocab_size, buckets=[seq], token_budget=16 * seq,
                              max_batch=16, n_anchors=self.cfg.max_anchors,
                              block_size=self.cfg.block_size, seed=5)
        batches = [src.batch(j).to(self.dev) for j in range(self.a.curve_steps)]
        curves: dict[str, list[float]] = {}
        runs = [("eager", self.ref_target), ("compiled", self.target)]
        if self.fp8_target is not None:
            runs.append(("compiled_fp8", self.fp8_target))
        for name, target in runs:
            self._last_engine = None
            self.torch.manual_seed(0)
            eng = self.engine("flex" if self.cuda else "sdpa", True)
            curves[name] = [float(eng.train_step(target.features(b.input_ids), b, 1e-4).loss)
                            for b in batches]
        diffs = [abs(a - b) for a, b in zip(curves["eager"], curves["compiled"], strict=True)]
        fp8 = {}
        if "compiled_fp8" in curves:
            d8 = [abs(a - b) / max(abs(a), 1e-9)
                  for a, b in zip(curves["eager"], curves["compiled_fp8"], strict=True)]
            fp8 = {"compiled_fp8": [round(x, 4) for x in curves["compiled_fp8"]],
                   "fp8_max_rel_diff": round(max(d8), 4),
                   "first_last_fp8": [round(curves["compiled_fp8"][0], 4),
                                      round(curves["compiled_fp8"][-1], 4)]}
        return {**fp8, "seq": seq, "steps": len(batches), "eager": [round(x, 4) for x in curves["eager"]],
                "compiled": [round(x, 4) for x in curves["compiled"]],
                "max_abs_diff": round(max(diffs), 4),
                "max_rel_diff": round(max(d / max(abs(a), 1e-9)
                                          for d, a in zip(diffs, curves["eager"], strict=True)), 4),
                "first_last_eager": [round(curves["eager"][0], 4), round(curves["eager"][-1], 4)],
                "first_last_compiled": [round(curves["compiled"][0], 4), round(curves["compiled"][-1], 4)]}

    def warm_compile(self) -> dict[str, t.Any]:
        """Recompile from scratch in-process with the on-disk caches warm."""
        import torch._dynamo

        from remote_payload.trainer.train import cache_counters

        self._last_engine = None
        torch._dynamo.reset()
        before = cache_counters()
        eng = self.engine("flex" if self.cuda else "sdpa", True)
        f = self.target.features(self.gbatches[0].input_ids)
        self.sync()
        t0 = time.perf_counter()
        eng.train_step(f, self.gbatches[0], 1e-4)
        self.sync()
        secs = time.perf_counter() - t0
        self._last_engine = eng
        after = cache_counters()
        return {"warm_compile_s": round(secs, 2),
                "cache_delta": {k: after[k] - before.get(k, 0) for k in after}}

    def profile(self) -> dict[str, t.Any]:
        from torch.profiler import ProfilerActivity, profile

        eng = self._last_engine
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        b = self.gbatches[0]
        with profile(activities=acts) as prof:
            for _ in range(2):
                f = self.target.features(b.input_ids)
                eng.train_step(f, b, 1e-4)
            self.sync()
        key = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        ka = prof.key_averages()
        table = ka.table(sort_by=key, row_limit=40, max_name_column_width=70)
        (self.out / "profile.txt").write_text(table)
        cats: dict[str, float] = {}
        tot = 0.0
        for e in ka:
            us = float(getattr(e, key, 0.0))
            # kernel rows only: aten ops repeat their kernels' time, CUPTI markers are not work
            if us <= 0 or (self.cuda and (e.key.startswith(("aten::", "Command Buffer", "Optimizer."))
                                          or "#" in e.key)):
                continue
            cat = _category(e.key.lower())
            cats[cat] = cats.get(cat, 0.0) + us
            tot += us
        return {"per_step_ms": {k: round(v / 2e3, 1) for k, v in sorted(cats.items(), key=lambda x: -x[1])},
                "share": {k: round(v / tot, 3) for k, v in sorted(cats.items(), key=lambda x: -x[1])}}

    def attention_only(self) -> dict[str, t.Any]:
        """One drafter layer's attention, fwd+bwd, at the real shape for each backend."""
        torch = self.torch
        from torch.nn.attention.flex_attention import flex_attention

        from remote_payload.trainer.model import dense_mask, flex_block_mask

        cfg, b = self.cfg, self.gbatches[0]
        rows, seq = b.input_ids.shape
        q_len = cfg.max_anchors * cfg.block_size
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

        def inputs(r: int) -> tuple[t.Any, ...]:
            g = torch.Generator(device=self.dev).manual_seed(0)
            q = torch.randn(r, nh, q_len, hd, device=self.dev, dtype=self.dtype, generator=g)
            k = torch.randn(r, nkv, seq + q_len, hd, device=self.dev, dtype=self.dtype, generator=g)
            v = torch.randn(r, nkv, seq + q_len, hd, device=self.dev, dtype=self.dtype, generator=g)
            return tuple(x.requires_grad_() for x in (q, k, v))

        cflex = torch.compile(flex_attention, dynamic=False)
        out: dict[str, t.Any] = {}

        def run(name: str, r: int, fn: t.Callable[..., t.Any], mask: t.Any) -> None:
            q, k, v = inputs(r)
            go = torch.randn(r, nh, q_len, hd, device=self.dev, dtype=self.dtype)

            def once() -> None:
                o = fn(q, k, v, mask)
                o.backward(go)

            try:
                once()
                ts = self.timed(once, 5)
                out[name] = {"rows": r, "ms": round(harness.median(ts) * 1e3, 3),
                             "ms_per_row": round(harness.median(ts) * 1e3 / r, 4)}
            except Exception as e:  # OOM for eager flex, no CPU backward for flex, ...
                out[name] = {"rows": r, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                if self.cuda:
                    torch.cuda.empty_cache()

        an, va = b.anchors, b.valid
        bm = flex_block_mask(an, va, seq, cfg.block_size)
        run("flex_compiled", rows, lambda q, k, v, m: cflex(q, k, v, block_mask=m, enable_gqa=True), bm)
        d = dense_mask(an, va, seq, cfg.block_size)
        rep = nh // nkv

        def sdpa(q: t.Any, k: t.Any, v: t.Any, m: t.Any) -> t.Any:
            import torch.nn.functional as F

            dm, row_any = m
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                               attn_mask=dm | ~row_any)
            return o * row_any.to(o.dtype)

        run("sdpa_dense", rows, sdpa, (d, d.any(-1, keepdim=True)))
        small = 2  # eager flex materialises (rows, heads, Q, KV) scores: run it on 2 rows
        bm2 = flex_block_mask(an[:small], va[:small], seq, cfg.block_size)
        run("flex_eager", small,
            lambda q, k, v, m: flex_attention(q, k, v, block_mask=m, enable_gqa=True), bm2)
        base = out.get("flex_compiled", {}).get("ms_per_row")
        for v in out.values():
            if base and "ms_per_row" in v:
                v["x_slower_than_compiled_flex"] = round(v["ms_per_row"] / base, 2)
        return out

    def sdpa_step(self) -> dict[str, t.Any]:
        """Whole step, eager drafter with the dense-mask SDPA backend (the CPU path)."""
        self._last_engine = None
        return self.step_bench("sdpa", False, 3)

    def eager_flex_step(self) -> dict[str, t.Any]:
        """Whole step, eager drafter with uncompiled flex (may not fit: reported as error)."""
        self._last_engine = None
        return self.step_bench("flex", False, 2)

    def agreement(self) -> dict[str, t.Any]:
        """Drafter forward+backward with flex (compiled) vs SDPA dense mask, same weights."""
        torch = self.torch

        from remote_payload.trainer.config import preset
        from remote_payload.trainer.data import SyntheticSource, block_inputs
        from remote_payload.trainer.model import Drafter, dense_mask, flex_block_mask

        res: dict[str, t.Any] = {}
        cfg = preset(self.a.preset, draft_layers=2) if self.cuda else self.cfg
        seq = 1024 if self.cuda else 48
        src = SyntheticSource(cfg.vocab_size, buckets=[seq], token_budget=2 * seq, max_batch=2,
                              n_anchors=cfg.max_anchors, block_size=cfg.block_size, seed=3)
        b = src.batch(0)
        b.valid[1, -5:] = False  # exercise the keep-mask
        b = b.to(self.dev)
        ids, pos, _, _ = block_inputs(b, cfg.block_size, cfg.mask_token_id)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        for dt_name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            if dt is torch.bfloat16 and not self.cuda:
                continue
            torch.manual_seed(0)
            fx = Drafter(cfg, "flex").to(self.dev, dt)
            sd = Drafter(cfg, "sdpa").to(self.dev, dt)
            sd.load_state_dict(fx.state_dict())
            feats = torch.randn(2, seq, cfg.feature_width, device=self.dev, dtype=dt)
            emb = torch.randn(*ids.shape, cfg.hidden_size, device=self.dev, dtype=dt)
            gout = torch.randn(*ids.shape, cfg.hidden_size, device=self.dev, dtype=dt)
            cf = torch.compile(fx, dynamic=False)
            ctx = contextlib.nullcontext() if self.cuda else torch.no_grad()  # no CPU flex bwd
            with ctx:
                o1 = cf(feats, emb, pos, flex_block_mask(b.anchors, b.valid, seq, cfg.block_size))
                dm = dense_mask(b.anchors, b.valid, seq, cfg.block_size)
                o2 = sd(feats, emb, pos, (dm, dm.any(-1, keepdim=True)))
            r = {"out_rel": float((o1 - o2).float().norm() / o2.float().norm())}
            if self.cuda:
                (o1.float() * gout).sum().backward()
                (o2.float() * gout).sum().backward()
                g1 = dict(fx.named_parameters())
                worst = 0.0
                for n, p in sd.named_parameters():
                    a, c = g1[n].grad.float(), p.grad.float()
                    worst = max(worst, float((a - c).norm() / c.norm().clamp_min(1e-12)))
                r["grad_rel_max"] = worst
            res[dt_name] = r
        torch.backends.cuda.matmul.allow_tf32 = old
        return res


def _category(n: str) -> str:
    """Coarse bucket of a profiler row (kernel names of cuBLAS, flash, inductor/triton)."""
    if "flash" in n or "fmha" in n or "efficient_attention" in n:
        return "attention kernels (flash/mem-efficient sdpa)"
    if "flex" in n or n.startswith("triton_tem"):
        return "flex attention (drafter)"
    if n.startswith("triton"):
        return "triton fused (inductor)"
    if any(x in n for x in ("gemm", "cutlass", "xmma", "nvjet", "cublas")):
        return "gemm"
    if "adam" in n or "foreach" in n:
        return "optimizer"
    if "copy" in n or "cast" in n or "elementwise" in n or "reduce" in n:
        return "eager elementwise/copy"
    if "nccl" in n:
        return "nccl"
    return "other"


def main(argv: t.Sequence[str] | None = None) -> int:
    a = _args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-bench-"))
    import torch

    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    import torch._dynamo.config as dcfg

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, 16)
    b = Bench(a)
    b.res["inductor_cache_dir"] = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    b.section("env", b.env)
    b.section("build", b.build)
    if "error" in b.res["build"]:
        return 1
    b.section("target_fwd", b.target_fwd)
    b.section("target_fwd_eager", b.target_fwd_eager)
    b.section("compiled_flex", b.compiled_flex)
    b.section("target_fwd_fp8", b.target_fwd_fp8)
    b.section("fp8_step", b.fp8_step)
    b.section("overlap_step", b.overlap_step)
    b.section("eager_target_step", b.eager_target_step)
    b.section("loss_curve", b.loss_curve)
    b.section("warm_compile", b.warm_compile)
    b.section("profile", b.profile)
    b.section("attention_only", b.attention_only)
    b.section("sdpa_step", b.sdpa_step)
    b.section("agreement", b.agreement)
    b.section("eager_flex_step", b.eager_flex_step)
    summary = _summary(b.res)
    (b.out / "summary.txt").write_text(summary)
    print(summary, flush=True)
    return 0


def _summary(r: dict[str, t.Any]) -> str:
    def g(sec: str, key: str) -> t.Any:
        return r.get(sec, {}).get(key, "-") if isinstance(r.get(sec), dict) else "-"

    lines = [f"preset {r['preset']} seq {r['seq']} torch {r['torch']} gpu {g('env', 'gpu')} "
             f"matmul {g('env', 'matmul_8192_tflops')} TFLOP/s"]
    lines.append(f"target fwd alone: compiled {g('target_fwd', 'tok_s')} tok/s (first call "
                 f"{g('target_fwd', 'first_call_s')} s), eager {g('target_fwd_eager', 'tok_s')} tok/s, "
                 f"rel diff {g('target_fwd_eager', 'fused_vs_eager_rel')}")
    lines.append(f"target fwd alone, fp8: {g('target_fwd_fp8', 'tok_s')} tok/s (first call "
                 f"{g('target_fwd_fp8', 'first_call_s')} s), rel diff to bf16 "
                 f"{g('target_fwd_fp8', 'fp8_vs_bf16_rel')}")
    lines.append(f"loss curve max rel diff {g('loss_curve', 'max_rel_diff')} (fp8: "
                 f"{g('loss_curve', 'fp8_max_rel_diff')}) over {g('loss_curve', 'steps')} steps")
    for sec in ("compiled_flex", "fp8_step", "eager_target_step", "sdpa_step", "eager_flex_step"):
        lines.append(f"{sec:16s} step {g(sec, 'step_s')} s  tok/s {g(sec, 'tok_s')}  mfu {g(sec, 'mfu')}  "
                     f"target {g(sec, 'target_s')} s drafter {g(sec, 'drafter_s')} s  peak "
                     f"{g(sec, 'peak_mem_gib')} GiB")
    lines.append(f"compile: cold {g('compiled_flex', 'cold_compile_s')} s, warm "
                 f"{g('warm_compile', 'warm_compile_s')} s")
    lines.append(f"attention fwd+bwd: {json.dumps(r.get('attention_only'))}")
    lines.append(f"agreement: {json.dumps(r.get('agreement'))}")
    lines.append(f"profile: {json.dumps(r.get('profile'))}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
