"""``python -m remote_payload.trainer e2e``: the whole recipe on a toy language, no downloads.

1. train a small Qwen3 target on :mod:`toy`'s language until it is confident;
2. ``regenerate``: the target answers the training prompts (its answers are the data);
3. train the drafter on them (``--epochs``, warm-up ratio, cosine to 0);
4. ``eval``: tau of the trained drafter and of an untrained one on held-out prompts;
5. ``export`` the drafter in z-lab/dflash's format.

``--size tiny`` runs in well under a minute on one CPU core (the test and the
``dflash-cpu-e2e`` playbook); ``--size gpu`` is the same at a shape that fits one H200 in
minutes (``benchmarks/dflash_e2e_gpu.py``). The last event is ``acceptance``, with
``tau`` and ``tau_untrained``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import random
import sys
import time
import typing as t

from .. import wire
from .config import TrainerConfigError
from .events import Log
from .toy import Language

#: Shapes of the two sizes: toy language, target, data and drafter run.
SIZES: dict[str, dict[str, t.Any]] = {
    "tiny": {"lang": Language(modulus=32, max_stride=3, length=16),
             "target": {"hidden": 64, "layers": 4, "heads": 4, "kv_heads": 2, "head_dim": 16,
                        "steps": 150, "batch": 32, "lr": 3e-3},
             "train_prompts": 320, "eval_prompts": 12, "regen_batch": 64,
             "drafter": ["--draft-layers", "2", "--feature-layers", "2", "--block-size", "8",
                         "--max-anchors", "12", "--seq-buckets", "32", "--token-budget", "512",
                         "--max-batch", "16", "--epochs", "8", "--lr", "3e-3",
                         "--warmup-ratio", "0.05", "--attn", "sdpa", "--compile", "off",
                         "--log-every", "20"]},
    "gpu": {"lang": Language(modulus=256, max_stride=7, length=112),
            "target": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 4, "head_dim": 64,
                       "steps": 600, "batch": 64, "lr": 1e-3},
            "train_prompts": 8192, "eval_prompts": 32, "regen_batch": 512,
            "drafter": ["--draft-layers", "4", "--feature-layers", "3", "--block-size", "16",
                        "--max-anchors", "64", "--seq-buckets", "128", "--token-budget",
                        "16384", "--max-batch", "128", "--epochs", "6", "--lr", "1e-3",
                        "--warmup-ratio", "0.04", "--log-every", "10"]},
}


class _Tee(io.TextIOBase):
    """stdout that also keeps the events it saw (the step events' tok/s and MFU)."""

    def __init__(self, out: t.TextIO):
        self.out, self.events = out, []  # type: ignore[var-annotated,unused-ignore]

    def write(self, s: str) -> int:
        for line in s.splitlines():
            ev = wire.parse_event(line)
            if ev is not None:
                self.events.append(ev)
        self.out.write(s)
        return len(s)

    def flush(self) -> None:
        self.out.flush()


def _write_prompts(path: pathlib.Path, lang: Language, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(n):
            fh.write(json.dumps({"messages": lang.conversation(rng)}) + "\n")


def parse(argv: t.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m remote_payload.trainer e2e",
                                description="Target -> regenerate -> drafter -> tau, on a toy language.")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    p.add_argument("--min-margin", type=float, default=0.0,
                   help="fail (exit 2) unless tau exceeds the untrained drafter's by this much")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def run(argv: t.Sequence[str]) -> dict[str, t.Any]:
    """Run the pipeline; returns the summary (also the ``e2e`` event).

    Raises:
        TrainerConfigError: a step failed (its own message says which).
    """
    import torch

    from . import evaluate, export, regenerate, toy
    from .train import main as train_main

    a = parse(argv)
    size = SIZES[a.size]
    lang: Language = size["lang"]
    out = pathlib.Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = Log()
    dev = "cuda" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available()) else "cpu"
    times: dict[str, float] = {}

    t0 = time.perf_counter()
    log.event(wire.EVENT_PHASE, phase="loading", detail="e2e: training the target", budget_s=600.0)
    target_dir = out / "target"
    tok = toy.make_tokenizer(lang, str(target_dir))
    target = toy.train_target(tok, lang, str(target_dir), device=dev, seed=a.seed, log=log.say,
                              **size["target"])
    times["target_s"] = time.perf_counter() - t0
    _write_prompts(out / "prompts.jsonl", lang, size["train_prompts"], a.seed + 1)
    _write_prompts(out / "heldout.jsonl", lang, size["eval_prompts"], a.seed + 2)
    common = ["--target-path", str(target_dir), "--device", dev]

    t0 = time.perf_counter()
    regen = regenerate.run([*common, "--prompts", str(out / "prompts.jsonl"),
                            "--out", str(out / "regen"), "--max-new-tokens", str(lang.length + 4),
                            "--batch-size", str(size["regen_batch"]), "--engine", "hf"], log)
    times["regenerate_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):  # type: ignore[type-var,unused-ignore]
        rc = train_main(["--preset", "tiny", *common, "--tokenizer", str(target_dir),
                         "--data", str(out / "regen"), "--out-dir", str(out / "drafter"),
                         "--seed", str(a.seed), *size["drafter"]])
    if rc:
        raise TrainerConfigError(f"e2e: drafter training failed (exit code {rc})")
    times["train_s"] = time.perf_counter() - t0
    steps = [e for e in tee.events if e.get("event") == wire.EVENT_STEP]

    t0 = time.perf_counter()
    acc = evaluate.run([*common, "--ckpt", str(out / "drafter"), "--prompts",
                        str(out / "heldout.jsonl"), "--limit", "0", "--max-new-tokens",
                        str(lang.length + 4), "--compare-untrained"], log)
    times["eval_s"] = time.perf_counter() - t0
    exp = export.export(str(out / "drafter"), str(out / "export"))

    summary = {"tau": acc["tau"], "tau_untrained": acc["tau_untrained"],
               "per_position": acc["per_position"], "block_size": acc["block_size"],
               "target_acc": round(target["acc"], 4), "regenerate_tok_s": regen["tok_s"],
               "regenerate_engine": regen["engine"],
               "train_tok_s": steps[-1].get("tok_s") if steps else None,
               "train_mfu": steps[-1].get("mfu") if steps else None,
               "train_mfu_matmul": steps[-1].get("mfu_matmul") if steps else None,
               "train_steps": steps[-1].get("step") if steps else 0,
               "final_loss": steps[-1].get("loss") if steps else None,
               "export": exp["out"], "device": dev, "size": a.size,
               **{k: round(v, 2) for k, v in times.items()}}
    log.event("e2e", **summary)
    log.event(wire.EVENT_ACCEPTANCE, **{k: acc[k] for k in ("tau", "tau_untrained", "per_position",
                                                             "block_size", "blocks", "prompts")})
    if a.min_margin and not acc["tau"] > (acc["tau_untrained"] or 0.0) + a.min_margin:
        raise TrainerConfigError(f"e2e: tau {acc['tau']} is not {a.min_margin} above the "
                                 f"untrained drafter's {acc['tau_untrained']}")
    return summary
