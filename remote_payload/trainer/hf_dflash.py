"""The DFlash drafter for ``transformers``' AutoModel; ``trainer export`` ships it as ``dflash.py``.

An export's ``config.json`` carries ``"auto_map": {"AutoModel": "dflash.DFlashDraftModel"}``
(what z-lab's hub repositories of DFlash drafters carry), so::

    from transformers import AutoModel
    draft = AutoModel.from_pretrained(export_dir, trust_remote_code=True, dtype="auto")
    out = draft.spec_generate(target=target, input_ids=ids, max_new_tokens=256,
                              stop_token_ids=[tok.eos_token_id], temperature=0.0)

builds this class with the file's exact weights. Without the file and the map, AutoModel
quietly built a plain ``Qwen3Model`` (random embeddings; ``fc`` and ``hidden_norm`` dropped).

Why a file of its own and not an import of ``model.py``: transformers copies this one file
into its module cache and imports it there, so it may import only torch and transformers (and
the standard library). Its arithmetic is ``remote_payload/trainer/model.py``'s ``Drafter``
op for op (same casts, same RoPE tables, the same SDPA call), so the two agree bit for bit in
fp32 (``tests/trainer/test_trainer_hf_export.py``); only the names are the reference's (z-lab/dflash
``dflash/model.py``), so SGLang, vLLM and the reference's own ``dflash_generate`` load the
same weights. Loads and computes the same under transformers 4.51.3, 4.57.6 and 5.24.0 (the
oldest pyproject claims, the last 4.x, the newest; tested in their own environments).

The call is the reference's: ``target_hidden`` (B, S, F*H) the target's features of S context
positions, ``noise_embedding`` (B, Q, H) the embedded block, ``position_ids`` (B or 1, S+Q)
the positions of [context ; block]; every block query sees all S context positions and the
whole block, unless a boolean ``attention_mask`` (B, 1, Q, S+Q) says otherwise (rows that see
nothing give 0, as in training). ``past_key_values`` (a transformers ``Cache``) appends the
keys/values of this call to earlier ones. Returns the normed hidden states (B, Q, H) for the
target's LM head.

``spec_generate`` decodes one prompt without KV caches (every verification re-runs the target
over the whole sequence): exact and simple, for checking a drafter; a serving engine is the
fast path.
"""

from __future__ import annotations

import typing as t

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, Qwen3Config


class DFlashRMSNorm(nn.Module):
    """RMSNorm in fp32, weight applied before the cast back (the trainer's ``RMSNorm``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(pos: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape pos.shape + (head_dim,), in fp32 (the trainer's ``rope_cos_sin``)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32)
                           / head_dim))
    ang = pos.float().unsqueeze(-1) * inv
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, h, L, hd); cos/sin (B or 1, L, hd): RoPE in fp32, result in x's dtype."""
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x.float() * c + rot.float() * s).to(x.dtype)


class DFlashAttention(nn.Module):
    """Queries from the block, keys/values from [context ; block]; Qwen3's q/k norms."""

    def __init__(self, config: t.Any, head_dim: int):
        super().__init__()
        h = config.hidden_size
        self.nh, self.nkv, self.hd = config.num_attention_heads, config.num_key_value_heads, head_dim
        self.q_proj = nn.Linear(h, self.nh * head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * head_dim, bias=False)
        self.o_proj = nn.Linear(self.nh * head_dim, h, bias=False)
        self.q_norm = DFlashRMSNorm(head_dim, config.rms_norm_eps)
        self.k_norm = DFlashRMSNorm(head_dim, config.rms_norm_eps)


class DFlashMLP(nn.Module):
    def __init__(self, config: t.Any):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: t.Any, head_dim: int, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config, head_dim)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DFlashMLP(config)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor,
                rope_q: tuple[torch.Tensor, torch.Tensor],
                rope_kv: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None, cache: t.Any) -> torch.Tensor:
        a = self.self_attn
        bsz, q_len, _ = x.shape
        hn = self.input_layernorm(x)  # (B, Q, H)
        kv_in = torch.cat([ctx, hn], dim=1)  # (B, S+Q, H)
        kv_len = kv_in.shape[1]
        q = a.q_norm(a.q_proj(hn).view(bsz, q_len, a.nh, a.hd)).transpose(1, 2)
        k = a.k_norm(a.k_proj(kv_in).view(bsz, kv_len, a.nkv, a.hd)).transpose(1, 2)
        v = a.v_proj(kv_in).view(bsz, kv_len, a.nkv, a.hd).transpose(1, 2)
        q = rotate(q, *rope_q)  # (B, nh, Q, hd)
        k = rotate(k, *rope_kv)  # (B, nkv, S+Q, hd)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        rep = a.nh // a.nkv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            # a row that sees nothing attends everywhere and is zeroed afterwards (as in training)
            row_any = mask.any(-1, keepdim=True)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~row_any)
            o = o * row_any.to(o.dtype)
        o = o.transpose(1, 2).reshape(bsz, q_len, a.nh * a.hd)
        x = x + a.o_proj(o)
        hn = self.post_attention_layernorm(x)
        m = self.mlp
        out: torch.Tensor = x + m.down_proj(F.silu(m.gate_proj(hn)) * m.up_proj(hn))
        return out


def _rope_theta(config: t.Any) -> float:
    """transformers 5 keeps it in ``rope_parameters``, 4.x in ``rope_theta``."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))


def _pick(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Greedy below 1e-5, else one sample per position. logits (B, L, V) -> (B, L)."""
    if temperature < 1e-5:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs.view(-1, probs.shape[-1]), 1).view(probs.shape[:-1])


class DFlashDraftModel(PreTrainedModel):  # type: ignore[no-untyped-call]  # transformers' hook
    """fc + hidden_norm over the target's features, the draft layers, the final norm."""

    config_class = Qwen3Config
    base_model_prefix = "dflash"
    _no_split_modules = ["DFlashDecoderLayer"]  # noqa: RUF012 (transformers reads a list)
    _supports_sdpa = True

    def __init__(self, config: t.Any):
        super().__init__(config)
        dflash = dict(getattr(config, "dflash_config", None) or {})
        if not dflash.get("target_layer_ids"):
            raise ValueError("config.json has no dflash_config.target_layer_ids: not a DFlash drafter")
        self.target_layer_ids = [int(i) for i in dflash["target_layer_ids"]]
        self.mask_token_id = dflash.get("mask_token_id")
        self.block_size = int(t.cast(int, dflash.get("block_size") or getattr(config, "block_size", 16)))
        self.head_dim = int(getattr(config, "head_dim", None)
                            or config.hidden_size // config.num_attention_heads)
        self.rope_theta = _rope_theta(config)
        h = config.hidden_size
        self.fc = nn.Linear(len(self.target_layer_ids) * h, h, bias=False)  # F*H -> H
        self.hidden_norm = DFlashRMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, self.head_dim, i)
                                    for i in range(config.num_hidden_layers))
        self.norm = DFlashRMSNorm(h, config.rms_norm_eps)
        self.post_init()  # type: ignore[no-untyped-call]  # transformers leaves it untyped

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Only for weights a file lacks: from_pretrained loads all of an export's."""
        std = float(getattr(self.config, "initializer_range", 0.02))
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
        elif isinstance(module, DFlashRMSNorm):
            module.weight.fill_(1.0)

    def forward(self, position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                noise_embedding: torch.Tensor | None = None,
                target_hidden: torch.Tensor | None = None, past_key_values: t.Any = None,
                use_cache: bool = False, **kwargs: t.Any) -> torch.Tensor:
        """Hidden states (B, Q, H) of the block; see the module docstring for the shapes.

        Raises:
            ValueError: a missing input, or ``position_ids`` not covering context + block.
        """
        if noise_embedding is None or target_hidden is None:
            raise ValueError("DFlashDraftModel needs noise_embedding and target_hidden")
        q_len = noise_embedding.shape[1]
        if position_ids.shape[-1] != target_hidden.shape[1] + q_len:
            raise ValueError(f"position_ids cover {position_ids.shape[-1]} positions; context "
                             f"{target_hidden.shape[1]} + block {q_len} expected")
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        ctx = self.hidden_norm(self.fc(target_hidden))  # (B, S, H), shared by all layers
        rope_q = rope_tables(position_ids[:, -q_len:], self.head_dim, self.rope_theta)
        rope_kv = rope_tables(position_ids, self.head_dim, self.rope_theta)
        x = noise_embedding
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_kv, attention_mask, past_key_values)
        out: torch.Tensor = self.norm(x)
        return out

    @torch.no_grad()
    def spec_generate(self, target: t.Any, input_ids: torch.Tensor, max_new_tokens: int,
                      stop_token_ids: t.Sequence[int] | None = None,
                      temperature: float = 0.0) -> torch.Tensor:
        """Block-parallel speculative decoding of one prompt; (1, prompt + new) token ids.

        The loop of z-lab/dflash's ``dflash_generate`` (its bounds and its stop rule), without
        caches: greedy (``temperature`` 0) gives exactly the target's greedy output. The
        acceptance length of each block is kept in ``self.last_acceptance_lengths``.

        Raises:
            ValueError: a batch of more than one prompt, or no mask token in the config.
        """
        if input_ids.shape[0] != 1:
            raise ValueError("spec_generate decodes one prompt at a time (batch 1)")
        if self.mask_token_id is None:
            raise ValueError("config.json has no dflash_config.mask_token_id")
        self.train(False)
        k, n_prompt, dev = self.block_size, input_ids.shape[1], input_ids.device
        stops = torch.tensor(list(stop_token_ids or ()), device=dev, dtype=torch.long)
        embed, head = target.get_input_embeddings(), target.get_output_embeddings()

        def verify(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
            feats = torch.cat([out.hidden_states[i + 1] for i in self.target_layer_ids], dim=-1)
            return _pick(out.logits, temperature), feats.to(self.dtype)

        picks, feats = verify(input_ids)
        seq = torch.cat([input_ids, picks[:, -1:]], dim=1)
        lengths: list[int] = []
        while seq.shape[1] - 1 < n_prompt + max_new_tokens:  # the reference's `start < max_length`
            a = seq.shape[1] - 1  # the anchor: the newest token, not yet seen by the target
            block = torch.full((1, k), int(self.mask_token_id), device=dev, dtype=torch.long)
            block[0, 0] = seq[0, a]
            h = self(position_ids=torch.arange(a + k, device=dev).unsqueeze(0),
                     noise_embedding=embed(block).to(self.dtype), target_hidden=feats[:, :a])
            drafts = _pick(head(h[:, 1:].to(head.weight.dtype)), temperature)  # (1, K-1)
            picks, feats = verify(torch.cat([seq, drafts], dim=1))
            truth = picks[:, a:a + k]  # truth[:, i]: the target's token at a + i + 1
            n = int((drafts == truth[:, :-1]).long().cumprod(dim=1).sum())
            seq = torch.cat([seq, drafts[:, :n], truth[:, n:n + 1]], dim=1)
            feats = feats[:, :a + n + 1]  # positions up to a + n hold accepted tokens only
            lengths.append(n + 1)
            if stops.numel() and bool(torch.isin(seq[0, n_prompt:], stops).any()):
                break
        self.last_acceptance_lengths = lengths
        new = seq[0, n_prompt:n_prompt + max_new_tokens]
        if stops.numel():
            hit = torch.isin(new, stops).nonzero()
            if hit.numel():
                new = new[: int(hit[0, 0]) + 1]
        return torch.cat([input_ids, new.unsqueeze(0)], dim=1)
