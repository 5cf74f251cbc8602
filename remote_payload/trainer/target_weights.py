"""The Qwen3 target's tensors without transformers: their names and shapes (transformers'
state-dict layout), the random weights drawn exactly as transformers' eager build draws them,
and the default RoPE tables.

Why not build transformers' ``Qwen3ForCausalLM`` (the trainer's target is built here instead): at every
restart, importing its modules cost 2.5-4 s (they pull in generation, ``masking_utils`` and with
it ``torch._dynamo``, ``torch.distributed.tensor``, scikit-learn), and building 36 layers on the
meta device and materialising them module by module another 4-5 s, for weights that are random
or read from disk and are then rebuilt into :class:`.target.FusedLayer` anyway. Here the same
tensors are allocated once on the device, q/k/v and gate/up already fused (their draws go into
row blocks of the fused tensor), and nothing else is built.

transformers stays the yardstick: ``tests/trainer/test_startup.py`` checks every tensor bit for
bit against its eager build, and these RoPE tables against its rotary module. Its reference
forward (``fused=False``) still runs its own modules.
"""

from __future__ import annotations

import math
import typing as t

import torch

from .config import DrafterConfig

#: transformers' ``initializer_range`` for Qwen3 (its config's default; the presets keep it)
INIT_STD = 0.02
#: the seeds the trainer has always used for the target's two generators
GLOBAL_SEED_OFFSET, HEAD_SEED_OFFSET = 1_000_003, 17

#: a layer's tensors in transformers' module order (the order their draws are made in)
_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_NORMS = ("self_attn.q_norm", "self_attn.k_norm", "input_layernorm", "post_attention_layernorm")


class LayerWeights(t.NamedTuple):
    """One decoder layer, q/k/v and gate/up fused row-wise (the order :class:`FusedLayer` uses)."""

    in_norm: torch.Tensor  # (H,)
    qkv: torch.Tensor  # ((nh + 2 nkv) hd, H): q rows, then k, then v
    q_norm: torch.Tensor  # (hd,)
    k_norm: torch.Tensor  # (hd,)
    o: torch.Tensor  # (H, nh hd)
    post_norm: torch.Tensor  # (H,)
    gate_up: torch.Tensor  # (2 I, H): gate rows, then up
    down: torch.Tensor  # (H, I)


class TargetWeights(t.NamedTuple):
    embed: torch.Tensor  # (V, H)
    head: torch.Tensor  # (V, H); the embedding itself when tied
    layers: list[LayerWeights]  # the decoder layers kept (all, or none for a head-only rank)


def layout(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen3 causal LM of ``cfg``'s shape: transformers' state-dict name ->
    shape (no ``lm_head.weight`` when the embeddings are tied)."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv = cfg.num_heads, cfg.num_kv_heads
    per_layer = {"self_attn.q_proj": (nh * hd, h), "self_attn.k_proj": (nkv * hd, h),
                 "self_attn.v_proj": (nkv * hd, h), "self_attn.o_proj": (h, nh * hd),
                 "self_attn.q_norm": (hd,), "self_attn.k_norm": (hd,), "mlp.gate_proj": (i, h),
                 "mlp.up_proj": (i, h), "mlp.down_proj": (h, i), "input_layernorm": (h,),
                 "post_attention_layernorm": (h,)}
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for n in range(cfg.target_layers):
        out.update({f"model.layers.{n}.{k}.weight": s for k, s in per_layer.items()})
    out["model.norm.weight"] = (h,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    return out


def fuse_layer(state: dict[str, torch.Tensor], n: int) -> LayerWeights:
    """Layer ``n`` of a transformers state dict, q/k/v and gate/up concatenated; the separate
    tensors are taken out of ``state`` (freed as the caller goes: peak + one layer)."""
    p = f"model.layers.{n}."
    w = {k: state.pop(p + k + ".weight") for k in (*_LINEARS, *_NORMS)}
    return LayerWeights(
        in_norm=w["input_layernorm"],
        qkv=torch.cat([w["self_attn.q_proj"], w["self_attn.k_proj"], w["self_attn.v_proj"]]),
        q_norm=w["self_attn.q_norm"], k_norm=w["self_attn.k_norm"], o=w["self_attn.o_proj"],
        post_norm=w["post_attention_layernorm"],
        gate_up=torch.cat([w["mlp.gate_proj"], w["mlp.up_proj"]]), down=w["mlp.down_proj"])


def random_weights(cfg: DrafterConfig, device: torch.device, dtype: torch.dtype, seed: int,
                   body: bool) -> TargetWeights:
    """The random target the trainer has always trained against, drawn on ``device``.

    The draws replay, tensor by tensor and from the same generators, what an eager
    ``Qwen3ForCausalLM(config)`` under ``torch.device(device)`` and ``dtype`` drew, followed by
    the trainer's own embedding/head draws: every module's ``reset_parameters`` in module order
    (the embedding N(0, 1), each linear layer kaiming-uniform), then transformers' init
    (linear layers and the embedding N(0, ``INIT_STD``), norms 1), then the LM head's reset and
    init, then the embedding and head N(0, 2/sqrt(H)) from a generator of their own (with an
    RMS-normed input the frozen head then gives logits of O(1), so a random target still has a
    learnable head; 0.02 would make them ~0). The draws that are later overwritten are still
    made: they advance the generator, and the values after them depend on it.

    ``body=False`` (a split topology's drafter rank: embedding and head only) replays a
    one-layer model, as the trainer always did, and keeps no layer.
    """
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv = cfg.num_heads, cfg.num_kv_heads

    def empty(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device=device, dtype=dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    torch.manual_seed(seed + GLOBAL_SEED_OFFSET)
    with torch.no_grad():
        embed = empty(cfg.vocab_size, h)
        layers: list[LayerWeights] = []
        linears: list[tuple[torch.Tensor, ...]] = []  # per layer, in _LINEARS order
        for _ in range(cfg.target_layers if body else 1):
            lw = LayerWeights(in_norm=ones(h), qkv=empty((nh + 2 * nkv) * hd, h), q_norm=ones(hd),
                              k_norm=ones(hd), o=empty(h, nh * hd), post_norm=ones(h),
                              gate_up=empty(2 * i, h), down=empty(h, i))
            q, k, v = lw.qkv[:nh * hd], lw.qkv[nh * hd:(nh + nkv) * hd], lw.qkv[(nh + nkv) * hd:]
            gate, up = lw.gate_up[:i], lw.gate_up[i:]
            layers.append(lw)
            linears.append((q, k, v, lw.o, gate, up, lw.down))
        # 1. reset_parameters of every module of the inner model, in module order
        embed.normal_()
        for ws in linears:
            for w in ws:
                torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        # 2. transformers' init of the inner model (the norms' fill draws nothing)
        embed.normal_(0.0, INIT_STD)
        for ws in linears:
            for w in ws:
                w.normal_(0.0, INIT_STD)
        # 3. the LM head's reset and init (on the embedding itself when tied)
        head = embed if cfg.tie_embeddings else empty(cfg.vocab_size, h)
        torch.nn.init.kaiming_uniform_(head, a=math.sqrt(5))
        head.normal_(0.0, INIT_STD)
        # 4. the trainer's embedding and head, from their own generator
        g = torch.Generator(device=device).manual_seed(seed + HEAD_SEED_OFFSET)
        std = 2.0 / h ** 0.5
        embed.normal_(0.0, std, generator=g)
        if head is not embed:
            head.normal_(0.0, std, generator=g)
    return TargetWeights(embed, head, layers if body else [])


def default_inv_freq(cfg: DrafterConfig, device: torch.device) -> torch.Tensor:
    """RoPE's inverse frequencies (``rope_type`` "default"), computed on ``device`` in fp32 as
    transformers computes them (on another device the last bit can differ)."""
    dim = cfg.head_dim
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))


class Rope(torch.nn.Module):
    """Default RoPE: ``(cos, sin)`` of shape (B, S, hd) in ``x``'s dtype for ``position_ids``.

    Op for op the rotary module of transformers 5.17 (the version on the GPU machines): fp32
    ``inv_freq @ positions`` with autocast off, then cat, cos, sin. Why the matmul and not an
    elementwise product (transformers 5.24 switched to one): on CUDA the matmul may run in TF32
    (the trainer allows it), so only the same op gives transformers' tables bit for bit; on a CPU the
    two are bit-identical."""

    inv_freq: torch.Tensor

    def __init__(self, inv_freq: torch.Tensor):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        pos = position_ids[:, None, :].float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (inv.float() @ pos.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
