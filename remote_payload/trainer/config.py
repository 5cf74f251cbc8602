"""Configuration: one model dataclass, one run dataclass, named presets, argv parsing.

Why two dataclasses: :class:`DrafterConfig` describes the model (target shape and drafter
architecture) and travels inside every checkpoint; :class:`TrainArgs` describes one run
(steps, data, devices). Both are plain dataclasses so ``asdict`` is the serialisation.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing as t
from dataclasses import dataclass, field

from .trackers import ReportToError, parse_report_to


class TrainerConfigError(ValueError):
    """A bad flag, preset or shape: nothing was started."""


@dataclass
class DrafterConfig:
    preset: str = "tiny"  # name in PRESETS this config came from (informational)
    # --- target shape (a frozen Qwen3 causal LM) ---
    vocab_size: int = 256  # target vocabulary; the LM head is (vocab_size, hidden_size)
    hidden_size: int = 64  # target width; the drafter runs at the same width
    target_layers: int = 6  # T: decoder layers of the target
    num_heads: int = 4  # attention heads (target and drafter)
    num_kv_heads: int = 2  # GQA key/value heads (target and drafter)
    head_dim: int = 16  # per-head width (Qwen3 decouples it from hidden_size / num_heads)
    intermediate_size: int = 128  # SwiGLU MLP width
    rope_theta: float = 10000.0  # RoPE base (Qwen3 checkpoints use 1e6)
    rms_eps: float = 1e-6  # RMSNorm epsilon
    tie_embeddings: bool = False  # LM head shares the embedding matrix (Qwen3-0.6B does)
    # --- drafter ---
    draft_layers: int = 2  # L: drafter decoder layers
    feature_layers: int = 0  # F: target layers whose outputs feed the drafter's fc; 0 = L
    target_layer_ids: tuple[int, ...] = ()  # target layers (0-based outputs) used as context; () = spread
    block_size: int = 4  # tokens per draft block: [anchor token, MASK x (block_size - 1)]
    max_anchors: int = 8  # N: anchors sampled per sequence (fixed, so shapes stay static)
    gamma: float = 7.0  # loss decay: weight of block position k is exp(-(k - 1) / gamma)
    mask_token_id: int = -1  # token id used for MASK positions; -1 = vocab_size - 1 (the trainer
    # replaces it with the tokenizer's, see tokenizer_mask_id, when a tokenizer is given)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "target_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "draft_layers", "max_anchors"):
            if getattr(self, name) < 1:
                raise TrainerConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.block_size < 2:
            raise TrainerConfigError(f"block_size must be >= 2, got {self.block_size}")
        if self.num_heads % self.num_kv_heads:
            raise TrainerConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise TrainerConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.gamma <= 0:
            raise TrainerConfigError(f"gamma must be > 0, got {self.gamma}")
        if self.mask_token_id == -1:
            self.mask_token_id = self.vocab_size - 1
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise TrainerConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary")
        if self.feature_layers < 0:
            raise TrainerConfigError(f"feature_layers must be >= 0, got {self.feature_layers}")
        if self.target_layer_ids:
            self.target_layer_ids = tuple(self.target_layer_ids)
            self.feature_layers = self.feature_layers or len(self.target_layer_ids)
        else:
            self.feature_layers = self.feature_layers or self.draft_layers
            self.target_layer_ids = spread_layer_ids(self.target_layers, self.feature_layers)
        if len(self.target_layer_ids) != self.feature_layers:
            raise TrainerConfigError(
                f"target_layer_ids has {len(self.target_layer_ids)} entries, "
                f"expected feature_layers={self.feature_layers}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.target_layers]
        if bad:
            raise TrainerConfigError(f"target_layer_ids {bad} outside 0..{self.target_layers - 1}")

    @property
    def feature_width(self) -> int:
        """Width of the concatenated target features the drafter's fc reads: F * H."""
        return len(self.target_layer_ids) * self.hidden_size

    @property
    def target_layers_run(self) -> int:
        """Target layers actually executed: nothing after the last feature layer is needed."""
        return max(self.target_layer_ids) + 1


def spread_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """L layers spread evenly from layer 1 to T-3 (T//2 when L = 1), as in DFlash."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, max(1, num_target_layers - 3)
    span = end - start
    return tuple(round(start + i * span / (num_draft_layers - 1))
                 for i in range(num_draft_layers))


#: Named shapes, looked up by exact name. Qwen3 numbers from the public config.json files.
PRESETS: dict[str, DrafterConfig] = {
    "tiny": DrafterConfig(preset="tiny"),
    "qwen3-0.6b": DrafterConfig(
        preset="qwen3-0.6b", vocab_size=151936, hidden_size=1024, target_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, intermediate_size=3072, rope_theta=1e6, tie_embeddings=True,
        draft_layers=5, block_size=32, max_anchors=64),
    "qwen3-8b": DrafterConfig(
        preset="qwen3-8b", vocab_size=151936, hidden_size=4096, target_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=12288, rope_theta=1e6,
        draft_layers=5, block_size=32, max_anchors=64),
    # The paper's training shape (arXiv 2602.06036, SpecForge's DFlash defaults): block 16,
    # 512 anchors per sequence, gamma 7, an 8-layer drafter reading 5 target layers; the
    # user's block 32 / 64 anchors stay the playbooks' choice (dflash-8gpu.yaml).
    "paper": DrafterConfig(
        preset="paper", vocab_size=151936, hidden_size=4096, target_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=12288, rope_theta=1e6,
        draft_layers=8, feature_layers=5, block_size=16, max_anchors=512, gamma=7.0),
}

#: Default sequence-length buckets per preset (every batch is padded to one of these).
DEFAULT_BUCKETS: dict[str, tuple[int, ...]] = {
    "tiny": (48, 96),
    "qwen3-0.6b": (1024, 2048, 3072, 4096),
    "qwen3-8b": (1024, 2048, 3072, 4096),
    "paper": (1024, 2048, 3072, 4096),
}


def preset(name: str, **overrides: t.Any) -> DrafterConfig:
    """Return the preset called exactly ``name`` with ``overrides`` applied.

    Raises:
        TrainerConfigError: unknown name (the message lists the choices) or invalid override.
    """
    if name not in PRESETS:
        raise TrainerConfigError(f"unknown preset {name!r}; choices: {', '.join(sorted(PRESETS))}")
    base = dataclasses.asdict(PRESETS[name])
    if any(overrides.get(k) is not None for k in ("feature_layers", "target_layers")):
        base["target_layer_ids"] = ()  # re-spread for the new layer counts
    if overrides.get("vocab_size") is not None and overrides.get("mask_token_id") is None:
        base["mask_token_id"] = -1  # the preset's default MASK id belongs to its own vocabulary
    base.update({k: v for k, v in overrides.items() if v is not None})
    return DrafterConfig(**base)


def _h(text: str) -> dict[str, str]:
    return {"help": text}


#: ``--target-precision``: the frozen target's matmuls in the run's dtype (bf16 on CUDA, fp32
#: on CPU) or as row-scaled e4m3 (:mod:`.fp8`)
TARGET_PRECISIONS = ("bf16", "fp8")

#: DDP gradient bucket (MiB) among drafter ranks: ``--ddp-bucket-mb``'s default
#: (docs/trainer-performance.md, "2026-11-30, evening").
DDP_BUCKET_MB = 512


@dataclass
class TrainArgs:
    preset: str = field(default="tiny", metadata=_h("model shape: " + ", ".join(PRESETS)))
    target_path: str | None = field(default=None, metadata=_h(
        "local HF checkpoint dir of the target (config.json + safetensors); default: random weights"))
    draft_layers: int | None = field(default=None, metadata=_h("override the preset's drafter depth"))
    feature_layers: int | None = field(default=None, metadata=_h(
        "override how many target layers feed the drafter (independent of its depth)"))
    block_size: int | None = field(default=None, metadata=_h("override the preset's block size"))
    max_anchors: int | None = field(default=None, metadata=_h("override the preset's anchors/seq"))
    gamma: float | None = field(default=None, metadata=_h("override the loss decay gamma"))
    target_precision: str = field(default="bf16", metadata=_h(
        "the frozen target's matmuls: bf16 (the run's dtype: features as the bf16 model gives them) "
        "or fp8 (e4m3 weights per output channel and activations per token, fp32 scales; needs "
        "compute capability 8.9+, e.g. H100/H200: the step ~1.35x faster on an H200, the features "
        "carry FP8 rounding; for a target served in FP8, or when speed matters more than faithful "
        "features: check the drafter's acceptance with eval before a real run switches)"))
    tokenizer: str | None = field(default=None, metadata=_h(
        "local tokenizer dir: renders 'messages'/'text' records and names the MASK token"))
    data: str = field(default="synthetic", metadata=_h(
        "'synthetic', a JSONL file or a directory of *.jsonl shards ({input_ids, loss_mask} | "
        "{messages} | {text}), or a token store made by 'pack' (memory-mapped)"))
    seq_buckets: str = field(default="", metadata=_h(
        "comma-separated sequence-length buckets (default: the preset's)"))
    token_budget: int = field(default=49152, metadata=_h("max padded tokens per batch per rank"))
    max_batch: int = field(default=64, metadata=_h("max sequences per batch"))
    steps: int = field(default=100, metadata=_h("optimizer steps to run (total, also after resume)"))
    epochs: float = field(default=0.0, metadata=_h(
        "train this many passes over --data instead of --steps (0 = use --steps)"))
    lr: float = field(default=6e-4, metadata=_h("peak learning rate"))
    min_lr_ratio: float = field(default=0.0, metadata=_h("cosine floor as a fraction of lr"))
    warmup_steps: int = field(default=10, metadata=_h("linear warm-up steps"))
    warmup_ratio: float = field(default=0.0, metadata=_h(
        "warm-up as a fraction of all steps (the paper: 0.04); wins over --warmup-steps when > 0"))
    weight_decay: float = field(default=0.01, metadata=_h("AdamW weight decay"))
    grad_clip: float = field(default=1.0, metadata=_h("global grad-norm clip (0 = off)"))
    seed: int = field(default=0, metadata=_h("seed for weights, data and anchors"))
    device: str = field(default="auto", metadata=_h("auto | cpu | cuda"))
    attn: str = field(default="auto", metadata=_h("auto | flex | sdpa (auto: flex on cuda)"))
    compile: str = field(default="auto", metadata=_h("auto | on | off (auto: on for cuda)"))
    dtype: str = field(default="auto", metadata=_h("auto | bf16 | fp32 autocast (auto: bf16 on cuda)"))
    ce_chunk: int = field(default=4096, metadata=_h("most block tokens per LM-head cross-entropy chunk "
                                                     "(cut into equal chunks: one compiled shape)"))
    ddp_bucket_mb: int = field(default=DDP_BUCKET_MB, metadata=_h(
        "DDP gradient bucket size in MiB among drafter ranks (torch's bucket_cap_mb, default 25 "
        "there). Compiled, the drafter's graph is split at every bucket boundary so that each "
        "all-reduce overlaps backward: 512 MiB makes ~8 pieces of the 8B drafter instead of ~30 "
        "(2 H200s: 1.98x one GPU vs 1.97x, 3 GiB less memory, first step 13 s sooner)"))
    topology: str = field(default="colocated", metadata=_h("colocated | split"))
    target_ranks: int = field(default=0, metadata=_h("split: how many ranks run the target"))
    nproc: int = field(default=1, metadata=_h("spawn this many local ranks (ignored under torchrun)"))
    out_dir: str = field(default="runs/dflash", metadata=_h("checkpoints go here"))
    stop_at_step: int = field(default=0, metadata=_h(
        "stop (checkpoint, exit 0) once this step is reached, keeping --steps' schedule (0 = off)"))
    ckpt_every: int = field(default=0, metadata=_h("checkpoint every K steps (0 = only at exit)"))
    ckpt_write: str = field(default="background", metadata=_h(
        "background: a periodic checkpoint is copied to host memory (pinned on CUDA, allocated "
        "once) and written by a background thread while training goes on, at most one in "
        "flight (one due while the last is still being written is deferred, with a warning "
        "event); sync: written on the training thread, which waits for the disk. The final "
        "checkpoint is always complete and durable before 'done'"))
    keep_last: int = field(default=0, metadata=_h(
        "after each checkpoint, remove this run's checkpoints but the N newest (0 = keep all); "
        "never the one 'latest' names, one being read by a resume, export or eval, another "
        "run's, or one changed since it was written"))
    keep_every: int = field(default=0, metadata=_h(
        "with --keep-last: also keep, as milestones, the first checkpoint at or after every "
        "multiple of K steps (0 = none)"))
    resume: str | None = field(default=None, metadata=_h("checkpoint dir, or 'auto' for the latest"))
    replace_checkpoints: bool = field(default=False, metadata=_h(
        "a run that resumes nothing removes the checkpoints other runs left in --out-dir (only "
        "directories the trainer wrote, never one being read) and their 'latest' before it "
        "trains; without it such a run stops at once, naming them"))
    run_id: str = field(default="", metadata=_h("run id recorded in checkpoints (default: random)"))
    log_every: int = field(default=1, metadata=_h("emit a step event every N steps"))
    report_to: str = field(default="none", metadata=_h(
        "experiment trackers, as Hugging Face's report_to: a comma list of tensorboard, wandb, "
        "mlflow; 'all' (every installed one) or 'none'. Rank 0 reports every step/eval metric; "
        "TensorBoard writes <out-dir>/tensorboard, W&B runs offline unless WANDB_API_KEY is set, "
        "MLflow uses $MLFLOW_TRACKING_URI else <out-dir>/mlflow.db. A failing tracker costs a "
        "warning event, never the run"))
    warmup_only: bool = field(default=False, metadata=_h("compile every shape bucket once and exit"))
    save_cache_artifacts: str | None = field(default=None, metadata=_h(
        "write torch.compiler mega-cache artifacts here after compiling"))
    load_cache_artifacts: str | None = field(default=None, metadata=_h(
        "load torch.compiler mega-cache artifacts from here when the file exists "
        "(default: $OPSCTL_CACHE_ARTIFACTS unless --save-cache-artifacts is given)"))
    check_replicas: bool = field(default=False, metadata=_h(
        "at exit, verify all drafter replicas hold identical weights (event 'replicas')"))
    peak_tflops: float = field(default=989.0, metadata=_h(
        "datasheet dense bf16 peak per GPU (H200: 989) for the step event's 'mfu'"))
    matmul_tflops: float = field(default=790.0, metadata=_h(
        "measured bf16 matmul rate per GPU (H200: 790) for the step event's 'mfu_matmul'"))
    pg_timeout: float = field(default=900.0, metadata=_h(
        "seconds a rendezvous or collective may wait before the job fails with an error naming "
        "the rank (longer than one bucket's cold compile, which the other ranks wait through)"))
    debug_fault: str = field(default="", metadata=_h(
        "test switch: 'hang' (rank --debug-fault-rank waits forever on a message no rank sends, "
        "so every rank ends up blocked in a collective) or 'raise' (that rank raises)"))
    debug_fault_rank: int = field(default=0, metadata=_h("rank of --debug-fault"))
    debug_fault_step: int = field(default=1, metadata=_h("step at which --debug-fault fires"))
    debug_fault_plan: str = field(default="", metadata=_h(
        "test switch: one fault per attempt of the job, e.g. 'raise@30,raise@28,hang@25,-': "
        "the k-th entry is attempt k's (the wrapper's OPSCTL_ATTEMPT; '-' or past the list: "
        "none), in place of --debug-fault and --debug-fault-step"))

    def __post_init__(self) -> None:
        choices = {"device": ("auto", "cpu", "cuda"), "attn": ("auto", "flex", "sdpa"),
                   "compile": ("auto", "on", "off"), "dtype": ("auto", "bf16", "fp32"),
                   "topology": ("colocated", "split"), "debug_fault": ("", "hang", "raise"),
                   "ckpt_write": ("background", "sync"),
                   "target_precision": TARGET_PRECISIONS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise TrainerConfigError(
                    f"--{name.replace('_', '-')} {getattr(self, name)!r}; choices: {', '.join(allowed)}")
        if self.preset not in PRESETS:
            raise TrainerConfigError(
                f"unknown preset {self.preset!r}; choices: {', '.join(sorted(PRESETS))}")
        for name in ("token_budget", "max_batch", "ce_chunk", "nproc", "log_every", "ddp_bucket_mb"):
            if getattr(self, name) < 1:
                raise TrainerConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if min(self.steps, self.warmup_steps, self.ckpt_every, self.stop_at_step,
               self.keep_last, self.keep_every) < 0:
            raise TrainerConfigError("--steps, --warmup-steps, --ckpt-every, --stop-at-step, "
                                     "--keep-last and --keep-every must be >= 0")
        if self.keep_every and not self.keep_last:
            raise TrainerConfigError("--keep-every K keeps milestones among what --keep-last N "
                                     "removes: give --keep-last too")
        if not 0 <= self.warmup_ratio < 1:
            raise TrainerConfigError("--warmup-ratio must be in [0, 1)")
        if not self.epochs >= 0:
            raise TrainerConfigError("--epochs must be >= 0")
        if self.epochs and self.data == "synthetic":
            raise TrainerConfigError("--epochs needs --data (synthetic data has no epochs)")
        if not self.pg_timeout > 0:  # also refuses nan
            raise TrainerConfigError("--pg-timeout must be > 0 seconds")
        try:
            parse_report_to(self.report_to)
        except ReportToError as e:
            raise TrainerConfigError(str(e)) from None
        self.fault_plan()  # refuses a malformed plan before anything starts
        if self.topology == "split" and self.target_ranks < 1:
            raise TrainerConfigError("--topology split needs --target-ranks K >= 1")
        if self.topology == "colocated" and self.target_ranks:
            raise TrainerConfigError("--target-ranks only applies to --topology split")

    def fault_plan(self) -> list[tuple[str, int] | None]:
        """``--debug-fault-plan`` as ``(fault, step)`` per attempt (None: no fault).

        Raises:
            TrainerConfigError: an entry that is not ``-``, ``raise@STEP`` or ``hang@STEP``.
        """
        if not self.debug_fault_plan:
            return []
        out: list[tuple[str, int] | None] = []
        for entry in self.debug_fault_plan.split(","):
            kind, at, step = entry.strip().partition("@")
            if kind == "-" and not at:
                out.append(None)
            elif kind in ("raise", "hang") and at and step.isdigit() and len(step) <= 9:
                out.append((kind, int(step)))
            else:
                raise TrainerConfigError(
                    f"--debug-fault-plan entry {entry[:40]!r}: '-', 'raise@STEP' or 'hang@STEP'")
        return out

    def fault_for(self, attempt: int) -> tuple[str, int] | None:
        """This attempt's fault: its plan entry when a plan is given, else --debug-fault."""
        if self.debug_fault_plan:
            plan = self.fault_plan()
            return plan[attempt - 1] if 1 <= attempt <= len(plan) else None
        return (self.debug_fault, self.debug_fault_step) if self.debug_fault else None

    def buckets(self) -> tuple[int, ...]:
        if not self.seq_buckets:
            return DEFAULT_BUCKETS[self.preset]
        try:
            out = tuple(sorted({int(x) for x in self.seq_buckets.split(",") if x.strip()}))
        except ValueError as e:
            raise TrainerConfigError(f"--seq-buckets {self.seq_buckets!r}: {e}") from None
        if not out or out[0] < 2:
            raise TrainerConfigError(f"--seq-buckets {self.seq_buckets!r}: need lengths >= 2")
        return out

    def model_config(self) -> DrafterConfig:
        return preset(self.preset, draft_layers=self.draft_layers,
                      feature_layers=self.feature_layers, block_size=self.block_size,
                      max_anchors=self.max_anchors, gamma=self.gamma)


def parse_args(argv: t.Sequence[str] | None = None) -> TrainArgs:
    """Parse argv into :class:`TrainArgs`; one ``--flag-name`` per field.

    Raises:
        TrainerConfigError: a value fails validation.
    """
    p = argparse.ArgumentParser(prog="python -m remote_payload.trainer",
                                description="Train a DFlash drafter against a frozen Qwen3 target.")
    hints = t.get_type_hints(TrainArgs)
    for f in dataclasses.fields(TrainArgs):
        flag = "--" + f.name.replace("_", "-")
        typ = hints[f.name]
        if typ is bool:
            p.add_argument(flag, dest=f.name, action="store_true", help=f.metadata["help"])
            continue
        conv = next((c for c in (int, float) if typ in (c, c | None)), str)
        p.add_argument(flag, dest=f.name, type=conv, default=f.default, help=f.metadata["help"])
    return TrainArgs(**vars(p.parse_args(argv)))
