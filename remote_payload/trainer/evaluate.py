"""``python -m remote_payload.trainer eval``: acceptance length of a drafter against its target.

Block-parallel speculative decoding, greedy, one prompt at a time, as the reference's
``dflash_generate`` does it: the drafter fills a block [last token, MASK x (K-1)] from the
target's features of everything before it; one target forward verifies the K-1 drafts,
accepts the longest prefix that equals the target's own greedy choice and adds the target's
next token. The output is exactly the target's greedy output (tested).

tau is counted as z-lab/dflash's benchmark counts it (``dflash/model.py`` ``dflash_generate``
appends ``acceptance_length + 1`` per verifying forward; ``dflash/benchmark.py``
``_print_decode_summary`` prints the mean over prompts of each prompt's mean): every block
counts its accepted drafts + 1 in full, also the block that runs past EOS or ``max_new``,
and the loop has the reference's bounds (it runs while the newest token's position is below
prompt + ``max_new``; it stops after the block that produced a stop token). 1 means the
drafter never helped; K is the ceiling. ``tau_pooled``: the same lengths pooled over all
blocks (long answers weigh more). ``tau_cut``: this project's earlier figure, the tokens that
survive the EOS/``max_new`` cut per verifying forward, pooled (at most ``tau_pooled``; they
differ by what each prompt's last block produced past the cut).

Without a KV cache (each verify re-runs the target over the whole sequence): simple and
exact, fine for held-out sets of a few hundred short prompts; a serving engine measures
speed, this measures the drafter.

Launch::

    python -m remote_payload.trainer eval --ckpt runs/dflash --target-path /models/Qwen3-8B \\
        --prompts heldout.jsonl --limit 200 --compare-untrained
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
import typing as t
from dataclasses import dataclass, field

import torch

from .. import safe_write, wire
from . import checkpoint, fp8, trackers
from .chat_data import iter_json, load_tokenizer, prompt_messages, render_prompt
from .config import TARGET_PRECISIONS, DrafterConfig, TrainerConfigError
from .events import Log
from .model import Drafter, dense_mask
from .target import add_target_args, inference_device, load_causal_lm


@dataclass
class Acceptance:
    """What speculative decoding of a set of prompts counted (see the module docstring)."""

    blocks: int = 0  # verifying target forwards
    kept: int = 0  # tokens of the outputs that the blocks produced, after the EOS/max_new cut
    accepted_at: list[int] = field(default_factory=list)  # [k-1]: blocks accepting position k
    lengths: list[list[int]] = field(default_factory=list)  # per prompt: accepted drafts + 1

    @property
    def tau(self) -> float:
        """z-lab/dflash's: the mean over prompts of each prompt's mean acceptance length."""
        means = [sum(p) / len(p) for p in self.lengths if p]
        return sum(means) / len(means) if means else 0.0

    @property
    def tau_pooled(self) -> float:
        """The same acceptance lengths pooled over every block of every prompt."""
        return sum(map(sum, self.lengths)) / self.blocks if self.blocks else 0.0

    @property
    def tau_cut(self) -> float:
        """Kept tokens per verifying forward, pooled over prompts."""
        return self.kept / self.blocks if self.blocks else 0.0

    def per_position(self) -> list[float]:
        return [round(c / self.blocks, 4) if self.blocks else 0.0 for c in self.accepted_at]


class FeatureTarget:
    """A causal LM whose feature layers' outputs are captured on every forward."""

    def __init__(self, model: t.Any, layer_ids: t.Sequence[int]):
        self.model, self.layer_ids = model, tuple(layer_ids)
        self._out: dict[int, torch.Tensor] = {}
        for i in set(self.layer_ids):
            model.model.layers[i].register_forward_hook(self._hook(i))

    def _hook(self, i: int) -> t.Callable[..., None]:
        def hook(_m: t.Any, _a: t.Any, out: t.Any) -> None:
            self._out[i] = out[0] if isinstance(out, tuple) else out
        return hook

    @torch.no_grad()
    def __call__(self, ids: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy next token at every position (L,) and the features (L, F*H)."""
        x = torch.tensor([ids], device=device)
        logits = self.model(input_ids=x, use_cache=False).logits[0]
        feats = torch.cat([self._out[i][0] for i in self.layer_ids], dim=-1)
        self._out.clear()
        return logits.argmax(-1), feats


@torch.no_grad()
def speculative_decode(target: FeatureTarget, drafter: Drafter, cfg: DrafterConfig,
                       prompt: list[int], max_new: int, eos: int | None,
                       stats: Acceptance, device: torch.device) -> list[int]:
    """Greedy block-parallel speculative decoding of one prompt; returns the new tokens."""
    k = cfg.block_size
    if len(stats.accepted_at) < k - 1:
        stats.accepted_at.extend([0] * (k - 1 - len(stats.accepted_at)))
    embed = target.model.get_input_embeddings()
    head = target.model.get_output_embeddings().weight
    greedy, feats = target(prompt, device)
    seq = [*prompt, int(greedy[-1])]
    ctx = feats  # features of every position before the anchor
    lengths: list[int] = []
    stats.lengths.append(lengths)
    while len(seq) - 1 < len(prompt) + max_new:  # dflash_generate's `while start < max_length`
        a = len(seq) - 1  # anchor: the newest token, whose features the target has not made
        block = torch.tensor([[seq[a]] + [cfg.mask_token_id] * (k - 1)], device=device)
        pos = torch.arange(a, a + k, device=device).unsqueeze(0)
        anchors, valid = torch.tensor([[a]], device=device), torch.ones(1, 1, dtype=torch.bool,
                                                                         device=device)
        dense = dense_mask(anchors, valid, a, k)
        h = drafter(ctx[:a].unsqueeze(0), embed(block), pos, (dense, dense.any(-1, keepdim=True)))
        drafts = (h[0, 1:] @ head.t()).argmax(-1).tolist()
        greedy, feats = target(seq + drafts, device)
        truth = greedy[a:a + k].tolist()  # truth[i]: the target's token at a + i + 1
        n = 0
        while n < k - 1 and drafts[n] == truth[n]:
            stats.accepted_at[n] += 1
            n += 1
        stats.blocks += 1
        lengths.append(n + 1)
        seq += [*drafts[:n], truth[n]]
        ctx = feats[: a + n + 1]  # positions up to a + n hold accepted tokens only
        if eos is not None and eos in seq[len(prompt):]:  # checked after the block, as there
            break
    out = seq[len(prompt):][:max_new]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    stats.kept += max(len(out) - 1, 0)  # the first token is the prefill's, not a block's
    return out


def load_drafter(ckpt: str, device: torch.device) -> tuple[Drafter, DrafterConfig, pathlib.Path]:
    """The raw drafter of a checkpoint directory, or of an out-dir's latest checkpoint.

    Raises:
        CheckpointError: nothing loadable there.
    """
    path = checkpoint.resolve(ckpt, ckpt) if (pathlib.Path(ckpt) / "meta.json").is_file() \
        else checkpoint.resolve("auto", ckpt)
    if path is None:
        raise checkpoint.CheckpointError(f"{ckpt}: no checkpoint there (no meta.json, no latest)")
    meta = checkpoint.read_meta(path)
    cfg = config_from_meta(meta)
    drafter = Drafter(cfg, "sdpa").to(device)
    checkpoint.load(path, drafter, None, device)
    return drafter.eval(), cfg, path


def config_from_meta(meta: dict[str, t.Any]) -> DrafterConfig:
    c = dict(meta["cfg"])
    c["target_layer_ids"] = tuple(c.get("target_layer_ids") or ())
    return DrafterConfig(**c)


def parse(argv: t.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m remote_payload.trainer eval",
                                description="Acceptance length of a drafter (greedy).")
    p.add_argument("--ckpt", required=True, help="checkpoint dir, or a run's --out-dir (latest)")
    add_target_args(p)
    p.add_argument("--prompts", required=True, help="held-out JSONL (messages | prompt)")
    p.add_argument("--limit", type=int, default=64, help="prompts to decode (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per prompt (at least 1)")
    p.add_argument("--compare-untrained", action="store_true",
                   help="also measure a freshly initialised drafter (tau_untrained)")
    p.add_argument("--target-precision", choices=TARGET_PRECISIONS, default="bf16",
                   help="the target's decoder matmuls as served: bf16, or fp8 (e4m3 weights per "
                        "output channel, activations per token, as --target-precision fp8 of "
                        "training; embedding and LM head stay bf16; needs compute capability "
                        "8.9+ on CUDA)")
    p.add_argument("--json-out", default=None,
                   help="also write the result document here (replaced whole; never through "
                        "a link)")
    p.add_argument("--report-to", default="none",
                   help="experiment trackers for tau, as the trainer's --report-to: the run "
                        "'<run id>-eval' beside the checkpoint's run, at the checkpoint's step")
    a = p.parse_args(argv)
    try:
        trackers.parse_report_to(a.report_to)
    except trackers.ReportToError as e:
        raise TrainerConfigError(str(e)) from None
    if a.max_new_tokens < 1:
        raise TrainerConfigError(f"--max-new-tokens {a.max_new_tokens}: at least 1")
    if a.limit < 0:
        raise TrainerConfigError(f"--limit {a.limit}: 0 (all) or more")
    if a.json_out:
        safe_write.check_file(a.json_out)  # before the measurement, not after it
    return a


def measure(target: FeatureTarget, drafter: Drafter, cfg: DrafterConfig,
            prompts: list[list[int]], max_new: int, eos: int | None,
            device: torch.device) -> Acceptance:
    stats = Acceptance()
    for p in prompts:
        speculative_decode(target, drafter, cfg, p, max_new, eos, stats, device)
    return stats


def run(argv: t.Sequence[str], log: Log | None = None) -> dict[str, t.Any]:
    """Measure tau (and tau of an untrained drafter); emits and returns the result.

    Raises:
        TrainerConfigError, CheckpointError: bad flags, paths or checkpoint.
    """

    a = parse(argv)
    log = log or Log()
    device = inference_device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    log.event(wire.EVENT_PHASE, phase="loading", detail="eval", budget_s=300.0)
    tok = load_tokenizer(a.tokenizer or a.target_path)
    drafter, cfg, path = load_drafter(a.ckpt, device)
    model = load_causal_lm(a.target_path, device, dtype)
    if a.target_precision == "fp8":
        if not fp8.supported(device):
            raise TrainerConfigError(f"--target-precision fp8 needs compute capability 8.9+; "
                                     f"{device} has {torch.cuda.get_device_capability(device)}")
        fp8.serve_fp8(model.model.layers)
    target = FeatureTarget(model, cfg.target_layer_ids)
    prompts = []
    for where, rec in iter_json(a.prompts):
        try:
            prompts.append(render_prompt(tok, prompt_messages(rec)))
        except TrainerConfigError as e:
            raise TrainerConfigError(f"{where}: {e}") from None
        if a.limit and len(prompts) >= a.limit:
            break
    log.event(wire.EVENT_PHASE, phase="training", detail="eval", prompts=len(prompts),
              budget_s=600.0)
    t0 = time.perf_counter()
    trained = measure(target, drafter.to(dtype), cfg, prompts, a.max_new_tokens,
                      tok.eos_token_id, device)
    result: dict[str, t.Any] = {
        "tau": round(trained.tau, 4), "tau_pooled": round(trained.tau_pooled, 4),
        "tau_cut": round(trained.tau_cut, 4), "tau_untrained": None,
        "per_position": trained.per_position(), "block_size": cfg.block_size,
        "blocks": trained.blocks, "new_tokens": trained.kept, "prompts": len(prompts),
        "target_precision": a.target_precision,
        "ckpt": str(path), "seconds": round(time.perf_counter() - t0, 3)}
    if a.compare_untrained:
        torch.manual_seed(0)
        fresh = Drafter(cfg, "sdpa").to(device=device, dtype=dtype).eval()
        base = measure(target, fresh, cfg, prompts, a.max_new_tokens, tok.eos_token_id, device)
        result["tau_untrained"] = round(base.tau, 4)
        result["per_position_untrained"] = base.per_position()
    result["step"] = int(checkpoint.read_meta(path).get("step") or 0)
    reporting = _open_trackers(a, cfg, path, log)
    try:
        log.event(wire.EVENT_ACCEPTANCE, **result)
    finally:
        if reporting is not None:
            reporting.close(ok=True)
    untrained = f" (untrained {result['tau_untrained']:.2f})" if a.compare_untrained else ""
    log.say(f"eval: tau {result['tau']:.2f}{untrained}, {result['tau_cut']:.2f} after the "
            f"EOS/max_new cut, over {trained.blocks} blocks of "
            f"{len(prompts)} prompts; accepted per block position "
            + " ".join(f"{x:.2f}" for x in result["per_position"]))
    if a.json_out:
        safe_write.write_text(a.json_out, json.dumps(result, indent=1))
    return result


def _open_trackers(a: argparse.Namespace, cfg: DrafterConfig, path: pathlib.Path,
                   log: Log) -> trackers.Trackers | None:
    """``--report-to`` for the acceptance event: the checkpoint's run directory, its run id."""
    names = trackers.parse_report_to(a.report_to)
    if not names:
        return None
    import dataclasses

    run_id = str(checkpoint.read_meta(path).get("run_id") or "run") + "-eval"

    def warn(tracker: str, message: str, **extra: t.Any) -> None:
        log.event(wire.EVENT_WARNING, source="tracker", tracker=tracker, message=message, **extra)

    info = trackers.RunInfo(
        run_id=run_id, out_dir=str(path.parent),
        config={**trackers.flatten("eval", vars(a)),
                **trackers.flatten("model", dataclasses.asdict(cfg))},
        tags={"torch": torch.__version__, "run": run_id, "ckpt": str(path)})
    opened = trackers.open_trackers(names, info, warn,
                                    lambda **where: log.event(wire.EVENT_TRACKERS, **where))
    if opened is not None:
        log.listeners.append(opened.on_event)
    return opened
