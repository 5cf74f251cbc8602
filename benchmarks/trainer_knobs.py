"""Kernel-level knobs for the DFlash step on one GPU, each measured against the default.

``trainer_bench.py`` measures the whole step; this script looks one level down, at the two
kinds of kernels that the profile of the compiled step leaves outside cuBLAS:

* ``attn``: the drafter's flex attention (one layer, forward + backward, the real shape and
  block mask) with the default kernel options, with ``USE_TMA`` (off by default on CUDA in
  torch 2.11), and autotuned (``max_autotune`` on a graph holding only flex attention, so
  only its configs are searched); the autotuned winners are parsed from inductor's
  ``AUTOTUNE`` table and re-run as explicit ``kernel_options`` to prove they reproduce.
* ``step``: the drafter's half of a compiled step (features given), profiled per kernel,
  with the block mask and the LM-head loss timed alone;
* ``layer``: one fused target layer (``target.fused_layer_forward``) at the real shape,
  compiled with the default inductor settings and with ``coordinate_descent_tuning``; a
  per-kernel table of each (where the non-GEMM time goes).

Usage (GPU)::

    python benchmarks/trainer_knobs.py --out $OUT            # writes knobs.json + logs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import sys
import tempfile
import time
import typing as t

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

_ROW = re.compile(r"^\s*(triton_\w+)\s+([\d.]+) ms\s+([\d.]+)%\s*(.*)$")
_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2",
         "num_stages", "num_warps")


def parse_autotune(text: str) -> dict[str, dict[str, t.Any]]:
    """The fastest row of each ``AUTOTUNE flex_attention*`` table: {"fwd"|"bwd": options}."""
    best: dict[str, dict[str, t.Any]] = {}
    kind, taken = None, False
    for line in text.splitlines():
        if line.startswith("AUTOTUNE"):
            kind = "bwd" if "backward" in line else ("fwd" if "flex_attention" in line else None)
            taken = False
            continue
        m = _ROW.match(line)
        if kind and m and not taken:
            opts = dict(re.findall(r"(\w+)=([^,]+)", m.group(4)))
            best[kind] = {"ms": float(m.group(2)),
                          **{k: int(opts[k]) for k in _KEYS if k in opts}}
            taken = True
    return best


@contextlib.contextmanager
def stderr_to(path: pathlib.Path) -> t.Iterator[None]:
    """Inductor writes its AUTOTUNE tables straight to fd 2: capture them (and keep a copy)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


class Knobs:
    def __init__(self, a: argparse.Namespace):
        import torch

        from remote_payload.trainer.config import preset
        from remote_payload.trainer.data import SyntheticSource

        self.a, self.torch = a, torch
        self.out = pathlib.Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.dev = torch.device("cuda")
        self.cfg = preset(a.preset)
        src = SyntheticSource(self.cfg.vocab_size, buckets=[a.seq], token_budget=a.token_budget,
                              max_batch=64, n_anchors=self.cfg.max_anchors,
                              block_size=self.cfg.block_size, seed=0)
        self.batch = src.batch(0).to(self.dev)
        self.res: dict[str, t.Any] = {"torch": torch.__version__,
                                      "gpu": torch.cuda.get_device_name()}

    def timed(self, fn: t.Callable[[], t.Any], n: int = 7) -> float:
        torch = self.torch
        fn()
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return harness.median(ts)

    def save(self) -> None:
        harness.write_result("trainer_knobs", self.res, self.out / "knobs.json", params=vars(self.a))

    # --- flex attention ----------------------------------------------------------

    def attn(self) -> dict[str, t.Any]:
        import torch._dynamo
        import torch._inductor.config as icfg
        from torch.nn.attention.flex_attention import flex_attention

        from remote_payload.trainer.model import flex_block_mask

        cfg, b = self.cfg, self.batch
        rows, seq = b.input_ids.shape
        q_len = cfg.max_anchors * cfg.block_size
        g = torch.Generator(device=self.dev).manual_seed(0)

        def rnd(*shape: int) -> t.Any:
            return torch.randn(*shape, device=self.dev, dtype=torch.bfloat16,
                               generator=g).requires_grad_()

        q = rnd(rows, cfg.num_heads, q_len, cfg.head_dim)
        k = rnd(rows, cfg.num_kv_heads, seq + q_len, cfg.head_dim)
        v = rnd(rows, cfg.num_kv_heads, seq + q_len, cfg.head_dim)
        go = torch.randn_like(q)
        mask = flex_block_mask(b.anchors, b.valid, seq, cfg.block_size)
        ref = None
        out: dict[str, t.Any] = {}

        def measure(name: str, opts: dict[str, t.Any], autotune: bool = False) -> None:
            nonlocal ref
            torch._dynamo.reset()
            fn = torch.compile(flex_attention, dynamic=False)

            def fwd() -> t.Any:
                return fn(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=opts or None)

            def both() -> None:
                fwd().backward(go)

            log = self.out / f"attn-{name}.log"
            t0 = time.perf_counter()
            try:
                with stderr_to(log), icfg.patch(max_autotune=autotune):
                    o = fwd()
                    o.backward(go)
                compile_s = time.perf_counter() - t0
                with torch.no_grad():
                    fwd_ms = self.timed(fwd) * 1e3
                both_ms = self.timed(both) * 1e3
                o = fwd().detach().float()
                if ref is None:
                    ref = o
                r: dict[str, t.Any] = {
                    "opts": opts, "compile_s": round(compile_s, 1), "fwd_ms": round(fwd_ms, 3),
                    "fwd_bwd_ms": round(both_ms, 3),
                    "rel_vs_default": float((o - ref).norm() / ref.norm())}
                if autotune:
                    r["autotune_best"] = parse_autotune(log.read_text(errors="replace"))
                out[name] = r
            except Exception as e:  # a config the kernel rejects is a result, not a crash
                out[name] = {"opts": opts, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            q.grad = k.grad = v.grad = None
            print(name, json.dumps(out[name], default=str), flush=True)

        measure("default", {})
        measure("tma", {"USE_TMA": True})
        measure("autotune", {}, autotune=True)
        measure("autotune_tma", {"USE_TMA": True}, autotune=True)
        for src in ("autotune", "autotune_tma"):
            best = out.get(src, {}).get("autotune_best") or {}
            if "fwd" not in best or "bwd" not in best:
                continue
            opts: dict[str, t.Any] = {"USE_TMA": True} if src.endswith("tma") else {}
            opts.update({f"fwd_{k}": v for k, v in best["fwd"].items() if k != "ms"})
            opts.update({f"bwd_{k}": v for k, v in best["bwd"].items() if k != "ms"})
            measure(f"{src}_explicit", opts)
        return out

    # --- the drafter's half of the step ------------------------------------------

    def step(self) -> dict[str, t.Any]:
        return self._step({})

    def step_cdt(self) -> dict[str, t.Any]:
        """The same with ``coordinate_descent_tuning`` for every graph of the drafter's step."""
        return self._step({"coordinate_descent_tuning": True})

    def _step(self, patch: dict[str, t.Any]) -> dict[str, t.Any]:
        import torch._dynamo
        import torch._inductor.config as icfg
        from torch.profiler import ProfilerActivity, profile

        from remote_payload.trainer.engine import Engine
        from remote_payload.trainer.target import build_target

        torch._dynamo.reset()
        torch.cuda.empty_cache()
        cfg, b = self.cfg, self.batch
        target = build_target(cfg, self.dev, torch.bfloat16)
        target.compile()
        feats = target.features(b.input_ids)
        eng = Engine(cfg, attn="flex", device=self.dev, autocast_dtype=torch.bfloat16,
                     compile_model=True, embed=target.embed, head_weight=target.head_weight,
                     lr=1e-4, weight_decay=0.01, grad_clip=1.0, ce_chunk=4096)
        t0 = time.perf_counter()
        with icfg.patch(**patch):
            eng.train_step(feats, b, 1e-4)
            torch.cuda.synchronize()
        out: dict[str, t.Any] = {"compile_s": round(time.perf_counter() - t0, 1)}
        out["drafter_step_ms"] = round(self.timed(lambda: eng.train_step(feats, b, 1e-4), 5) * 1e3, 2)
        out["mask_ms"] = round(self.timed(lambda: eng.make_mask(b)) * 1e3, 3)

        def fwd_loss() -> None:
            with torch.no_grad():
                eng.forward_loss(feats, b)

        out["forward_loss_nograd_ms"] = round(self.timed(fwd_loss, 5) * 1e3, 2)
        with profile(activities=[ProfilerActivity.CUDA], record_shapes=False) as prof:
            for _ in range(2):
                eng.train_step(feats, b, 1e-4)
            torch.cuda.synchronize()
        rows_ = []
        total = 0.0
        for e in prof.key_averages():
            us = float(getattr(e, "self_device_time_total", 0.0))
            if us <= 0 or e.key.startswith(("aten::", "Command Buffer", "Optimizer.")) or "#" in e.key:
                continue
            total += us
            rows_.append((round(us / 2e3, 3), e.count // 2, e.key[:110]))
        rows_.sort(reverse=True)
        out["kernel_ms_total"] = round(total / 2e3, 1)
        out["kernels_ms"] = rows_[:45]
        (self.out / f"step-profile{'-cdt' if patch else ''}.txt").write_text(
            prof.key_averages().table(sort_by="self_device_time_total", row_limit=80,
                                      max_name_column_width=120))
        for r in rows_[:45]:
            print(r, flush=True)
        return out

    # --- cuBLAS GEMMs: heuristics vs TunableOp -------------------------------------

    def gemm(self) -> dict[str, t.Any]:
        """The step's GEMM shapes (as F.linear calls) with cuBLAS's heuristic choice and
        with PyTorch TunableOp (which times the candidate algorithms once per shape)."""
        torch = self.torch
        import torch.nn.functional as F

        cfg = self.cfg
        h, ff = cfg.hidden_size, cfg.intermediate_size
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        ctx, blk = self.a.token_budget, cfg.max_anchors * cfg.block_size * 16
        shapes = {"target_qkv": (ctx, h, qkv), "target_o": (ctx, h, h),
                  "target_gate_up": (ctx, h, 2 * ff), "target_down": (ctx, ff, h),
                  "drafter_gate": (blk, h, ff), "drafter_down": (blk, ff, h),
                  "drafter_q": (blk, h, h), "lm_head_chunk": (4096, h, cfg.vocab_size)}
        out: dict[str, t.Any] = {}
        for name, (m, k, n) in shapes.items():
            x = torch.randn(m, k, device=self.dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=self.dev, dtype=torch.bfloat16)
            fl = 2 * m * k * n
            r: dict[str, t.Any] = {}
            for mode in ("heuristic", "tunableop"):
                torch.cuda.tunable.enable(mode == "tunableop")
                torch.cuda.tunable.tuning_enable(mode == "tunableop")
                s_ = self.timed(lambda x=x, w=w: F.linear(x, w), 9)
                r[mode] = round(fl / s_ / 1e12, 1)
            torch.cuda.tunable.enable(False)
            out[name] = r
            print(name, r, flush=True)
            del x, w
        return out

    # --- one fused target layer --------------------------------------------------

    def layer(self) -> dict[str, t.Any]:
        import torch._dynamo
        import torch._inductor.config as icfg
        from torch.profiler import ProfilerActivity, profile

        from remote_payload.trainer.target import fused_layer_forward

        cfg = self.cfg
        rows, seq = self.batch.input_ids.shape
        h, nh, nkv, hd, ff = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                              cfg.intermediate_size)
        g = torch.Generator(device=self.dev).manual_seed(1)

        def rnd(*shape: int, std: float = 0.02) -> t.Any:
            return (torch.randn(*shape, device=self.dev, generator=g) * std).to(torch.bfloat16)

        w = (1 + rnd(h), rnd((nh + 2 * nkv) * hd, h), 1 + rnd(hd), 1 + rnd(hd), rnd(h, nh * hd),
             1 + rnd(h), rnd(2 * ff, h), rnd(h, ff))
        x = rnd(rows, seq, h, std=1.0)
        ang = torch.arange(seq, device=self.dev).float()[:, None] * torch.rand(hd, device=self.dev)
        cos = ang.cos().to(torch.bfloat16).expand(rows, seq, hd)
        sin = ang.sin().to(torch.bfloat16).expand(rows, seq, hd)
        per = 2 * (h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * ff)
        gemm_s = per * rows * seq / 790e12
        out: dict[str, t.Any] = {"gemm_s_at_790": round(gemm_s * 1e3, 3)}
        for name, patch in (("default", {}), ("coordinate_descent", {"coordinate_descent_tuning": True})):
            torch._dynamo.reset()
            fn = torch.compile(fused_layer_forward, dynamic=False)
            t0 = time.perf_counter()
            with icfg.patch(**patch), torch.no_grad():
                fn(x, cos, sin, w, (nh, nkv, hd), cfg.rms_eps)
            compile_s = time.perf_counter() - t0
            with torch.no_grad():
                ms = self.timed(lambda f=fn: f(x, cos, sin, w, (nh, nkv, hd), cfg.rms_eps)) * 1e3
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        fn(x, cos, sin, w, (nh, nkv, hd), cfg.rms_eps)
                    torch.cuda.synchronize()
            rows_ = []
            for e in prof.key_averages():
                us = float(getattr(e, "self_device_time_total", 0.0))
                if us <= 0 or e.key.startswith(("aten::", "Command Buffer")):
                    continue
                rows_.append((round(us / 3e3, 3), e.count // 3, e.key[:90]))
            rows_.sort(reverse=True)
            out[name] = {"compile_s": round(compile_s, 1), "layer_ms": round(ms, 3),
                         "kernels_ms": rows_[:25]}
            print(name, json.dumps(out[name])[:2500], flush=True)
        return out


def main(argv: t.Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--seq", type=int, default=3072)
    p.add_argument("--token-budget", type=int, default=49152)
    p.add_argument("--only", default="attn,layer,step,step_cdt,gemm")
    p.add_argument("--out", default="knobs-out")
    a = p.parse_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-knobs-"))
    import torch
    import torch._dynamo.config as dcfg

    dcfg.cache_size_limit = 64
    torch.backends.cuda.matmul.allow_tf32 = True
    k = Knobs(a)
    for name in a.only.split(","):
        t0 = time.perf_counter()
        try:
            k.res[name] = getattr(k, name)()
        except Exception as e:
            import traceback

            traceback.print_exc()
            k.res[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        k.res.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
        k.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
