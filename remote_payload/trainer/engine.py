"""One drafter training step (shared by the trainer loop and the benchmark)."""

from __future__ import annotations

import contextlib
import math
import typing as t
from dataclasses import dataclass

import torch
from torch import nn

from .config import DDP_BUCKET_MB, DrafterConfig
from .data import Batch, block_inputs
from .model import _ce_chunk, build_drafter, dense_mask, flex_block_mask, lm_head_loss, loss_weights


@dataclass
class StepOut:
    loss: torch.Tensor  # () normalized weighted CE (detached)
    correct: torch.Tensor  # () correctly predicted weighted positions
    counted: torch.Tensor  # () positions with weight > 0
    grad_norm: torch.Tensor | None


def lr_at(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to ``peak`` then cosine down to ``peak * min_ratio`` at ``total``."""
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    span = max(1, total - warmup)
    frac = min(1.0, (step - warmup) / span)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


class Engine:
    """Owns the raw drafter (what checkpoints save), its wrapped/compiled form, the
    optimizer and the frozen embedding + LM head it borrows from the target."""

    def __init__(self, cfg: DrafterConfig, *, attn: str, device: torch.device,
                 autocast_dtype: torch.dtype | None, compile_model: bool, embed: nn.Embedding,
                 head_weight: torch.Tensor, lr: float, weight_decay: float, grad_clip: float,
                 ce_chunk: int, ddp_group: t.Any = None, ddp_bucket_mb: int = DDP_BUCKET_MB, seed: int = 0):
        self.cfg, self.attn, self.device = cfg, attn, device
        self.autocast_dtype = autocast_dtype
        self.embed, self.head_weight = embed, head_weight
        self.grad_clip, self.ce_chunk = grad_clip, ce_chunk
        self.raw = build_drafter(cfg, attn, device, seed)  # fp32 master weights, on device
        model: nn.Module = self.raw
        if ddp_group is not None:
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(self.raw, process_group=ddp_group, bucket_cap_mb=ddp_bucket_mb,
                        device_ids=[device.index] if device.type == "cuda" else None)
        self.compiled = compile_model
        self.model: t.Callable[..., torch.Tensor] = (
            t.cast(t.Callable[..., torch.Tensor], torch.compile(model, dynamic=False))
            if compile_model else model)
        self.ce_fn = torch.compile(_ce_chunk, dynamic=False) if compile_model else _ce_chunk
        decay = [p for p in self.raw.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.raw.parameters() if p.dim() < 2]
        #: a checkpoint's copy of the weights and moments still in flight (a CUDA event on
        #: the copy's stream, :mod:`.saver`): the next optimizer step, which overwrites
        #: them, waits for it on the GPU; forward and backward do not
        self.pending_copy: t.Any = None
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")

    def make_mask(self, batch: Batch) -> t.Any:
        seq_len, k = batch.input_ids.shape[1], self.cfg.block_size
        if self.attn == "flex":
            return flex_block_mask(batch.anchors, batch.valid, seq_len, k)
        dense = dense_mask(batch.anchors, batch.valid, seq_len, k)
        return dense, dense.any(-1, keepdim=True)

    def autocast(self) -> contextlib.AbstractContextManager[t.Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def forward_loss(self, feats: torch.Tensor, batch: Batch
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss, correct and counted for one batch (graph kept for backward)."""
        cfg = self.cfg
        ids, pos, targets, lm = block_inputs(batch, cfg.block_size, cfg.mask_token_id)
        with torch.no_grad():
            emb = self.embed(ids)
        mask = self.make_mask(batch)
        w = loss_weights(batch.valid, lm, cfg.block_size, cfg.gamma)
        rope = self.raw.rope(pos, feats.shape[1])  # eager: see Drafter.rope
        with self.autocast():
            h = self.model(feats, emb, pos, mask, rope)
        # Each block's first token is its anchor, a given token: its weight is always 0, so
        # the LM head (a quarter of the drafter's FLOPs) skips it: the same loss, 1/K less work.
        b, k = pos.shape[0], cfg.block_size

        def past_anchor(x: torch.Tensor) -> torch.Tensor:  # (B, N*K, ...) -> (B*N*(K-1), ...)
            return x.reshape(b, -1, k, *x.shape[2:])[:, :, 1:].reshape(-1, *x.shape[2:])

        return lm_head_loss(past_anchor(h), self.head_weight, past_anchor(targets),
                            past_anchor(w), self.ce_chunk, self.ce_fn)

    def train_step(self, feats: torch.Tensor, batch: Batch, lr: float) -> StepOut:
        for g in self.opt.param_groups:
            g["lr"] = lr
        loss, correct, counted = self.forward_loss(feats, batch)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        gn = None
        if self.grad_clip > 0:
            gn = torch.nn.utils.clip_grad_norm_(self.raw.parameters(), self.grad_clip)
        if self.pending_copy is not None:
            torch.cuda.current_stream(self.device).wait_event(self.pending_copy)
            self.pending_copy = None
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return StepOut(loss.detach(), correct, counted, gn)
