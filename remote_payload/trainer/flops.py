"""Exact FLOP count of one training step (what the MFU figure divides by).

Matmul FLOPs only (2 per multiply-add); norms, RoPE, softmax and the optimizer are not
counted. Backward of a trained matmul costs 2x its forward (input and weight grads); the
frozen LM head needs only the input grad (1x), the fc on frozen features only the weight
grad. Target attention counts the causal half; drafter attention counts the (query, key)
pairs the mask allows.
"""

from __future__ import annotations

import torch

from .config import DrafterConfig


def target_flops_per_token(cfg: DrafterConfig, seq_len: int) -> float:
    """Forward only, for the layers actually run (up to the last feature layer)."""
    h, dq, dkv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = 2 * (h * dq + 2 * h * dkv + dq * h + 3 * h * cfg.intermediate_size)
    attn = 2 * seq_len * dq  # QK^T + PV over the causal half: 4 * (S/2) * dq per token
    return float(cfg.target_layers_run * (per_layer + attn))


def step_flops(cfg: DrafterConfig, rows: int, seq_len: int, anchors: torch.Tensor,
               valid: torch.Tensor, n_gpus_target: int = 1) -> dict[str, float]:
    """FLOPs of one drafter step on a (rows, seq_len) batch, split by component."""
    h, dq, dkv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    ctx_tokens = rows * seq_len
    q_tokens = rows * cfg.max_anchors * cfg.block_size
    nl = cfg.draft_layers
    k = cfg.block_size
    pairs = float((valid.long() * k * (anchors + k)).sum())  # visible (q, kv) pairs
    out = {
        "target": target_flops_per_token(cfg, seq_len) * ctx_tokens,
        "drafter_fc": 2 * 2 * cfg.feature_width * h * ctx_tokens,  # no input grad: frozen features
        "drafter_ctx_kv": 3 * 2 * nl * 2 * h * dkv * ctx_tokens,
        "drafter_block_linear": 3 * 2 * nl * (2 * h * dq + 2 * h * dkv + 3 * h * cfg.intermediate_size)
        * q_tokens,
        "drafter_attention": 3 * 4 * nl * dq * pairs,
        # each block's anchor position carries no loss: the LM head skips it (engine.forward_loss)
        "lm_head": 2 * 2 * cfg.vocab_size * h * q_tokens * (k - 1) // k,
    }
    out["total"] = sum(out.values())
    return out


#: H200 SXM datasheet dense bf16 peak (no sparsity), TFLOP/s per GPU: the ``mfu`` denominator.
H200_DATASHEET_BF16_TFLOPS = 989.0
#: What a large bf16 matmul actually sustains on an H200 (measured), TFLOP/s: ``mfu_matmul``.
H200_MEASURED_MATMUL_TFLOPS = 790.0


def mfu_fields(flops_per_s_per_gpu: float, datasheet_tflops: float,
               matmul_tflops: float) -> dict[str, float]:
    """``mfu`` against the datasheet peak (the honest, comparable figure) and ``mfu_matmul``
    against the measured matmul rate (how close to what the hardware really sustains)."""
    return {"mfu": round(flops_per_s_per_gpu / (datasheet_tflops * 1e12), 4),
            "mfu_matmul": round(flops_per_s_per_gpu / (matmul_tflops * 1e12), 4),
            "peak_tflops": datasheet_tflops, "matmul_tflops": matmul_tflops}
