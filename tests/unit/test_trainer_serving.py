"""The serve lines and model card of an export (remote_payload/trainer/serving.py), from
configs written here: pure logic, the same functions ``export`` calls."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload.trainer import serving
from remote_payload.trainer.config import TrainerConfigError

CONFIG = {"block_size": 16, "max_position_embeddings": 40960, "num_hidden_layers": 5,
          "num_target_layers": 36, "dtype": "bfloat16",
          "dflash_config": {"block_size": 16, "mask_token_id": 151669,
                            "target_layer_ids": [1, 9, 17, 25, 33]}}
QWEN3_8B = serving.Target("/models/Qwen3-8B", 40960)


def test_vllm_gets_the_dflash_method_and_block_size_minus_one_tokens():
    line, _ = serving.serve_lines(CONFIG, "/opt/opsctl/runs/q8/export", QWEN3_8B)
    argv = shlex.split(line)
    assert argv[:3] == ["vllm", "serve", "/models/Qwen3-8B"]
    assert argv[3] == "--speculative-config"
    assert json.loads(argv[4]) == {"method": "dflash", "model": "/opt/opsctl/runs/q8/export",
                                   "num_speculative_tokens": 15}
    assert len(argv) == 5


def test_sglang_gets_the_dflash_algorithm_and_the_draft_path_and_no_override_when_not_longer():
    _, line = serving.serve_lines(CONFIG, "/opt/opsctl/runs/q8/export", QWEN3_8B)
    assert shlex.split(line) == [
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/Qwen3-8B",
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
        "/opt/opsctl/runs/q8/export"]


def test_sglang_is_told_the_targets_longer_context_and_allowed_past_the_drafters():
    longer = serving.Target("/models/Qwen3-8B-128k", 131072)
    _, line = serving.serve_lines(CONFIG, "/x", longer)
    argv = shlex.split(line)
    assert argv[:2] == ["env", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"]
    assert argv[-2:] == ["--context-length", "131072"]
    card = serving.model_card(CONFIG, "/x", longer)
    assert "The target's context (131072) is longer than the drafter's config (40960)" in card


def test_an_unknown_target_is_a_named_placeholder_and_the_card_says_how_to_override():
    vllm, sglang = serving.serve_lines(CONFIG, "/x", serving.Target())
    assert shlex.split(vllm)[2] == "TARGET_MODEL" and "TARGET_MODEL" in shlex.split(sglang)
    card = serving.model_card(CONFIG, "/x", serving.Target())
    assert "not recorded (replace `TARGET_MODEL` below with the target)" in card
    assert "add `--context-length N` to SGLang's line" in card


def test_the_card_holds_exactly_the_printed_lines():
    card = serving.model_card(CONFIG, "/opt/x", QWEN3_8B)
    for line in serving.serve_lines(CONFIG, "/opt/x", QWEN3_8B):
        assert f"\n{line}\n" in card
    assert "| block size | 16 (drafts 15 tokens per step) |" in card
    assert "| target layers read | [1, 9, 17, 25, 33] of 36 |" in card


@pytest.mark.parametrize("block", [None, "16", 1, 0, -3, True, 2.5])
def test_a_config_without_a_usable_block_size_is_refused_by_name(block):
    cfg = {**CONFIG, "block_size": block}
    with pytest.raises(TrainerConfigError, match="block_size"):
        serving.serve_lines(cfg, "/x", QWEN3_8B)


PATHS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(draft=PATHS, target=PATHS, longest=st.integers(1, 10**7))
def test_any_path_reaches_the_servers_argv_intact(draft, target, longest):
    """Spaces, quotes, ``$(…)``, newlines, unicode: the shell splits each line back into
    exactly the argv built (shlex.join), and the JSON value names the draft path exactly."""
    tgt = serving.Target(target, longest)
    vllm, sglang = serving.serve_lines(CONFIG, draft, tgt)
    assert shlex.split(vllm) == serving.vllm_argv(CONFIG, draft, tgt)
    assert shlex.split(sglang) == serving.sglang_argv(CONFIG, draft, tgt)
    assert json.loads(shlex.split(vllm)[4])["model"] == draft


def _ckpt(tmp_path: Path, meta: object) -> Path:
    ckpt = tmp_path / "ckpt-0000001"
    ckpt.mkdir()
    (ckpt / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    return ckpt


def test_the_target_comes_from_the_checkpoints_args_and_its_own_config(tmp_path):
    target = tmp_path / "Qwen3-8B"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"max_position_embeddings": 131072}))
    ckpt = _ckpt(tmp_path, {"args": {"target_path": str(target)}})
    assert serving.target_of(ckpt) == serving.Target(str(target), 131072)


@pytest.mark.parametrize("meta", [
    "{not json", {"args": None}, {"args": {"target_path": None}}, {"args": {"target_path": ""}},
    {"args": {"target_path": 7}}, {}, [],
])
def test_an_unrecorded_or_damaged_target_record_is_an_unknown_target(tmp_path, meta):
    assert serving.target_of(_ckpt(tmp_path, meta)) == serving.Target()


@pytest.mark.parametrize("config", ["{broken", json.dumps({"max_position_embeddings": "40960"}),
                                    json.dumps({"max_position_embeddings": -1}), json.dumps([1]),
                                    None])
def test_a_target_whose_config_is_gone_or_damaged_keeps_its_path_without_a_length(tmp_path, config):
    target = tmp_path / "target"
    target.mkdir()
    if config is not None:
        (target / "config.json").write_text(config)
    ckpt = _ckpt(tmp_path, {"args": {"target_path": str(target)}})
    assert serving.target_of(ckpt) == serving.Target(str(target), None)


@settings(max_examples=100, deadline=None)
@given(draft=PATHS, target=PATHS)
def test_any_path_leaves_the_cards_code_blocks_and_table_whole(draft, target):
    """Backticks in a path do not end a code block early, a ``|`` or newline does not break
    the table: the card's lines still hold each command line whole."""
    card = serving.model_card(CONFIG, draft, serving.Target(target, 40960))
    vllm, sglang = serving.serve_lines(CONFIG, draft, serving.Target(target, 40960))
    fence = serving._fence(vllm + sglang + json.dumps(draft))
    assert f"\n{fence}bash\n{vllm}\n{fence}\n" in card
    assert f"\n{fence}bash\n{sglang}\n{fence}\n" in card
    row = next(ln for ln in card.splitlines() if ln.startswith("| trained against |"))
    assert row.endswith(" |") and "|" not in row[len("| trained against |"):-2].replace("\\|", "")


def test_only_an_absent_readme_or_an_exports_own_card_may_be_written(tmp_path):
    readme = tmp_path / "README.md"
    assert serving.ours(readme)  # absent
    readme.write_text(serving.model_card(CONFIG, "/x", QWEN3_8B))
    assert serving.ours(readme)  # a card an export wrote: rewritten at the next export
    readme.write_text("# My model\n\nHand-written card of a hub repository.\n")
    assert not serving.ours(readme)
    readme.write_bytes(b"\xff\xfe not utf-8")
    assert not serving.ours(readme)


def test_a_readme_that_is_a_link_or_a_directory_is_never_written_through(tmp_path):
    card = tmp_path / "elsewhere.md"
    card.write_text(serving.model_card(CONFIG, "/x", QWEN3_8B))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "README.md").symlink_to(card)  # even a link to a card of ours
    assert not serving.ours(tmp_path / "a" / "README.md")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "README.md").symlink_to(tmp_path / "missing")  # dangling
    assert not serving.ours(tmp_path / "b" / "README.md")
    (tmp_path / "c" / "README.md").mkdir(parents=True)
    assert not serving.ours(tmp_path / "c" / "README.md")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "too-big", "deep-nesting"])
def test_a_target_config_that_is_no_small_regular_file_is_not_read_and_never_blocks(tmp_path, kind):
    """The target's path is the user's: a FIFO there would block the export forever (nobody
    writes to it), ``/dev/zero`` would fill memory; both, and a huge file, are an unknown
    length, at once."""
    import os
    import threading

    target = tmp_path / "target"
    target.mkdir()
    config = target / "config.json"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")
    elif kind == "directory":
        config.mkdir()
    elif kind == "too-big":
        config.write_text(json.dumps({"max_position_embeddings": 8192, "pad": "x" * (2 << 20)}))
    else:
        config.write_text("[" * 100_000 + "]" * 100_000)
    ckpt = _ckpt(tmp_path, {"args": {"target_path": str(target)}})
    found: list[serving.Target] = []
    reader = threading.Thread(target=lambda: found.append(serving.target_of(ckpt)), daemon=True)
    reader.start()
    reader.join(10)
    assert found == [serving.Target(str(target), None)]


@pytest.mark.parametrize("junk", [None, [1, 2], "junk", 7])
def test_a_config_whose_dflash_section_is_not_a_mapping_still_gets_its_card(junk):
    card = serving.model_card({**CONFIG, "dflash_config": junk}, "/o", QWEN3_8B)
    assert "| mask token id | None |" in card
    assert serving.serve_lines(CONFIG, "/o", QWEN3_8B)[0] in card


def test_a_card_naming_a_path_that_is_not_utf8_is_written_as_that_path_s_own_bytes(tmp_path):
    """A file name's bytes that are not UTF-8 arrive as lone surrogates: the card holds the
    real bytes (its shell lines name the real directory), never a crash after the export."""
    import os

    out = Path(os.fsdecode(os.fsencode(tmp_path) + b"/out-\xff"))
    out.mkdir()
    serving.write_card(out / serving.README_FILE,
                       serving.model_card(CONFIG, str(out), serving.Target()))
    raw = (out / serving.README_FILE).read_bytes()
    assert os.fsencode(out) in raw
    assert raw.decode("utf-8", "surrogateescape").startswith(serving.CARD_MARK)


def test_a_readme_that_becomes_a_link_after_the_check_is_refused_never_written_through(
        tmp_path):
    """write_card runs after ours() said yes; a link put there in between (a shared
    directory) is refused (remote_payload/safe_write.py), and the file it pointed at is
    untouched."""
    from remote_payload import safe_write

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's\n")
    readme = tmp_path / "out" / serving.README_FILE
    readme.parent.mkdir()
    readme.symlink_to(victim)
    with pytest.raises(safe_write.DestinationRefused, match="symbolic link"):
        serving.write_card(readme, serving.model_card(CONFIG, str(readme.parent), QWEN3_8B))
    assert victim.read_text() == "the user's\n"
    assert readme.is_symlink()
    assert sorted(p.name for p in readme.parent.iterdir()) == [serving.README_FILE]


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_a_printed_line_the_stdout_cannot_encode_is_shown_escaped_not_a_crash(encoding):
    """The export's lines name OUT; a name that is not UTF-8 (or not ASCII, on an ASCII
    stdout) is printed with backslash escapes after the work is done, never a traceback."""
    import io

    from remote_payload.trainer.events import Log

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding)
    Log(stream=stream).say("  vllm serve /models/ü-\udcff")
    stream.flush()
    shown = raw.getvalue().decode(encoding)
    assert shown.startswith("  vllm serve /models/") and "\\udcff" in shown
