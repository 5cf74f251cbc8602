"""Row-wise FP8 matmuls for the frozen target (``--target-precision fp8``, opt-in).

The target's GEMMs are ~0.88 s of a 1.68 s step on an H200 and already run at the bf16
rate cuBLAS reaches there (docs/trainer-performance.md, "2026-11-30, evening"); e4m3 GEMMs
run at about twice that rate. Each weight is quantized once, per output channel; each
activation per token, inside the compiled layer (inductor fuses the row max and the cast
into the norm/SiLU kernel before the GEMM). The scales stay in fp32 and the GEMM
accumulates in fp32 with a bf16 result: the features change by the rounding of two 3-bit
mantissas, not by a scale mismatch. The target is frozen, so nothing here has a backward.

Why our own ~30 lines over ``torch._scaled_mm`` (PyTorch's FP8 GEMM, CPU and CUDA) and not
torchao's float8 inference: torchao's wheels are tied to one torch release each, and opsctl
swaps torch builds in a container (``swap-torch``); the target needs one row-scaled GEMM
inside a function that ``torch.compile`` traces once and every layer shares, not module
swapping.
"""

from __future__ import annotations

import typing as t

import torch

FP8 = torch.float8_e4m3fn
_FP8_MAX = torch.finfo(FP8).max  # 448
_TINY = 1e-12  # an all-zero row keeps a finite scale
#: Hopper's fast FP8 accumulation (CUDA only); read when the layer is traced
FAST_ACCUM = True


class Fp8Weight(t.NamedTuple):
    """A frozen ``(N, K)`` weight as e4m3 codes and one fp32 scale per output row."""

    data: torch.Tensor  # (N, K) float8_e4m3fn
    scale: torch.Tensor  # (1, N) float32: weight[n] ~= data[n] * scale[0, n]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (M, K) -> (codes (M, K) e4m3, scales (M, 1) fp32), each row's largest magnitude
    mapped to e4m3's largest finite value (so no code saturates)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = torch.clamp(amax, min=_TINY) / _FP8_MAX
    return (x.float() / scale).to(FP8), scale


def quantize_weight(w: torch.Tensor) -> Fp8Weight:
    codes, scale = quantize_rows(w)
    return Fp8Weight(codes, scale.t().contiguous())


def linear(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """``F.linear(x, W)`` with ``x`` quantized per token and ``W`` per output channel; the
    result in ``x``'s dtype. Shapes: x (..., K) -> (..., N)."""
    lead = x.shape[:-1]
    codes, scale = quantize_rows(x.reshape(-1, x.shape[-1]))
    out = torch._scaled_mm(codes, w.data.t(), scale_a=scale, scale_b=w.scale, out_dtype=x.dtype,
                           use_fast_accum=FAST_ACCUM and x.is_cuda)
    return out.reshape(*lead, out.shape[-1])


def supported(device: torch.device) -> bool:
    """e4m3 GEMMs need compute capability 8.9+ (Ada, Hopper, Blackwell); the CPU runs them too
    (slowly: the tests)."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Linear(torch.nn.Module):
    """A frozen ``nn.Linear`` served in FP8 (``eval --target-precision fp8``): the weight as
    :func:`quantize_weight` codes, each call's input quantized per token, as the trainer's
    FP8 target does it (a fused q/k/v weight quantized per row is the three weights
    quantized per row). Inference only."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        codes, scale = quantize_weight(lin.weight.detach())
        self.register_buffer("data", codes)
        self.register_buffer("scale", scale)
        self.bias = lin.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        pad = -rows.shape[0] % 16  # keep M a multiple of 16 for every FP8 GEMM backend
        if pad:
            rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[-1])])
        out = linear(rows, Fp8Weight(t.cast(torch.Tensor, self.data),
                                     t.cast(torch.Tensor, self.scale)))[: rows.shape[0] - pad]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def serve_fp8(layers: torch.nn.Module) -> int:
    """Swap every ``nn.Linear`` under ``layers`` (a causal LM's decoder layers: not its
    embedding or LM head, which FP8 serving keeps in bf16) for :class:`Fp8Linear`; returns
    how many."""
    swapped = 0
    for parent in list(layers.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, Fp8Linear(child))
                swapped += 1
    return swapped
