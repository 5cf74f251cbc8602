"""What the servers read from an export, pinned: every tensor name and shape, and every config
key vLLM's and SGLang's DFlash loaders read. SGLang skips a weight name it does not know
without a word (and would serve a half-initialised drafter), so a rename must fail here.

Also: the export writes its model card (README.md) and prints the same serve lines at its end.
A tiny real export on CPU; the expectations are written out in full, not derived from the code.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shlex

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from remote_payload import wire  # noqa: E402
from remote_payload.trainer import checkpoint, export  # noqa: E402
from remote_payload.trainer.commands import main as trainer_main  # noqa: E402
from remote_payload.trainer.config import preset  # noqa: E402
from remote_payload.trainer.model import Drafter  # noqa: E402

#: tiny preset, 2 drafter layers, 2 feature layers: hidden 64, 4 heads of 16 (2 KV), MLP 128
TENSORS = {
    "fc.weight": (64, 128),
    "hidden_norm.weight": (64,),
    "norm.weight": (64,),
    **{f"layers.{i}.{name}": shape for i in (0, 1) for name, shape in {
        "input_layernorm.weight": (64,),
        "post_attention_layernorm.weight": (64,),
        "self_attn.q_proj.weight": (64, 64),
        "self_attn.k_proj.weight": (32, 64),
        "self_attn.v_proj.weight": (32, 64),
        "self_attn.o_proj.weight": (64, 64),
        "self_attn.q_norm.weight": (16,),
        "self_attn.k_norm.weight": (16,),
        "mlp.gate_proj.weight": (128, 64),
        "mlp.up_proj.weight": (128, 64),
        "mlp.down_proj.weight": (64, 128),
    }.items()},
}

#: the keys the loaders read, with this export's values
CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "block_size": 4,
    "num_target_layers": 6,
    "num_hidden_layers": 2,
    "layer_types": ["full_attention", "full_attention"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960,
    "rope_theta": 10000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
    "dflash_config": {"block_size": 4, "mask_token_id": 255, "target_layer_ids": [1, 3]},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A checkpoint of a tiny drafter, trained against a target whose context is 131072."""
    base = tmp_path_factory.mktemp("export-contract")
    target = base / "my target's dir"  # a space and a quote: the printed lines must quote them
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"max_position_embeddings": 131072}))
    cfg = preset("tiny", draft_layers=2, feature_layers=2)
    torch.manual_seed(0)
    d = Drafter(cfg, "sdpa")
    checkpoint.save(str(base / "run"), 1, d, torch.optim.AdamW(d.parameters()),
                    {"cfg": dataclasses.asdict(cfg), "args": {"target_path": str(target)}})
    return base


def test_every_tensor_name_and_shape_the_loaders_read_is_pinned(run_dir, tmp_path):
    from safetensors import safe_open

    export.export(str(run_dir / "run"), str(tmp_path / "x"), "bfloat16")
    with safe_open(str(tmp_path / "x" / "model.safetensors"), "pt") as f:
        got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not iterable)
    assert got == TENSORS


def test_every_config_key_the_loaders_read_is_pinned(run_dir, tmp_path):
    export.export(str(run_dir / "run"), str(tmp_path / "x"), "bfloat16")
    cfg = json.loads((tmp_path / "x" / "config.json").read_text())
    assert {k: cfg.get(k) for k in CONFIG} == CONFIG
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 3]  # outputs of target layers, 0-based


def test_the_export_writes_its_model_card_and_prints_the_same_serve_lines_at_its_end(
        run_dir, tmp_path, capsys):
    out = tmp_path / "served"
    assert trainer_main(["export", str(run_dir / "run"), str(out)]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if wire.parse_event(ln) is None]
    card = (out / "README.md").read_text()
    vllm, sglang = printed[-4].strip(), printed[-2].strip()
    assert printed[-5:] == ["serve it with vLLM:", f"  {vllm}", "or with SGLang:", f"  {sglang}",
                            f"(also in {out / 'README.md'})"]
    assert f"\n{vllm}\n" in card and f"\n{sglang}\n" in card
    target = str(run_dir / "my target's dir")
    assert shlex.split(vllm) == ["vllm", "serve", target, "--speculative-config", json.dumps(
        {"method": "dflash", "model": str(out), "num_speculative_tokens": 3})]
    assert shlex.split(sglang) == [
        "env", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1", "python3", "-m",
        "sglang.launch_server", "--model-path", target, "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", str(out), "--context-length", "131072"]
    assert oct((out / "README.md").stat().st_mode & 0o777) == "0o644"


def test_a_readme_of_the_users_in_the_export_dir_is_kept_and_the_lines_still_printed(
        run_dir, tmp_path, capsys):
    """Exporting into a hub repository's clone: its README.md is the user's (nothing lost)."""
    out = tmp_path / "hub-clone"
    out.mkdir()
    (out / "README.md").write_text("# my card\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "README.md").symlink_to(tmp_path / "target-of-link.md")
    for where in (out, linked):
        assert trainer_main(["export", str(run_dir / "run"), str(where)]) == 0
        captured = capsys.readouterr()
        human = [ln for ln in captured.out.splitlines() if wire.parse_event(ln) is None]
        assert human[-4:-2] == ["serve it with vLLM:", human[-3]] and human[-2] == "or with SGLang:"
        assert not [ln for ln in human if ln.startswith("(also in")]
        assert f"export: kept {where / 'README.md'} (not written by an export)" in captured.err
        assert (where / "config.json").is_file()
    assert (out / "README.md").read_text() == "# my card\n"
    assert not (tmp_path / "target-of-link.md").exists()  # nothing written through the link


def test_a_second_export_rewrites_its_own_card(run_dir, tmp_path, capsys):
    out = tmp_path / "again"
    assert trainer_main(["export", str(run_dir / "run"), str(out)]) == 0
    (out / "README.md").write_text((out / "README.md").read_text() + "stale line\n")
    assert trainer_main(["export", str(run_dir / "run"), str(out)]) == 0
    assert "stale line" not in (out / "README.md").read_text()
    assert "export: kept" not in capsys.readouterr().err


def test_an_export_into_a_directory_whose_name_is_not_utf8_writes_its_card_and_lines(
        run_dir, tmp_path, capsys):
    import os

    out = pathlib.Path(os.fsdecode(os.fsencode(tmp_path) + b"/out-\xff"))
    assert trainer_main(["export", str(run_dir / "run"), str(out)]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if wire.parse_event(ln) is None]
    escaped = str(out).encode("utf-8", "backslashreplace").decode("utf-8")  # a strict stdout
    assert printed[-1] in (f"(also in {out / 'README.md'})", f"(also in {escaped}/README.md)")
    assert os.fsencode(out) in (out / "README.md").read_bytes()
