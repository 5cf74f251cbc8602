"""Drafter model rules: mask semantics, backend agreement, loss weights, chunked CE."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from remote_payload.trainer.config import (  # noqa: E402
    PRESETS,
    TrainerConfigError,
    parse_args,
    preset,
    spread_layer_ids,
)
from remote_payload.trainer.data import (  # noqa: E402
    Batch,
    SyntheticSource,
    block_inputs,
    sample_anchors,
)
from remote_payload.trainer.model import (  # noqa: E402
    MASK_TILE,
    Drafter,
    _ce_chunk,
    chunk_rows,
    dense_mask,
    flex_block_mask,
    lm_head_loss,
    loss_weights,
    make_mask_mod,
)


def test_block_query_sees_context_before_its_anchor_and_its_own_block_only():
    # S=6 context tokens, block size 2, anchors 2 and 4; the second block is invalid.
    anchors = torch.tensor([[2, 4]])
    m = dense_mask(anchors, torch.tensor([[True, False]]), seq_len=6, block_size=2)[0, 0].int()
    expected = torch.tensor([
        # ctx 0 1 2 3 4 5 | blk0 | blk1
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0],  # block 0, k=0 (anchor 2): ctx < 2 + own block
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0],  # block 0, k=1: bidirectional inside the block
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # block 1 is invalid: sees nothing
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ])
    assert torch.equal(m, expected), m
    m2 = dense_mask(anchors, torch.tensor([[True, True]]), seq_len=6, block_size=2)[0, 0].int()
    assert m2[2].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 1, 1], m2


def test_mask_function_handles_queries_past_the_padded_block_length():
    # create_block_mask evaluates Q_LEN rounded up to 128; those rows must be masked, not crash.
    anchors, valid = torch.tensor([[2, 4]]), torch.tensor([[True, True]])
    fn = make_mask_mod(anchors, valid, 6, 2)
    q = torch.arange(128).view(128, 1)
    kv = torch.arange(10).view(1, 10)
    out = fn(torch.zeros_like(q), torch.zeros_like(q), q, kv)
    assert out[4:].sum().item() == 0, out[4:].nonzero()[:3]
    bm = flex_block_mask(anchors, valid, 6, 2)
    assert bm.shape[-2:] == (4, 10), bm.shape


_BLOCK_MASK_PARTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                     "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def _same_block_mask(got, want) -> None:
    """Tensor for tensor, strides too (what flex reads, and what compiled graphs guard on)."""
    assert got.shape == want.shape and got.BLOCK_SIZE == want.BLOCK_SIZE, (got.shape, want.shape)
    for part in _BLOCK_MASK_PARTS:
        a, b = getattr(got, part), getattr(want, part)
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), part
        assert torch.equal(a, b), (part, a, b)


@st.composite
def _mask_inputs(draw):
    """Any batch the mask may meet: anchors inside, at or past the context's ends, invalid
    blocks, block sizes that do and do not divide flex's 128-token tile, a context of 1."""
    rows, n = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    k = draw(st.sampled_from([1, 2, 3, 7, 16, 32, 33, 64, 129, 200]))
    s_len = draw(st.integers(1, 700))
    anchors = draw(st.lists(st.integers(-3, s_len + 3), min_size=rows * n, max_size=rows * n))
    valid = draw(st.lists(st.booleans(), min_size=rows * n, max_size=rows * n))
    return (torch.tensor(anchors).view(rows, n), torch.tensor(valid).view(rows, n), s_len, k)


@given(_mask_inputs())
@settings(max_examples=60, deadline=None)
def test_the_block_mask_is_the_one_create_block_mask_builds_from_the_mask_function(inputs):
    from torch.nn.attention.flex_attention import create_block_mask

    anchors, valid, s_len, k = inputs
    rows, n = anchors.shape
    want = create_block_mask(make_mask_mod(anchors, valid, s_len, k), rows, None, n * k,
                             s_len + n * k, device="cpu")
    _same_block_mask(flex_block_mask(anchors, valid, s_len, k), want)


def test_the_block_mask_of_the_preset_shape_is_create_block_masks():
    # qwen3-8b's batch: 16 rows, 64 anchors, block 32, S 3072 (a 2048 x 5120 mask per row)
    g = torch.Generator().manual_seed(0)
    anchors = torch.randint(1, 3072, (16, 64), generator=g).sort(-1).values
    valid = torch.rand(16, 64, generator=g) < 0.9
    from torch.nn.attention.flex_attention import create_block_mask

    want = create_block_mask(make_mask_mod(anchors, valid, 3072, 32), 16, None, 2048, 5120,
                             device="cpu")
    got = flex_block_mask(anchors, valid, 3072, 32)
    _same_block_mask(got, want)
    assert got.BLOCK_SIZE == (MASK_TILE, MASK_TILE)
    assert got.mask_mod is not None  # flex applies the mask function inside partial tiles


def test_flex_and_sdpa_drafters_agree_on_the_forward_pass():
    cfg = preset("tiny", draft_layers=1)
    torch.manual_seed(0)
    fx, sd = Drafter(cfg, "flex"), Drafter(cfg, "sdpa")
    sd.load_state_dict(fx.state_dict())
    src = SyntheticSource(cfg.vocab_size, buckets=[48], token_budget=96, max_batch=2,
                          n_anchors=cfg.max_anchors, block_size=cfg.block_size, seed=1)
    b = src.batch(0)
    b.valid[1, -3:] = False  # exercise the keep-mask
    ids, pos, _, _ = block_inputs(b, cfg.block_size, cfg.mask_token_id)
    feats = torch.randn(2, 48, cfg.feature_width)
    emb = torch.randn(*ids.shape, cfg.hidden_size)
    with torch.no_grad():  # compiled flex_attention has no CPU backward
        o_flex = torch.compile(fx, dynamic=False)(feats, emb, pos,
                                                  flex_block_mask(b.anchors, b.valid, 48, 4))
        d = dense_mask(b.anchors, b.valid, 48, 4)
        o_sdpa = sd(feats, emb, pos, (d, d.any(-1, keepdim=True)))
    rel = float((o_flex - o_sdpa).norm() / o_sdpa.norm())
    assert rel < 1e-5, rel


def test_loss_weights_decay_from_k1_and_skip_the_anchor_and_invalid_blocks():
    w = loss_weights(torch.tensor([[True, False]]), torch.ones(1, 8, dtype=torch.bool), 4, 2.0)
    e = torch.exp(torch.tensor([0.0, -0.5, -1.0]))
    assert torch.allclose(w[0, :4], torch.cat([torch.zeros(1), e])), w
    assert w[0, 4:].sum().item() == 0, w


def test_chunked_cross_entropy_matches_the_dense_reference_in_value_and_gradient():
    torch.manual_seed(0)
    h = torch.randn(10, 8, requires_grad=True)
    head = torch.randn(30, 8)
    tgt = torch.randint(0, 30, (10,))
    w = torch.rand(10)
    w[3] = 0
    loss, correct, counted = lm_head_loss(h, head, tgt, w, chunk=3)
    loss.backward()
    h2 = h.detach().clone().requires_grad_()
    ce = torch.nn.functional.cross_entropy(h2 @ head.t(), tgt, reduction="none")
    ref = (ce * w).sum() / w.sum()
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-5, (loss, ref)
    assert torch.allclose(h.grad, h2.grad, atol=1e-6), (h.grad - h2.grad).abs().max()
    assert counted.item() == 9, counted
    pred = (h2 @ head.t()).argmax(-1)
    assert correct.item() == int(((pred == tgt) & (w > 0)).sum()), correct
    _ = _ce_chunk  # the per-chunk kernel is what torch.compile fuses on GPU


def test_the_loss_chunks_all_have_one_shape_so_the_compiled_chunk_is_built_once():
    seen: list[tuple[int, ...]] = []

    def recording(logits, target, w):
        seen.append(tuple(logits.shape))
        return _ce_chunk(logits, target, w)

    h = torch.randn(124, 8)  # cut at 16 exactly: 7 x 16 + 12, two shapes
    loss, _c, _n = lm_head_loss(h, torch.randn(5, 8), torch.randint(0, 5, (124,)),
                                torch.rand(124), chunk=16, chunk_fn=recording)
    assert seen == [(16, 5)] * 8 and torch.isfinite(loss)  # 8 x 16, 4 rows of padding


@given(rows=st.integers(0, 10**7), chunk=st.integers(-5, 10**6))
@settings(max_examples=300, deadline=None)
def test_rows_are_cut_into_the_fewest_equal_chunks_with_less_than_a_row_of_padding_each(rows, chunk):
    size, pad = chunk_rows(rows, chunk)
    n = (rows + pad) // size
    assert (rows + pad) % size == 0 and size >= 1 and pad >= 0
    assert size <= max(chunk, 1) or rows == 0
    assert n == max(1, -(-rows // max(chunk, 1)))  # no more chunks than cutting at `chunk`
    assert pad < n or rows == 0


def test_the_step_skips_each_blocks_anchor_in_the_lm_head_and_keeps_the_same_loss_and_grads():
    from remote_payload.trainer.engine import Engine

    cfg = preset("tiny", draft_layers=1)
    src = SyntheticSource(cfg.vocab_size, buckets=[48], token_budget=96, max_batch=2,
                          n_anchors=cfg.max_anchors, block_size=cfg.block_size, seed=1)
    b = src.batch(0)
    b.valid[1, -3:] = False
    embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    head = torch.randn(cfg.vocab_size, cfg.hidden_size)
    feats = torch.randn(2, 48, cfg.feature_width)

    def engine() -> Engine:
        return Engine(cfg, attn="sdpa", device=torch.device("cpu"), autocast_dtype=None,
                      compile_model=False, embed=embed, head_weight=head, lr=1e-3,
                      weight_decay=0.0, grad_clip=0.0, ce_chunk=7, seed=3)

    skipped = engine()
    loss, correct, counted = skipped.forward_loss(feats, b)
    loss.backward()
    # the reference: the LM head over every block position, the anchors' weight 0 included
    full = engine()
    ids, pos, targets, lm = block_inputs(b, cfg.block_size, cfg.mask_token_id)
    d = dense_mask(b.anchors, b.valid, 48, cfg.block_size)
    h = full.model(feats, embed(ids).detach(), pos, (d, d.any(-1, keepdim=True)))
    w = loss_weights(b.valid, lm, cfg.block_size, cfg.gamma)
    ref, ref_correct, ref_counted = lm_head_loss(h.reshape(-1, cfg.hidden_size), head,
                                                 targets.reshape(-1), w.reshape(-1), 7)
    ref.backward()
    # equal up to fp32 summation order (the chunks hold other rows)
    assert abs(loss.item() - ref.item()) < 1e-6 * ref.item(), (loss, ref)
    assert (correct.item(), counted.item()) == (ref_correct.item(), ref_counted.item())
    for (name, p), q in zip(skipped.raw.named_parameters(), full.raw.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7), name


def test_rope_tables_given_to_the_drafter_give_what_it_computes_itself():
    cfg = preset("tiny", draft_layers=1)
    torch.manual_seed(0)
    model = Drafter(cfg, "sdpa")
    src = SyntheticSource(cfg.vocab_size, buckets=[48], token_budget=96, max_batch=2,
                          n_anchors=cfg.max_anchors, block_size=cfg.block_size, seed=2)
    b = src.batch(0)
    ids, pos, _, _ = block_inputs(b, cfg.block_size, cfg.mask_token_id)
    feats, emb = torch.randn(2, 48, cfg.feature_width), torch.randn(*ids.shape, cfg.hidden_size)
    d = dense_mask(b.anchors, b.valid, 48, cfg.block_size)
    mask = (d, d.any(-1, keepdim=True))
    with torch.no_grad():
        assert torch.equal(model(feats, emb, pos, mask), model(feats, emb, pos, mask,
                                                               model.rope(pos, 48)))


def test_an_anchor_needs_the_loss_mask_at_itself_and_the_next_position_only():
    lm = torch.ones(1, 20, dtype=torch.bool)
    lm[0, :6] = False  # prompt
    anchors, valid = sample_anchors(lm, [20], 50, 4, torch.Generator().manual_seed(0))
    got = anchors[0][valid[0]].tolist()
    assert got == list(range(6, 19)), got  # lm[a] and lm[a+1], a+1 < 20; the block may run past
    assert valid[0].sum().item() == 13, valid


def test_a_short_answer_is_trained_and_block_positions_past_it_get_weight_zero():
    # prompt of 5 tokens, a 3-token answer (the last is the end-of-turn token), padding after
    ids = torch.arange(1, 13).view(1, 12)
    lm = torch.zeros(1, 12, dtype=torch.bool)
    lm[0, 5:8] = True
    anchors, valid = sample_anchors(lm, [8], 4, 4, torch.Generator().manual_seed(0))
    assert anchors[0][valid[0]].tolist() == [5, 6], anchors  # not disqualified by block 4 > 3
    b = Batch(ids, lm, anchors, valid, 8)
    _, _, tgt, blm = block_inputs(b, 4, 255)
    w = loss_weights(valid, blm, 4, 7.0).view(4, 4)
    assert (w[0] > 0).tolist() == [False, True, True, False], w  # predicts 6, 7 (end of turn)
    assert (w[1] > 0).tolist() == [False, True, False, False], w
    assert tgt.view(4, 4)[0, 2].item() == 8, tgt  # the end-of-turn token is a target


def test_block_positions_past_the_padded_length_get_weight_zero():
    ids = torch.arange(1, 7).view(1, 6)
    lm = torch.ones(1, 6, dtype=torch.bool)
    b = Batch(ids, lm, torch.tensor([[4]]), torch.tensor([[True]]), 6)
    _, _, _, blm = block_inputs(b, 4, 255)
    assert blm[0].tolist() == [True, True, False, False], blm  # positions 6, 7 do not exist


def test_block_inputs_put_the_anchor_token_first_and_mask_tokens_after():
    src = SyntheticSource(256, buckets=[48], token_budget=48, max_batch=1, n_anchors=2,
                          block_size=4, seed=0)
    b = src.batch(0)
    ids, pos, tgt, _ = block_inputs(b, 4, 255)
    a = int(b.anchors[0, 0])
    assert ids[0, :4].tolist() == [int(b.input_ids[0, a]), 255, 255, 255], ids[0, :4]
    assert pos[0, :4].tolist() == [a, a + 1, a + 2, a + 3], pos[0, :4]
    assert tgt[0, :4].tolist() == b.input_ids[0, a:a + 4].tolist(), tgt[0, :4]


def test_feature_layers_spread_from_1_to_t_minus_3_and_t_half_for_one_layer():
    assert spread_layer_ids(36, 5) == (1, 9, 17, 25, 33), spread_layer_ids(36, 5)
    assert spread_layer_ids(36, 1) == (18,), spread_layer_ids(36, 1)
    assert PRESETS["qwen3-8b"].target_layers_run == 34, PRESETS["qwen3-8b"].target_layers_run


def test_an_unknown_preset_is_an_error_that_lists_the_choices():
    with pytest.raises(TrainerConfigError, match=r"paper, qwen3-0\.6b, qwen3-8b, tiny"):
        preset("qwen3")
    with pytest.raises(TrainerConfigError, match="choices"):
        parse_args(["--preset", "qwen3-8"])


def test_config_validation_rejects_bad_shapes():
    with pytest.raises(TrainerConfigError, match="num_kv_heads"):
        preset("tiny", num_kv_heads=3)
    with pytest.raises(TrainerConfigError, match="block_size"):
        preset("tiny", block_size=1)
    with pytest.raises(TrainerConfigError, match="target-ranks"):
        parse_args(["--topology", "split"])
    with pytest.raises(TrainerConfigError, match="ddp-bucket-mb"):
        parse_args(["--ddp-bucket-mb", "0"])


def test_the_fused_target_gives_transformers_own_features_and_keeps_only_the_layers_it_runs():
    from remote_payload.trainer.config import preset as make_preset
    from remote_payload.trainer.target import FusedLayer, build_target

    cfg = make_preset("tiny", num_heads=4, num_kv_heads=2)  # grouped-query attention, as Qwen3-8B
    ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float32, torch.bfloat16):
        reference = build_target(cfg, torch.device("cpu"), dtype, fused=False)
        fused = build_target(cfg, torch.device("cpu"), dtype, fused=True)
        want, got = reference.features(ids), fused.features(ids)
        assert got.shape == (2, 40, len(cfg.target_layer_ids) * cfg.hidden_size)
        assert torch.equal(got, want), dtype  # same arithmetic, same rounding
    assert fused.fused is not None and len(fused.fused) == cfg.target_layers_run
    assert all(isinstance(m, FusedLayer) for m in fused.fused)
    assert fused.model is None  # nothing of transformers' model is kept

