"""The DFlash drafter, its attention mask and the chunked LM-head loss.

Shapes: B batch rows, S padded context length, N anchors per row, K = block_size,
Q = N*K block tokens per row, H hidden, nh/nkv heads, hd head_dim, V vocab.
"""

from __future__ import annotations

import math
import typing as t

import torch
import torch.nn.functional as F
from torch import nn

from .config import DrafterConfig

# --- mask ----------------------------------------------------------------------


def make_mask_mod(anchors: torch.Tensor, valid: torch.Tensor, seq_len: int,
                  block_size: int) -> t.Callable[..., torch.Tensor]:
    """Mask function shared by both backends (so their semantics cannot drift).

    Query q belongs to block q // K; key kv < S is context, kv >= S is block token kv - S.
    A query sees context strictly before its anchor and its own block (bidirectionally);
    invalid blocks see nothing. ``create_block_mask`` pads Q_LEN up to a multiple of 128,
    so queries past N*K are clamped for the lookup and then masked out.
    """
    n = anchors.shape[1]
    q_real = n * block_size

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        blk = q // block_size
        blk_c = torch.clamp(blk, max=n - 1)
        a = anchors[b, blk_c]
        ok = valid[b, blk_c] & (q < q_real)
        ctx_ok = kv < a
        same_block = ((kv - seq_len) // block_size) == blk
        return ok & torch.where(kv < seq_len, ctx_ok, same_block)

    return mask_mod


def dense_mask(anchors: torch.Tensor, valid: torch.Tensor, seq_len: int,
               block_size: int) -> torch.Tensor:
    """(B, 1, Q, S+Q) boolean mask from the same mask function, for SDPA."""
    bsz, n = anchors.shape
    q_len = n * block_size
    dev = anchors.device
    fn = make_mask_mod(anchors, valid, seq_len, block_size)
    b = torch.arange(bsz, device=dev).view(bsz, 1, 1, 1)
    q = torch.arange(q_len, device=dev).view(1, 1, q_len, 1)
    kv = torch.arange(seq_len + q_len, device=dev).view(1, 1, 1, seq_len + q_len)
    return fn(b, torch.zeros_like(b), q, kv)


#: flex_attention's tile: the BlockMask's granularity (``create_block_mask``'s default)
MASK_TILE = 128


def flex_block_mask(anchors: torch.Tensor, valid: torch.Tensor, seq_len: int,
                    block_size: int) -> t.Any:
    """BlockMask for ``flex_attention`` (rebuilt per batch: anchors change every step), the
    same BlockMask as ``create_block_mask(make_mask_mod(...), B, None, Q, S + Q)`` gives,
    tensor for tensor (the tests hold the two to it), so flex computes the same numbers.

    Why not ``create_block_mask``: it evaluates the mask function at every (query, key) pair,
    B x Q x (S+Q) of them, then sums tiles and sorts them. Compiled (needed for its speed on
    the GPU), its sort kernel took ~36 s to build on the H200 (2026-12-02, torch 2.11: three
    configs of one persistent reduction, built one after another), which was half of the
    drafter's cold first step. This mask's rows are intervals known from the anchors (context
    before the anchor, then the row's own block), so each tile's count of visible pairs is
    interval arithmetic on B x Q x tiles integers, in eager mode, with nothing to compile.
    ``make_mask_mod`` stays the one definition of what is visible: flex applies it inside
    partial tiles.
    """
    from torch.nn.attention.flex_attention import BlockMask

    bsz, n = anchors.shape
    q_len = n * block_size
    kv_len = seq_len + q_len
    tile = MASK_TILE
    q_tiles, kv_tiles = -(-q_len // tile), -(-kv_len // tile)
    dev = anchors.device
    q = torch.arange(q_tiles * tile, device=dev)  # the rows of every tile, padding included
    blk = q // block_size
    blk_c = torch.clamp(blk, max=n - 1)
    seen = valid[:, blk_c] & (q < q_len)  # (B, rows): padding and invalid blocks see nothing
    ctx_end = torch.clamp(anchors[:, blk_c], 0, seq_len) * seen  # context [0, ctx_end)
    own = seq_len + blk * block_size  # own block [own, own + K), for rows that see
    lo = torch.arange(kv_tiles, device=dev) * tile  # tile j covers keys [lo_j, lo_j + tile)
    hi = lo + tile
    ctx = torch.clamp(torch.minimum(ctx_end.unsqueeze(-1), hi) - lo, min=0)
    mine = torch.clamp(torch.minimum((own + block_size).unsqueeze(-1), hi)
                       - torch.maximum(own.unsqueeze(-1), lo), min=0) * seen.unsqueeze(-1)
    pairs = (ctx + mine).view(bsz, 1, q_tiles, tile, kv_tiles).sum(3)  # (B, 1, Qt, KVt)
    full = pairs == tile * tile
    partial = (pairs > 0) & ~full
    return BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full),
                                    BLOCK_SIZE=(tile, tile),
                                    mask_mod=make_mask_mod(anchors, valid, seq_len, block_size),
                                    seq_lengths=(q_len, kv_len))


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of tiles: how many are set, and their columns first, in ascending order (the
    order ``create_block_mask`` gives, and so the order flex visits them in)."""
    dense = tiles.to(torch.int32)
    return (dense.sum(-1).to(torch.int32),
            torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32))


#: (cos, sin) of the block queries, (cos, sin) of [context ; block] keys: :meth:`Drafter.rope`
Rope = tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

# --- layers --------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        """Ones, as in the constructor (for :func:`build_drafter`'s ``to_empty``)."""
        with torch.no_grad():
            self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape pos.shape + (head_dim,), computed in fp32."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32)
                           / head_dim))
    ang = pos.float().unsqueeze(-1) * inv
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, h, L, hd); cos/sin: (B or 1, L, hd)."""
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x.float() * c + rot.float() * s).to(x.dtype)


class DraftLayer(nn.Module):
    """Qwen3 decoder layer whose queries come from the block and keys/values from
    [context ; block]."""

    def __init__(self, cfg: DrafterConfig, attn: str):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.hd, self.attn = cfg.num_heads, cfg.num_kv_heads, hd, attn
        self.input_norm = RMSNorm(h, cfg.rms_eps)
        self.q_proj = nn.Linear(h, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_eps)
        self.post_norm = RMSNorm(h, cfg.rms_eps)
        self.gate = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, rope_q: tuple[torch.Tensor, torch.Tensor],
                rope_kv: tuple[torch.Tensor, torch.Tensor], mask: t.Any) -> torch.Tensor:
        bsz, q_len, _ = x.shape
        hn = self.input_norm(x)  # (B, Q, H)
        kv_in = torch.cat([ctx, hn], dim=1)  # (B, S+Q, H)
        kv_len = kv_in.shape[1]
        q = self.q_norm(self.q_proj(hn).view(bsz, q_len, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(bsz, kv_len, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(kv_in).view(bsz, kv_len, self.nkv, self.hd).transpose(1, 2)
        q = apply_rope(q, *rope_q)  # (B, nh, Q, hd)
        k = apply_rope(k, *rope_kv)  # (B, nkv, S+Q, hd)
        if self.attn == "flex":
            from torch.nn.attention.flex_attention import flex_attention

            o = flex_attention(q, k, v, block_mask=mask, enable_gqa=self.nh != self.nkv)
        else:
            rep = self.nh // self.nkv
            if rep > 1:
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            dense, row_any = mask
            # Rows that see nothing attend everywhere and are zeroed afterwards: SDPA kernels
            # may return NaN for an all-False row, flex returns 0; this keeps both at 0.
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=dense | ~row_any)
            o = o * row_any.to(o.dtype)
        o = o.transpose(1, 2).reshape(bsz, q_len, self.nh * self.hd)
        x = x + self.o_proj(o)
        hn = self.post_norm(x)
        out: torch.Tensor = x + self.down(F.silu(self.gate(hn)) * self.up(hn))
        return out


class Drafter(nn.Module):
    """Context fc + norm, L draft layers, final norm. Embeddings and LM head stay outside
    (they are the target's, frozen), so this module holds only trainable weights."""

    def __init__(self, cfg: DrafterConfig, attn: str):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.feature_width, h, bias=False)  # F*H -> H
        self.ctx_norm = RMSNorm(h, cfg.rms_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg, attn) for _ in range(cfg.draft_layers))
        self.norm = RMSNorm(h, cfg.rms_eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scale = 1 / math.sqrt(2 * len(self.layers)) if name.endswith(("o_proj.weight",
                                                                               "down.weight")) else 1
                nn.init.normal_(p, std=std * scale)

    def rope(self, block_pos: torch.Tensor, seq_len: int) -> Rope:
        """RoPE tables of the block queries and of [context ; block] keys, fp32.

        The trainer computes them before the compiled forward and passes them in: computed
        inside the graph, inductor fused the sin/cos (and the ``theta ** x``) into every
        consumer, once per head, forward and again in backward (~11 ms of an H200 step)."""
        ctx_pos = torch.arange(seq_len, device=block_pos.device).unsqueeze(0).expand(
            block_pos.shape[0], -1)
        rope_q = rope_cos_sin(block_pos, self.cfg.head_dim, self.cfg.rope_theta)
        rope_kv = rope_cos_sin(torch.cat([ctx_pos, block_pos], dim=1), self.cfg.head_dim,
                               self.cfg.rope_theta)
        return rope_q, rope_kv

    def forward(self, feats: torch.Tensor, block_emb: torch.Tensor, block_pos: torch.Tensor,
                mask: t.Any, rope: Rope | None = None) -> torch.Tensor:
        """feats (B, S, F*H) target features; block_emb (B, Q, H); block_pos (B, Q);
        ``rope`` = :meth:`rope` of these positions (computed here when not given).
        Returns normed hidden states (B, Q, H) for the LM head."""
        ctx = self.ctx_norm(self.fc(feats))  # (B, S, H), shared by all layers
        rope_q, rope_kv = rope if rope is not None else self.rope(block_pos, feats.shape[1])
        x = block_emb
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_kv, mask)
        out: torch.Tensor = self.norm(x)
        return out


# --- loss ----------------------------------------------------------------------


def build_drafter(cfg: DrafterConfig, attn: str, device: torch.device, seed: int) -> Drafter:
    """A seeded :class:`Drafter` built on the meta device and materialised on ``device``.

    The draws replay the eager ``torch.manual_seed(seed); Drafter(cfg, attn)`` exactly (each
    submodule's ``reset_parameters`` in construction order, then the drafter's own), so on
    the same device the weights are bit-identical (``tests/trainer/test_startup.py``). Why:
    an eager build draws ~1 B fp32 weights twice on the host and copies 4 GB to the GPU.
    On CUDA the draws come from the CUDA generator, so a GPU run's initial drafter differs
    from a host-drawn one of the same seed: the same distribution, other values (loss curves
    agree statistically, not bit for bit)."""
    with torch.device("meta"):
        model = Drafter(cfg, attn)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            reset = getattr(m, "reset_parameters", None)
            if m is not model and callable(reset):
                reset()
        model.reset_parameters()
    return model


def loss_weights(valid: torch.Tensor, block_lm: torch.Tensor, block_size: int,
                 gamma: float) -> torch.Tensor:
    """(B, N*K) weights: validity x (k > 0) x loss mask x exp(-(k-1)/gamma), unnormalized."""
    k = torch.arange(block_size, device=valid.device, dtype=torch.float32)
    decay = torch.where(k > 0, torch.exp(-(k - 1) / gamma), torch.zeros_like(k))
    bsz, n = valid.shape
    w = valid.float().unsqueeze(-1) * decay  # (B, N, K)
    return w.reshape(bsz, n * block_size) * block_lm.float()


def _ce_chunk(logits: torch.Tensor, target: torch.Tensor,
              w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss sum, correct count and d(loss)/d(logits) for one chunk; fp32 math on the fly."""
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    tgt = lf.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    loss = ((lse - tgt) * w).sum()
    correct = ((lf.argmax(-1) == target) & (w > 0)).sum()
    p = torch.exp(lf - lse.unsqueeze(-1))
    p = p.scatter_add(-1, target.unsqueeze(-1), -torch.ones_like(tgt).unsqueeze(-1))  # p - onehot
    return loss, correct, (p * w.unsqueeze(-1)).to(logits.dtype)


def chunk_rows(rows: int, chunk: int) -> tuple[int, int]:
    """(rows per chunk, padding rows): ``rows`` cut into the fewest chunks of at most
    ``chunk`` rows, all of one size, the padding making up the last one."""
    n = max(1, -(-rows // max(1, chunk)))
    size = max(1, -(-rows // n))
    return size, n * size - rows


class LMHeadCE(torch.autograd.Function):
    """Weighted cross-entropy through a frozen LM head, chunked so full (T, V) fp32 logits
    never exist. The input gradient is computed in forward (the head is frozen, so that is
    all backward needs): FLOPs = 4 * V * H per token.

    The T rows are cut into equal chunks of at most ``chunk`` rows (:func:`chunk_rows`), the
    last one padded with rows of weight 0, so the compiled ``chunk_fn`` sees one shape. Cut
    at ``chunk`` exactly, the shorter last chunk was a second compile of the whole CE graph
    on every cold start (T = 31,744 for the qwen3-8b preset: 7 x 4096 + 3072)."""

    @staticmethod
    def forward(ctx: t.Any, h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                w: torch.Tensor, chunk: int, chunk_fn: t.Callable[..., t.Any]) -> t.Any:
        rows = h.shape[0]
        size, pad = chunk_rows(rows, chunk)
        hw = h.to(weight.dtype)
        if pad:  # weight 0: nothing to the loss, the count or the kept gradient rows
            hw, target, w = F.pad(hw, (0, 0, 0, pad)), F.pad(target, (0, pad)), F.pad(w, (0, pad))
        grad = torch.empty_like(hw)
        loss = torch.zeros((), device=h.device, dtype=torch.float32)
        correct = torch.zeros((), device=h.device, dtype=torch.long)
        for i in range(0, hw.shape[0], size):
            hc = hw[i:i + size]
            l_sum, c_sum, g = chunk_fn(hc @ weight.t(), target[i:i + size], w[i:i + size])
            grad[i:i + size] = g @ weight
            loss += l_sum
            correct += c_sum
        ctx.save_for_backward(grad[:rows])
        ctx.in_dtype = h.dtype
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx: t.Any, g_loss: torch.Tensor, g_correct: t.Any) -> t.Any:
        (grad,) = ctx.saved_tensors
        return (grad * g_loss).to(ctx.in_dtype), None, None, None, None, None


def lm_head_loss(h: torch.Tensor, head_weight: torch.Tensor, target: torch.Tensor, w: torch.Tensor,
                 chunk: int, chunk_fn: t.Callable[..., t.Any] = _ce_chunk
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normalized weighted CE and accuracy. h (T, H), target (T,), w (T,) unnormalized.
    Returns (loss, correct, counted) where accuracy = correct / counted."""
    total = w.sum().clamp_min(1e-6)
    loss, correct = LMHeadCE.apply(  # type: ignore[no-untyped-call]  # torch leaves apply untyped
        h, head_weight, target, w / total, chunk, chunk_fn)
    return loss, correct, (w > 0).sum()
