"""The DFlash recipe around the model: chat data, the token store, the schedule, export and
acceptance length, proven end to end on CPU (toy target -> regenerate -> drafter -> tau)."""

from __future__ import annotations

import json
import pathlib
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from remote_payload import wire  # noqa: E402
from remote_payload.trainer import chat_data, e2e, evaluate, export, schedule, toy  # noqa: E402
from remote_payload.trainer.commands import main as trainer_main  # noqa: E402
from remote_payload.trainer.config import PRESETS, TrainerConfigError, parse_args, preset  # noqa: E402
from remote_payload.trainer.data import RecordSource  # noqa: E402
from remote_payload.trainer.engine import lr_at  # noqa: E402
from remote_payload.trainer.flops import mfu_fields  # noqa: E402
from remote_payload.trainer.model import Drafter  # noqa: E402
from remote_payload.trainer.token_store import TokenTable, open_store, write_store  # noqa: E402


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    toy.make_tokenizer(toy.Language(), str(d))
    return chat_data.load_tokenizer(str(d))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """One tiny end-to-end run, shared by the tests that read its outputs."""
    out = tmp_path_factory.mktemp("e2e")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: more threads only spin (and the suite shares 2 cores)
    t0 = time.perf_counter()
    try:
        summary = e2e.run(["--out-dir", str(out), "--size", "tiny", "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)
    print(f"\ne2e: tau {summary['tau']} (untrained {summary['tau_untrained']}) in "
          f"{time.perf_counter() - t0:.1f}s; per position {summary['per_position']}")
    return out, summary


# --- data -----------------------------------------------------------------------


def test_chat_records_train_only_the_assistant_turn_and_its_end_of_turn_token(tok):
    msgs = [{"role": "user", "content": "count from 3 by 2"},
            {"role": "assistant", "content": "3 5 7"}]
    ids, mask = chat_data.render_messages(tok, msgs)
    words = tok.convert_ids_to_tokens(ids)
    trained = [w for w, m in zip(words, mask, strict=True) if m]
    assert trained == ["3", "5", "7", "<eot>"], list(zip(words, mask, strict=True))
    assert ids[:len(chat_data.render_prompt(tok, msgs[:1]))] == chat_data.render_prompt(tok, msgs[:1])


def test_the_mask_token_is_the_tokenizers_own_else_the_first_spare_embedding_row(tok):
    assert chat_data.mask_token_id(tok, 48) == tok.convert_tokens_to_ids("<mask>"), tok.mask_token_id

    class NoMask:
        mask_token_id = None

        def __len__(self):
            return 151669  # Qwen3's tokenizer: no mask token, 151936 embedding rows

    assert chat_data.mask_token_id(NoMask(), 151936) == 151669
    assert chat_data.mask_token_id(NoMask(), 151669) == 151668  # no spare row: the last one


def test_a_token_store_is_memory_mapped_and_reads_back_every_record(tmp_path):
    recs = [([1, 2, 3, 4, 5], [0, 0, 1, 1, 1]), ([7] * 9, [1] * 9), ([9, 9], [1, 1])]
    meta = write_store(str(tmp_path / "s"), recs, min_len=2)
    assert meta == {"format": 1, "records": 2, "tokens": 14}, meta
    table = open_store(str(tmp_path / "s"))
    assert isinstance(table.tokens, __import__("numpy").memmap), type(table.tokens)
    assert [table.record(i)[0].tolist() for i in range(2)] == [recs[0][0], recs[1][0]]
    assert table.record(0)[1].tolist() == recs[0][1]


def _source(n: int) -> RecordSource:
    import numpy as np

    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 200, n)
    table = TokenTable.from_records(
        ((np.arange(k) % 50).tolist(), [0] * 5 + [1] * (k - 5)) for k in lengths.tolist())
    return RecordSource(table, buckets=[64, 128, 256], token_budget=1024, max_batch=16,
                        n_anchors=8, block_size=4, seed=0)


def test_records_are_binned_once_per_epoch_and_a_batch_costs_the_same_in_every_epoch():
    src = _source(20_000)
    per = src.batches_per_epoch()
    src.batch(per)  # epoch 1: bins once
    bins = src._epoch
    t0 = time.perf_counter()
    for j in range(per + 1, per + 41):  # before: each call re-binned everything twice (~30 ms)
        b = src.batch(j)
    ms = (time.perf_counter() - t0) * 1000 / 40
    assert src._epoch is bins, "re-binned inside an epoch"
    assert ms < 10, f"{ms:.2f} ms per batch() at 20K records"
    assert b.input_ids.shape[0] * b.input_ids.shape[1] <= 1024, b.input_ids.shape
    e0 = [src.batch(j).n_tokens for j in range(5)]
    assert e0 != [src.batch(per + j).n_tokens for j in range(5)]  # each epoch reshuffles


def test_epochs_become_steps_and_warmup_a_ratio_with_cosine_to_zero():
    args = parse_args(["--data", "x.jsonl", "--epochs", "2", "--warmup-ratio", "0.1"])
    s = schedule.resolve(args, batches_per_epoch=150, n_drafters=3)
    assert (s.steps, s.warmup_steps) == (100, 10), s
    assert lr_at(99, 1.0, 10, 100, args.min_lr_ratio) < 1e-3  # cosine ends at 0
    with pytest.raises(TrainerConfigError, match="synthetic"):
        parse_args(["--epochs", "1"])


def test_feature_layers_are_independent_of_drafter_depth_and_the_paper_preset_exists():
    cfg = preset("tiny", draft_layers=3, feature_layers=2)
    d = Drafter(cfg, "sdpa")
    assert (len(d.layers), d.fc.in_features) == (3, 2 * cfg.hidden_size), d
    paper = PRESETS["paper"]
    assert (paper.block_size, paper.max_anchors, paper.gamma) == (16, 512, 7.0), paper
    assert (paper.draft_layers, paper.target_layer_ids) == (8, (1, 9, 17, 25, 33)), paper


def test_mfu_is_reported_against_the_datasheet_peak_and_the_measured_matmul_rate():
    f = mfu_fields(395.6e12, 989.0, 790.0)
    assert (f["mfu"], f["mfu_matmul"]) == (0.4, 0.5008), f
    from opsctl.cli.render import mfu_text

    assert mfu_text({"step": 1, **f}) == "MFU 40.0% of 989 datasheet (50.1% of 790 measured matmul)"


# --- the pipeline -----------------------------------------------------------------


def test_a_trained_drafter_is_accepted_far_more_often_than_an_untrained_one(pipeline):
    _, s = pipeline
    assert s["target_acc"] >= 0.99, s  # the target is confident on its language
    assert s["tau_untrained"] < 1.5, s
    assert s["tau"] > s["tau_untrained"] + 2.5, s
    assert s["tau_cut"] <= s["tau_pooled"] <= s["block_size"], s  # the cut only removes tokens
    assert len(s["per_position"]) == s["block_size"] - 1, s
    assert s["per_position"] == sorted(s["per_position"], reverse=True), s


def test_speculative_decoding_gives_exactly_the_targets_greedy_output(pipeline):
    out, _ = pipeline
    from transformers import AutoModelForCausalLM

    tk = chat_data.load_tokenizer(str(out / "target"))
    drafter, cfg, _ = evaluate.load_drafter(str(out / "drafter"), torch.device("cpu"))
    model = AutoModelForCausalLM.from_pretrained(str(out / "target"), local_files_only=True).eval()
    target = evaluate.FeatureTarget(model, cfg.target_layer_ids)
    for line in (out / "heldout.jsonl").read_text().splitlines()[:3]:
        prompt = chat_data.render_prompt(tk, chat_data.prompt_messages(json.loads(line)))
        stats = evaluate.Acceptance()
        got = evaluate.speculative_decode(target, drafter, cfg, prompt, 20, tk.eos_token_id, stats,
                                          torch.device("cpu"))
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                             eos_token_id=tk.eos_token_id, pad_token_id=tk.pad_token_id)
        assert got == ref[0, len(prompt):].tolist(), (got, ref)
        assert stats.blocks < len(got), stats  # fewer target forwards than tokens


def test_tau_is_the_mean_over_prompts_of_each_prompts_mean_acceptance_length():
    """z-lab/dflash benchmark.py _print_decode_summary: np.mean over responses of
    np.mean(acceptance_lengths); dflash_generate appends accepted + 1 for every block."""
    stats = evaluate.Acceptance(blocks=7, kept=30, lengths=[[1, 2, 2, 4, 8], [8, 8]])
    assert stats.tau == pytest.approx((17 / 5 + 16 / 2) / 2), stats  # 5.7
    assert stats.tau_pooled == pytest.approx(33 / 7), stats
    assert stats.tau_cut == pytest.approx(30 / 7), stats
    assert evaluate.Acceptance().tau == evaluate.Acceptance().tau_cut == 0.0


def test_every_block_counts_in_full_and_the_loop_has_the_references_bounds(pipeline):
    """The block that crosses max_new counts all it accepted; a block that ends exactly at
    max_new is followed by one more (dflash_generate's `while start < max_length`)."""
    out, _ = pipeline
    from transformers import AutoModelForCausalLM

    tk = chat_data.load_tokenizer(str(out / "target"))
    drafter, cfg, _ = evaluate.load_drafter(str(out / "drafter"), torch.device("cpu"))
    model = AutoModelForCausalLM.from_pretrained(str(out / "target"), local_files_only=True).eval()
    target = evaluate.FeatureTarget(model, cfg.target_layer_ids)
    prompt = chat_data.render_prompt(
        tk, chat_data.prompt_messages(json.loads((out / "heldout.jsonl").read_text().splitlines()[0])))
    for max_new in (1, 2, 3, 5, 9):
        stats = evaluate.Acceptance()
        got = evaluate.speculative_decode(target, drafter, cfg, prompt, max_new, None, stats,
                                          torch.device("cpu"))
        (lengths,) = stats.lengths
        produced = [1 + sum(lengths[:i]) for i in range(len(lengths) + 1)]  # before each block
        assert all(p <= max_new for p in produced[:-1]) and produced[-1] > max_new, (max_new, lengths)
        assert len(got) == max_new and stats.kept == max_new - 1, (got, stats)


def test_eval_refuses_absurd_counts_in_one_line(pipeline):
    out, _ = pipeline
    base = ["--ckpt", str(out / "drafter"), "--target-path", str(out / "target"), "--prompts",
            str(out / "heldout.jsonl")]
    with pytest.raises(TrainerConfigError, match="--max-new-tokens 0: at least 1"):
        evaluate.parse([*base, "--max-new-tokens", "0"])
    with pytest.raises(TrainerConfigError, match="--limit -3"):
        evaluate.parse([*base, "--limit", "-3"])
    with pytest.raises(TrainerConfigError, match="--drafter-epochs 0: at least 1"):
        e2e.parse(["--out-dir", str(out / "never"), "--drafter-epochs", "0"])


def test_eval_against_an_fp8_served_target_runs_on_the_cpu_and_says_so(pipeline, capsys):
    out, s = pipeline
    r = evaluate.run(["--ckpt", str(out / "drafter"), "--target-path", str(out / "target"),
                      "--prompts", str(out / "heldout.jsonl"), "--limit", "4", "--device", "cpu",
                      "--max-new-tokens", "20", "--target-precision", "fp8"])
    assert r["target_precision"] == "fp8" and r["prompts"] == 4, r
    assert r["tau"] > s["tau_untrained"] + 2.5, r  # FP8 rounding does not undo the training
    capsys.readouterr()


def test_eval_reports_tau_to_the_trackers_at_the_checkpoints_step(pipeline, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = pipeline
    r = evaluate.run(["--ckpt", str(out / "drafter"), "--target-path", str(out / "target"),
                      "--prompts", str(out / "heldout.jsonl"), "--limit", "2", "--device", "cpu",
                      "--max-new-tokens", "8", "--report-to", "tensorboard"])
    ev = [e for e in map(wire.parse_event, capsys.readouterr().out.splitlines()) if e]
    (said,) = [e for e in ev if e["event"] == wire.EVENT_TRACKERS]
    assert not [e for e in ev if e["event"] == wire.EVENT_WARNING], ev
    (run_dir,) = pathlib.Path(said["tensorboard"]).glob("*-eval")
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert [(s.step, round(s.value, 4)) for s in acc.Scalars("eval/tau")] == [(r["step"], r["tau"])]
    assert r["step"] > 0 and "eval/per_position_1" in acc.Tags()["scalars"]


def test_regenerate_writes_the_targets_answers_and_skips_finished_shards(pipeline, capsys):
    out, _ = pipeline
    rec = json.loads((out / "regen" / "shard-000000.jsonl").read_text().splitlines()[0])
    n_prompt = rec["loss_mask"].index(1)
    assert rec["messages"][-1]["role"] == "assistant" and rec["input_ids"][-1] == 3, rec  # <eot>
    assert sum(rec["loss_mask"]) == len(rec["input_ids"]) - n_prompt, rec
    capsys.readouterr()
    rc = trainer_main(["regenerate", "--target-path", str(out / "target"), "--device", "cpu",
                       "--prompts", str(out / "prompts.jsonl"), "--out", str(out / "regen")])
    ev = [e for e in map(wire.parse_event, capsys.readouterr().out.splitlines()) if e]
    done = [e for e in ev if e["event"] == wire.EVENT_REGENERATE and e.get("done")]
    assert rc == 0 and done[0]["skipped_shards"] == 1 and done[0]["records"] == 0, ev


def test_export_uses_the_reference_names_and_config_and_loads_back_one_to_one(pipeline, tmp_path):
    out, _ = pipeline
    from safetensors.torch import load_file

    summary = export.export(str(out / "drafter"), str(tmp_path / "x"), "float32")
    cfg_json = json.loads((tmp_path / "x" / "config.json").read_text())
    assert cfg_json["architectures"] == ["DFlashDraftModel"], cfg_json
    dc = cfg_json["dflash_config"]
    assert dc["mask_token_id"] == 2 == summary["mask_token_id"], dc  # the tokenizer's <mask>
    assert dc["block_size"] == 8 and len(dc["target_layer_ids"]) == 2, dc
    drafter, cfg, _ = evaluate.load_drafter(str(out / "drafter"), torch.device("cpu"))
    state = load_file(str(tmp_path / "x" / "model.safetensors"))
    ours = drafter.state_dict()
    assert len(state) == len(ours), (sorted(state), sorted(ours))
    for name, v in ours.items():
        ref = export.reference_name(name)
        assert torch.equal(state[ref], v), name
    h, hd = cfg.hidden_size, cfg.head_dim
    expect = {"fc.weight": (h, cfg.feature_width), "hidden_norm.weight": (h,), "norm.weight": (h,),
              "layers.0.input_layernorm.weight": (h,), "layers.0.self_attn.q_norm.weight": (hd,),
              "layers.0.self_attn.q_proj.weight": (cfg.num_heads * hd, h),
              "layers.0.self_attn.k_proj.weight": (cfg.num_kv_heads * hd, h),
              "layers.0.mlp.down_proj.weight": (h, cfg.intermediate_size),
              "layers.1.post_attention_layernorm.weight": (h,)}
    assert {k: tuple(state[k].shape) for k in expect} == expect


def test_status_shows_tau_beside_the_untrained_drafters(pipeline):
    from rich.console import Console

    from opsctl.cli import render

    _, s = pipeline
    ev = [{"event": "acceptance", "tau": s["tau"], "tau_untrained": s["tau_untrained"]},
          {"event": "phase", "phase": "done"}]
    con = Console(width=100, record=True)
    con.print(render.acceptance_line(ev))
    assert con.export_text().strip() == f"τ {s['tau']:.2f} (untrained {s['tau_untrained']:.2f})"
