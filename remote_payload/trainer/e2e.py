"""``python -m remote_payload.trainer e2e``: the whole recipe on a toy language, no downloads.

1. train a small Qwen3 target on :mod:`toy`'s language until it is confident;
2. ``regenerate``: the target answers the training prompts (its answers are the data);
3. train the drafter on them (``--epochs``, warm-up ratio, cosine to 0);
4. ``eval``: tau of the trained drafter and of an untrained one on held-out prompts;
5. ``export`` the drafter in z-lab/dflash's format.

``--fp8-compare`` then asks what FP8 features cost in acceptance: a second drafter trains
from the same seed on the same data with ``--target-precision fp8`` (the target's features
carry FP8 rounding), and both drafters are measured against the bf16 target (the one that is
served) and against the same target served in FP8 (``eval --target-precision fp8``). Its
taus land in the summary as ``fp8_compare``. FP8 needs compute capability 8.9+ on CUDA; the
CPU runs it too (slowly), so ``--size tiny`` checks the whole path.

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

from .. import safe_write, wire
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
    safe_write.write_text(path, "".join(json.dumps({"messages": lang.conversation(rng)}) + "\n"
                                        for _ in range(n)))


def parse(argv: t.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m remote_payload.trainer e2e",
                                description="Target -> regenerate -> drafter -> tau, on a toy language.")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    p.add_argument("--min-margin", type=float, default=0.0,
                   help="fail (exit 2) unless tau exceeds the untrained drafter's by this much")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drafter-epochs", type=int, default=None,
                   help="the drafter's epochs instead of the size's (fewer: a drafter short of "
                        "the ceiling, where a difference in acceptance can show)")
    p.add_argument("--fp8-compare", action="store_true",
                   help="also train a drafter on FP8 features and measure both drafters against "
                        "the bf16 and an FP8-served target (summary: fp8_compare)")
    a = p.parse_args(argv)
    if a.drafter_epochs is not None and a.drafter_epochs < 1:
        raise TrainerConfigError(f"--drafter-epochs {a.drafter_epochs}: at least 1")
    return a


def _train_drafter(train_main: t.Callable[[list[str]], int], argv: list[str]) -> list[dict[str, t.Any]]:
    """Train one drafter; returns the step events it printed.

    Raises:
        TrainerConfigError: the run failed.
    """
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):  # type: ignore[type-var,unused-ignore]
        rc = train_main(argv)
    if rc:
        raise TrainerConfigError(f"e2e: drafter training failed (exit code {rc})")
    return [e for e in tee.events if e.get("event") == wire.EVENT_STEP]


def _fp8_compare(run_eval: t.Callable[[str, str], dict[str, t.Any]], bf16_ckpt: str,
                 fp8_ckpt: str, bf16_tau: dict[str, t.Any]) -> dict[str, t.Any]:
    """tau of each drafter (features bf16 | fp8) against each target (served bf16 | fp8)."""
    cells: dict[str, dict[str, t.Any]] = {
        "bf16_features/bf16_target": bf16_tau,
        "fp8_features/bf16_target": run_eval(fp8_ckpt, "bf16"),
        "fp8_features/fp8_target": run_eval(fp8_ckpt, "fp8"),
        "bf16_features/fp8_target": run_eval(bf16_ckpt, "fp8"),
    }
    return {name: {k: c[k] for k in ("tau", "tau_pooled", "tau_cut", "blocks")}
            for name, c in cells.items()}


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

    epochs = [] if a.drafter_epochs is None else ["--epochs", str(a.drafter_epochs)]

    def train_argv(name: str, *extra: str) -> list[str]:
        return ["--preset", "tiny", *common, "--tokenizer", str(target_dir), "--data",
                str(out / "regen"), "--out-dir", str(out / name), "--seed", str(a.seed),
                # the pipeline starts over each time: an earlier pipeline's drafter goes
                "--replace-checkpoints", *size["drafter"], *epochs, *extra]

    def run_eval(ckpt: str, precision: str, *extra: str) -> dict[str, t.Any]:
        return evaluate.run([*common, "--ckpt", ckpt, "--prompts", str(out / "heldout.jsonl"),
                             "--limit", "0", "--max-new-tokens", str(lang.length + 4),
                             "--target-precision", precision, *extra], log)

    t0 = time.perf_counter()
    steps = _train_drafter(train_main, train_argv("drafter"))
    times["train_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    acc = run_eval(str(out / "drafter"), "bf16", "--compare-untrained")
    times["eval_s"] = time.perf_counter() - t0
    exp = export.export(str(out / "drafter"), str(out / "export"))
    fp8_summary: dict[str, t.Any] = {}
    if a.fp8_compare:
        t0 = time.perf_counter()
        torch._dynamo.reset()  # the second run compiles afresh, not against the first's guards
        fp8_steps = _train_drafter(train_main, train_argv("drafter-fp8", "--target-precision",
                                                           "fp8"))
        times["train_fp8_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        fp8_summary = {
            "fp8_compare": _fp8_compare(run_eval, str(out / "drafter"), str(out / "drafter-fp8"),
                                        acc),
            "train_fp8_tok_s": fp8_steps[-1].get("tok_s") if fp8_steps else None,
            "final_loss_fp8": fp8_steps[-1].get("loss") if fp8_steps else None}
        times["eval_fp8_s"] = time.perf_counter() - t0

    summary = {"tau": acc["tau"], "tau_pooled": acc["tau_pooled"], "tau_cut": acc["tau_cut"],
               "tau_untrained": acc["tau_untrained"],
               "per_position": acc["per_position"], "block_size": acc["block_size"],
               "target_acc": round(target["acc"], 4), "regenerate_tok_s": regen["tok_s"],
               "regenerate_engine": regen["engine"],
               "train_tok_s": steps[-1].get("tok_s") if steps else None,
               "train_mfu": steps[-1].get("mfu") if steps else None,
               "train_mfu_matmul": steps[-1].get("mfu_matmul") if steps else None,
               "train_steps": steps[-1].get("step") if steps else 0,
               "final_loss": steps[-1].get("loss") if steps else None,
               "export": exp["out"], "device": dev, "size": a.size, "seed": a.seed,
               "drafter_epochs": a.drafter_epochs,
               **fp8_summary, **{k: round(v, 2) for k, v in times.items()}}
    log.event("e2e", **summary)
    log.event(wire.EVENT_ACCEPTANCE, **{k: acc[k] for k in ("tau", "tau_cut", "tau_untrained",
                                                             "per_position",
                                                             "block_size", "blocks", "prompts")})
    if a.min_margin and not acc["tau"] > (acc["tau_untrained"] or 0.0) + a.min_margin:
        raise TrainerConfigError(f"e2e: tau {acc['tau']} is not {a.min_margin} above the "
                                 f"untrained drafter's {acc['tau_untrained']}")
    return summary
