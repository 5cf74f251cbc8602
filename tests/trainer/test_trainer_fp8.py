"""``--target-precision fp8``: the frozen target's matmuls as row-scaled e4m3.

On the CPU ``torch._scaled_mm`` runs the same quantized arithmetic slowly; the GPU numbers
(speed, feature error, the 50-step loss curve) are in docs/benchmarks.md, "Third pass".
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from remote_payload import wire  # noqa: E402
from remote_payload.trainer import fp8  # noqa: E402
from remote_payload.trainer.config import TrainerConfigError, parse_args, preset  # noqa: E402
from remote_payload.trainer.target import build_target  # noqa: E402
from remote_payload.trainer.train import main  # noqa: E402

CPU = torch.device("cpu")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_each_row_is_scaled_so_its_largest_value_is_e4m3s_largest_and_rounds_to_3_mantissa_bits():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 64)[:, None]
    codes, scale = fp8.quantize_rows(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (64, 1) and scale.dtype == torch.float32
    assert torch.allclose(codes.float().abs().amax(-1), torch.full((64,), 448.0))
    back = codes.float() * scale
    # e4m3: 3 mantissa bits, so a normal code is within 2**-4 of its value; the smallest
    # values of a row are subnormal codes, within half of e4m3's subnormal step
    assert ((back - x).abs() <= x.abs() * 2**-4 + scale * 2**-10).all()


def test_an_fp8_matmul_equals_the_full_precision_one_within_fp8_rounding():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 40, 128, generator=g), torch.randn(96, 128, generator=g)
    got = fp8.linear(x, fp8.quantize_weight(w))
    assert got.shape == (3, 40, 96) and got.dtype == x.dtype
    assert _rel(got, torch.nn.functional.linear(x, w)) < 0.05


def test_the_fp8_target_stores_its_matmul_weights_as_codes_and_gives_the_bf16_features_within_rounding():
    cfg = preset("tiny", num_heads=4, num_kv_heads=2)
    ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float32, torch.bfloat16):
        exact = build_target(cfg, CPU, dtype)
        quant = build_target(cfg, CPU, dtype, precision="fp8")
        assert _rel(quant.features(ids), exact.features(ids)) < 0.03, dtype
    assert quant.fused is not None
    layer = quant.fused[0]
    assert layer.qkv.dtype == layer.down.dtype == torch.float8_e4m3fn
    assert layer.qkv_scale.shape == (1, layer.qkv.shape[0])
    assert layer.in_norm.dtype == torch.bfloat16  # norms keep the model's dtype


def test_fp8_is_a_choice_of_the_fused_target_only():
    cfg = preset("tiny")
    with pytest.raises(TrainerConfigError, match="needs the fused target"):
        build_target(cfg, CPU, torch.float32, fused=False, precision="fp8")
    with pytest.raises(TrainerConfigError, match="target-precision 'int4'; choices: bf16, fp8"):
        parse_args(["--target-precision", "int4"])
    assert parse_args([]).target_precision == "bf16"  # the exact features unless asked


def test_a_run_with_the_fp8_target_follows_the_bf16_runs_loss_curve(capsys, tmp_path):
    argv = ["--preset", "tiny", "--device", "cpu", "--attn", "sdpa", "--compile", "off",
            "--seq-buckets", "48", "--token-budget", "384", "--steps", "12", "--lr", "3e-3",
            "--warmup-steps", "2"]
    curves = {}
    for precision in ("bf16", "fp8"):
        assert main([*argv, "--target-precision", precision, "--out-dir", str(tmp_path / precision)]) == 0
        events = filter(None, map(wire.parse_event, capsys.readouterr().out.splitlines()))
        curves[precision] = [e["loss"] for e in events if e["event"] == "step"]
    assert len(curves["fp8"]) == 12
    assert curves["fp8"][-1] < curves["fp8"][0] - 0.3, curves["fp8"]  # it learns
    worst = max(abs(a - b) / b for a, b in zip(curves["fp8"], curves["bf16"], strict=True))
    assert worst < 0.02, curves
    # the checkpoint says which target's features the drafter learned from
    meta = json.loads((tmp_path / "fp8" / "ckpt-0000012" / "meta.json").read_text())
    assert meta["args"]["target_precision"] == "fp8"


def test_an_fp8_served_target_swaps_every_decoder_matmul_and_keeps_its_greedy_choices():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    hf = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = Qwen3ForCausalLM(hf).eval()
    ids = torch.randint(0, 128, (1, 37))  # 37 rows: not a multiple of 16 (padded inside)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        assert fp8.serve_fp8(model.model.layers) == 2 * 7  # q k v o gate up down per layer
        got = model(input_ids=ids).logits
    assert isinstance(model.model.layers[0].self_attn.q_proj, fp8.Fp8Linear)
    assert isinstance(model.lm_head, torch.nn.Linear)  # the head stays in full precision
    rel = ((got - ref).norm() / ref.norm()).item()
    assert 0 < rel < 0.1, rel
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
