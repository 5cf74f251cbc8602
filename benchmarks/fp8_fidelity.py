"""How far the FP8 target's features are from exact ones, layer by layer (one GPU, ~2 min).

The reference is the bf16 target's own weights run in fp32 (the fused layers, pinned to
transformers' own forward by a CPU test; TF32 off); against it, per feature layer, the
relative L2 error of the target as the trainer runs it in bf16 (compiled), and in FP8
(``--target-precision fp8``, compiled) with and without Hopper's fast accumulation; each
also timed alone (forward of ``--rows`` x ``--seq`` tokens). The random-weight target
amplifies any perturbation with depth, so the bf16 row is the yardstick for the FP8 rows,
not zero::

    PYTHONUNBUFFERED=1 python3 benchmarks/fp8_fidelity.py --out $OUT/fp8_fidelity.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import typing as t

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: t.Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--seq", type=int, default=3072)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="fp8_fidelity.json")
    a = p.parse_args(argv)
    import torch

    from benchmarks import harness
    from remote_payload.trainer import fp8
    from remote_payload.trainer.config import preset
    from remote_payload.trainer.target import build_target

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device(a.device)
    cfg = preset(a.preset)
    ids = torch.randint(0, cfg.vocab_size, (a.rows, a.seq), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(7))
    h = cfg.hidden_size

    def per_layer(x: t.Any, ref: t.Any) -> list[float]:
        return [round(float((x[..., i * h:(i + 1) * h].float() - ref[..., i * h:(i + 1) * h]).norm()
                            / ref[..., i * h:(i + 1) * h].norm()), 4)
                for i in range(len(cfg.target_layer_ids))]

    def timed(target: t.Any) -> float:
        """The median of 3 forwards after one untimed (each waits for the GPU)."""
        def forward() -> None:
            target.features(ids)
            if dev.type == "cuda":
                torch.cuda.synchronize()

        return round(harness.timed(forward, runs=3, warmup=1).median_s, 4)

    res: dict[str, t.Any] = {"preset": a.preset, "rows": a.rows, "seq": a.seq,
                             "layer_ids": list(cfg.target_layer_ids), "torch": torch.__version__}
    # the same weights as every target below (random init draws differ between dtypes)
    exact = build_target(cfg, dev, torch.bfloat16).float()
    with torch.no_grad():
        ref = exact.features(ids).float()
    del exact
    runs: list[tuple[str, str, bool]] = [("bf16", "bf16", True), ("fp8", "fp8", True),
                                         ("fp8_exact_accum", "fp8", False)]
    for name, precision, fast in runs:
        fp8.FAST_ACCUM = fast
        torch._dynamo.reset()
        target = build_target(cfg, dev, torch.bfloat16, precision=precision)
        if dev.type == "cuda":
            target.compile()
        feats = target.features(ids)
        res[name] = {"rel_err_per_feature_layer": per_layer(feats, ref),
                     "rel_err_all": round(float((feats.float() - ref).norm() / ref.norm()), 4),
                     "forward_s": timed(target)}
        if name != "bf16":
            base = res["bf16"]["forward_s"]
            res[name]["speedup_vs_bf16"] = round(base / res[name]["forward_s"], 3)
        print(json.dumps({name: res[name]}), flush=True)
        del target, feats
    fp8.FAST_ACCUM = True
    harness.write_result("fp8_fidelity", res, a.out, params=vars(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
