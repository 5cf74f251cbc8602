"""An export is ready to serve: transformers' AutoModel builds the DFlash drafter from it with
the file's exact weights and the trainer's exact outputs, and every file is readable by a
server running as another user.

The slow test checks the modeling file under the oldest and the newest transformers the
project claims (pyproject's trainer extra): this environment's own (the newest), and each older
one from a ``pip install --no-deps --target`` directory holding it with the hub and tokenizers
it needs (first on ``PYTHONPATH``, beside this environment's torch and numpy), kept under
/var/tmp between runs (cold: a few seconds per version).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pathlib
import subprocess
import sys
import typing as t

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from remote_payload import safe_write  # noqa: E402
from remote_payload.safe_write import DestinationRefused, WriteFailed  # noqa: E402
from remote_payload.trainer import checkpoint, evaluate, export  # noqa: E402
from remote_payload.trainer.config import DrafterConfig, preset  # noqa: E402
from remote_payload.trainer.model import Drafter, dense_mask  # noqa: E402

#: the oldest transformers pyproject claims (trainer extra), the last 4.x, the newest 5.x
TRANSFORMERS = ("4.51.3", "4.57.6", "5.24.0")
COMPAT_HOME = pathlib.Path(os.environ.get("OPSCTL_HF_COMPAT_HOME", "/var/tmp/opsctl-hf-compat"))


def _drafter(seed: int = 0) -> tuple[Drafter, DrafterConfig]:
    """A tiny drafter (GQA, 2 layers, 2 feature layers) with non-trivial norm weights."""
    cfg = preset("tiny", draft_layers=2, feature_layers=2)
    torch.manual_seed(seed)
    d = Drafter(cfg, "sdpa")
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return d.eval(), cfg


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, Drafter, DrafterConfig]:
    """A checkpoint of a tiny drafter and its float32 export."""
    base = tmp_path_factory.mktemp("hf-export")
    d, cfg = _drafter()
    opt = torch.optim.AdamW(d.parameters())
    checkpoint.save(str(base / "run"), 1, d, opt, {"cfg": dataclasses.asdict(cfg)})
    export.export(str(base / "run"), str(base / "export"), "float32")
    return base / "export", d, cfg


@pytest.fixture(scope="module", autouse=True)
def _modules_cache(tmp_path_factory: pytest.TempPathFactory) -> t.Iterator[None]:
    """transformers copies remote code into HF_MODULES_CACHE, read once at import (so the
    environment variable is too late here): point it at a temporary directory, not ~/.cache."""
    import transformers.dynamic_module_utils as dmu

    with pytest.MonkeyPatch.context() as mp:
        cache = tmp_path_factory.mktemp("hf-modules")
        mp.setattr(dmu, "HF_MODULES_CACHE", str(cache))
        mp.syspath_prepend(str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


def _auto_model(path: pathlib.Path) -> t.Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path), trust_remote_code=True, dtype=torch.float32)


def _inputs(cfg: DrafterConfig, seq: int = 11,
            anchors: tuple[int, ...] = (3, 7, 11)) -> dict[str, torch.Tensor]:
    """Two rows of context features, N blocks each, the training mask (last block invalid in
    row 1: its queries see nothing)."""
    g = torch.Generator().manual_seed(1)
    k, n = cfg.block_size, len(anchors)
    feats = torch.randn(2, seq, cfg.feature_width, generator=g)
    block = torch.randn(2, n * k, cfg.hidden_size, generator=g)
    a = torch.tensor([list(anchors), list(anchors)])
    valid = torch.tensor([[True] * n, [True] * (n - 1) + [False]])
    pos = (a.unsqueeze(-1) + torch.arange(k)).reshape(2, n * k)
    return {"feats": feats, "block": block, "pos": pos,
            "mask": dense_mask(a, valid, seq, k), "ctx_pos": torch.arange(seq).expand(2, -1)}


def test_the_export_names_its_modeling_file_in_auto_map_as_the_reference_hub_repos_do(exported):
    path, _, _ = exported
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}, cfg
    assert (path / "dflash.py").read_bytes() == pathlib.Path(
        export.__file__).with_name("hf_dflash.py").read_bytes()


def test_the_modeling_file_imports_only_torch_transformers_and_the_standard_library():
    import ast

    src = pathlib.Path(export.__file__).with_name("hf_dflash.py").read_text()
    tops = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import of {node.module}: transformers copies one file"
            tops.add((node.module or "").split(".")[0])
    assert tops - set(sys.stdlib_module_names) == {"torch", "transformers"}, tops


def test_automodel_builds_the_dflash_drafter_with_the_files_exact_weights(exported):
    from safetensors.torch import load_file

    path, _, _ = exported
    model = _auto_model(path)
    assert type(model).__name__ == "DFlashDraftModel", type(model)
    state, file = model.state_dict(), load_file(str(path / "model.safetensors"))
    assert sorted(state) == sorted(file)
    unequal = [k for k in file if not torch.equal(state[k], file[k])]
    assert unequal == [], unequal


def test_the_automodel_drafter_computes_the_trainers_outputs_bit_for_bit_in_fp32(exported):
    path, ours, cfg = exported
    model = _auto_model(path)
    x = _inputs(cfg)
    with torch.no_grad():
        want = ours(x["feats"], x["block"], x["pos"], (x["mask"], x["mask"].any(-1, keepdim=True)))
        got = model(position_ids=torch.cat([x["ctx_pos"], x["pos"]], dim=1),
                    noise_embedding=x["block"], target_hidden=x["feats"], attention_mask=x["mask"])
    assert torch.equal(got, want), (got - want).abs().max()
    assert got[1, -cfg.block_size:].abs().sum() > 0  # an invalid block still has its MLP path
    # one block whose anchor ends the context: no mask needed, the same numbers within rounding
    one = {k: v[:1] for k, v in _inputs(cfg, seq=7, anchors=(7,)).items()}  # row 0: valid
    with torch.no_grad():
        want = ours(one["feats"], one["block"], one["pos"],
                    (one["mask"], one["mask"].any(-1, keepdim=True)))
        got = model(position_ids=torch.cat([one["ctx_pos"], one["pos"]], dim=1),
                    noise_embedding=one["block"], target_hidden=one["feats"])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_call_whose_positions_do_not_cover_context_and_block_is_refused(exported):
    path, _, cfg = exported
    model = _auto_model(path)
    x = _inputs(cfg)
    with pytest.raises(ValueError, match="position_ids cover"):
        model(position_ids=x["pos"], noise_embedding=x["block"], target_hidden=x["feats"])
    with pytest.raises(ValueError, match="noise_embedding and target_hidden"):
        model(position_ids=x["pos"], noise_embedding=x["block"])
    with pytest.raises(ValueError, match="one prompt at a time"):
        model.spec_generate(target=None, input_ids=torch.zeros(2, 3, dtype=torch.long),
                            max_new_tokens=4)


def test_a_config_without_dflash_config_is_refused_by_name_not_built_at_random(exported, tmp_path):
    import shutil

    path, _, _ = exported
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["dflash_config"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"no dflash_config\.target_layer_ids: not a DFlash drafter"):
        _auto_model(bad)


def _tiny_target(cfg: DrafterConfig) -> t.Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(3)
    hf = Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                     intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.target_layers,
                     num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                     head_dim=cfg.head_dim, tie_word_embeddings=False)
    hf._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(hf).eval()


def test_spec_generate_gives_the_targets_greedy_output_and_evals_acceptance_lengths(exported):
    path, ours, cfg = exported
    model = _auto_model(path)
    target = _tiny_target(cfg)
    prompt = [5, 17, 42, 9, 77, 3]
    for eos, max_new in ((None, 24), (int(target(torch.tensor([prompt])).logits[0, -1].argmax()), 24),
                         (None, 1)):
        out = model.spec_generate(target=target, input_ids=torch.tensor([prompt]),
                                  max_new_tokens=max_new,
                                  stop_token_ids=None if eos is None else [eos])
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                              eos_token_id=eos, pad_token_id=0)
        assert out.tolist() == ref.tolist(), (eos, max_new, out, ref)
        stats = evaluate.Acceptance()
        got = evaluate.speculative_decode(evaluate.FeatureTarget(target, cfg.target_layer_ids),
                                          ours, cfg, prompt, max_new, eos, stats,
                                          torch.device("cpu"))
        assert got == out[0, len(prompt):].tolist(), (got, out)
        assert stats.lengths == [model.last_acceptance_lengths], (stats.lengths,
                                                                 model.last_acceptance_lengths)


# --- where an export may land ------------------------------------------------------------


def _snapshot(d: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("out", ["ckpt", "run", "inside-ckpt"])
def test_an_export_onto_a_checkpoint_or_its_run_is_refused_and_resume_still_works(exported, out):
    path, _, _ = exported
    run = path.parent / "run"
    (ckpt,) = run.glob("ckpt-*")
    before = _snapshot(run)
    dest = {"ckpt": ckpt, "run": run, "inside-ckpt": ckpt / "export"}[out]
    with pytest.raises(DestinationRefused, match="refused as export OUT"):
        export.export(str(ckpt), str(dest), "float32", force=True)
    assert _snapshot(run) == before
    assert checkpoint.resolve("auto", str(run)) == ckpt
    evaluate.load_drafter(str(run), torch.device("cpu"))


def test_an_export_beside_the_checkpoints_in_the_run_directory_is_fine(exported):
    path, _, _ = exported
    run = path.parent / "run"
    export.export(str(run), str(run / "export"), "float32")
    assert (safe_write.read_marker(run / "export") or {}).get("kind") == "export"
    assert checkpoint.resolve("auto", str(run)).name.startswith("ckpt-")


def test_a_foreign_model_directory_is_refused_and_replaced_only_with_force(exported, tmp_path):
    path, _, _ = exported
    model = tmp_path / "Qwen3-8B"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    (model / "model.safetensors").write_bytes(b"the target's weights")
    with pytest.raises(DestinationRefused, match="opsctl did not write"):
        export.export(str(path.parent / "run"), str(model), "float32")
    assert (model / "model.safetensors").read_bytes() == b"the target's weights"
    export.export(str(path.parent / "run"), str(model), "float32", force=True)
    assert (safe_write.read_marker(model) or {}).get("kind") == "export"


def test_a_link_in_a_previous_export_is_never_written_through(exported, tmp_path):
    path, _, _ = exported
    out = tmp_path / "out"
    export.export(str(path.parent / "run"), str(out), "float32")
    victim = tmp_path / "shadow"
    victim.write_text("root:x")
    victim.chmod(0o600)
    (out / "config.json").unlink()
    (out / "config.json").symlink_to(victim)
    with pytest.raises(DestinationRefused, match=r"changed since \('config.json'\)"):
        export.export(str(path.parent / "run"), str(out), "float32")
    export.export(str(path.parent / "run"), str(out), "float32", force=True)
    assert victim.read_text() == "root:x" and victim.stat().st_mode & 0o777 == 0o600
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]


def test_an_edited_or_copied_export_is_replaced_only_with_force_its_readme_kept(exported,
                                                                                tmp_path):
    path, _, _ = exported
    run = str(path.parent / "run")
    out = tmp_path / "out"
    export.export(run, str(out), "float32")
    (out / "README.md").write_text("my own card")
    export.export(run, str(out), "float32")  # the user's README is carried: nothing lost
    assert (out / "README.md").read_text() == "my own card"
    (out / "tokenizer.json").write_text("the user's tokenizer")
    with pytest.raises(DestinationRefused, match=r"changed since \('tokenizer.json'\)"):
        export.export(run, str(out), "float32")
    assert (out / "tokenizer.json").read_text() == "the user's tokenizer"
    copy = tmp_path / "copy"  # cp -r: the marker travels, the files are new ones
    subprocess.run(["cp", "-r", str(path), str(copy)], check=True)
    with pytest.raises(DestinationRefused, match="changed since"):
        export.export(run, str(copy), "float32")


def test_a_readme_directory_of_the_users_is_carried_by_a_forced_export(exported, tmp_path):
    path, _, _ = exported
    out = tmp_path / "out"
    export.export(str(path.parent / "run"), str(out), "float32")
    (out / "README.md").unlink()
    (out / "README.md").mkdir()
    (out / "README.md" / "notes").write_text("mine")
    with pytest.raises(DestinationRefused, match="changed since"):
        export.export(str(path.parent / "run"), str(out), "float32")
    export.export(str(path.parent / "run"), str(out), "float32", force=True)
    assert (out / "README.md" / "notes").read_text() == "mine"


def test_a_marker_planted_in_a_model_directory_does_not_make_it_opsctls(exported, tmp_path):
    path, _, _ = exported
    model = tmp_path / "Qwen3-8B"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"the target's weights")
    (model / safe_write.MARKER).write_text('{"written_by": "opsctl", "kind": "export"}')
    with pytest.raises(DestinationRefused, match="did not write or that changed since"):
        export.export(str(path.parent / "run"), str(model), "float32")
    assert (model / "model.safetensors").read_bytes() == b"the target's weights"


def test_a_failed_export_leaves_the_previous_export_whole(exported, tmp_path, monkeypatch):
    path, _, _ = exported
    out = tmp_path / "out"
    export.export(str(path.parent / "run"), str(out), "float32")
    before = _snapshot(out)
    def no_space(*_a: object) -> t.NoReturn:  # after the weights were written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "export_card", no_space)
    with pytest.raises(WriteFailed, match="No space left on device"):
        export.export(str(path.parent / "run"), str(out), "bfloat16")
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("out", ["", ".", "cwd"])
def test_an_export_never_writes_into_the_current_directory(exported, tmp_path, monkeypatch, out):
    path, _, _ = exported
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DestinationRefused, match="current directory"):
        export.export(str(path.parent / "run"), str(tmp_path) if out == "cwd" else out)
    assert list(tmp_path.iterdir()) == []


def test_a_tilde_from_a_playbooks_argv_is_the_home_never_a_directory_named_tilde(
        exported, tmp_path, monkeypatch):
    path, _, _ = exported
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    export.run([str(path.parent / "run"), "~/exports/x", "--dtype", "float32"])
    assert (tmp_path / "home" / "exports" / "x" / "config.json").is_file()
    assert not (tmp_path / "~").exists()
    with pytest.raises(DestinationRefused, match="home directory"):
        export.run([str(path.parent / "run"), "~", "--force"])


def test_a_file_or_a_device_as_out_is_one_line_with_exit_2(exported, tmp_path):
    path, _, _ = exported
    (tmp_path / "file").write_text("keep")
    with pytest.raises(DestinationRefused, match="is a file"):
        export.export(str(path.parent / "run"), str(tmp_path / "file"))
    with pytest.raises(WriteFailed, match="/dev/full is not a directory"):
        export.export(str(path.parent / "run"), "/dev/full/x")
    res = subprocess.run([sys.executable, "-m", "remote_payload.trainer", "export",
                          str(path.parent / "run"), str(tmp_path / "file")],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: {tmp_path}/file: is a file, not a directory; nothing written"]
    assert (tmp_path / "file").read_text() == "keep"


def test_a_full_disk_is_one_line_with_exit_2_and_leaves_nothing_behind(exported, tmp_path):
    path, _, _ = exported
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(small)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        res = subprocess.run([sys.executable, "-m", "remote_payload.trainer", "export",
                              str(path.parent / "run"), str(small / "out"), "--dtype", "float32"],
                             capture_output=True, text=True, check=False)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().splitlines() == [
            f"error: {small}/out: cannot write: No space left on device"], res.stderr
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


# --- file modes ---------------------------------------------------------------------------


def _modes(d: pathlib.Path) -> dict[str, str]:
    return {p.name: oct(p.stat().st_mode & 0o777) for p in sorted(d.iterdir()) if p.is_file()}


def test_exports_and_checkpoints_are_0644_under_the_usual_umask(exported):
    path, _, _ = exported
    assert _modes(path) == {"README.md": "0o644", "config.json": "0o644", "dflash.py": "0o644",
                            "model.safetensors": "0o644", safe_write.MARKER: "0o644"}
    (ckpt,) = (path.parent / "run").glob("ckpt-*")
    assert _modes(ckpt) == {"meta.json": "0o644", "model.safetensors": "0o644",
                            "optim.pt": "0o644", safe_write.MARKER: "0o644"}


def test_a_umask_that_hides_files_from_other_users_is_respected_and_said_in_one_line(
        exported, tmp_path, capfd):
    path, _, _ = exported
    checkpoint._warn_unreadable.cache_clear()
    old = os.umask(0o077)
    try:
        summary = export.export(str(path.parent / "run"), str(tmp_path / "private"), "bfloat16")
    finally:
        os.umask(old)
    assert summary["mode"] == "0600", summary
    assert set(_modes(tmp_path / "private").values()) == {"0o600"}, _modes(tmp_path / "private")
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: umask 077 makes checkpoints and exports "
                                               "mode 0600, unreadable to other users"), err


# --- the oldest and newest transformers claimed -----------------------------------------------

_CHECK = r"""
import json, sys, torch, transformers
from safetensors.torch import load_file
from transformers import AutoModel
export, io = sys.argv[1], load_file(sys.argv[2])
old = tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (4, 56)
model = AutoModel.from_pretrained(export, trust_remote_code=True,
                                  **{"torch_dtype" if old else "dtype": torch.float32})
state, file = model.state_dict(), load_file(export + "/model.safetensors")
with torch.no_grad():
    got = model(position_ids=io["position_ids"], noise_embedding=io["block"],
                target_hidden=io["feats"], attention_mask=io["mask"])
print(json.dumps({"transformers": transformers.__version__, "class": type(model).__name__,
                  "same_names": sorted(state) == sorted(file),
                  "weights_equal": all(torch.equal(state[k], file[k]) for k in file),
                  "outputs_equal": bool(torch.equal(got, io["want"]))}))
"""

_OFFLINE = ("Failed to establish a new connection", "Temporary failure in name resolution",
            "Network is unreachable", "No matching distribution found", "Could not fetch URL")


def _pip(python: pathlib.Path, *args: str) -> None:
    """pip install; skips the test when the index cannot be reached, fails on anything else."""
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *args], capture_output=True, text=True, timeout=900, check=False)
    if r.returncode:
        tail = (r.stdout + r.stderr)[-600:]
        if any(s in tail for s in _OFFLINE):
            pytest.skip(f"PyPI unreachable, cannot install {' '.join(args)}: {tail.strip()[-200:]}")
        raise AssertionError(f"pip install {' '.join(args)} failed:\n{tail}")


#: what each older transformers needs that this environment's newer one does not (hub < 1.0, its
#: own tokenizers range), pinned to what pip resolved for it; the rest (numpy, regex, requests,
#: safetensors, ...) is this environment's, as a server's would be
OLDER_DEPS = {"4.51.3": ("huggingface_hub==0.36.2", "tokenizers==0.21.4"),
              "4.57.6": ("huggingface_hub==0.36.2", "tokenizers==0.22.2")}


def _compat_env(version: str) -> tuple[pathlib.Path, pathlib.Path | None]:
    """(this interpreter, a directory holding transformers ``version``, or None when this
    environment has that version itself), the directory built once and kept; a lock keeps two
    test runs from building it at once. On ``PYTHONPATH`` the directory comes before
    site-packages, so its transformers (and its hub, its tokenizers) win over this
    environment's. The check script reports the version it imported: a leak fails it."""
    import importlib.metadata

    python = pathlib.Path(sys.executable)
    if importlib.metadata.version("transformers") == version:
        return python, None
    COMPAT_HOME.mkdir(parents=True, exist_ok=True)
    lib = COMPAT_HOME / f"transformers-{version}-nodeps"
    with (COMPAT_HOME / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (lib / ".complete").is_file():
            extra = OLDER_DEPS.get(version)
            if extra is None:  # a version this table does not know: every dependency in lib
                _pip(python, "--upgrade", "--target", str(lib), f"transformers=={version}")
            else:
                _pip(python, "--upgrade", "--no-deps", "--target", str(lib),
                     f"transformers=={version}", *extra)
            (lib / ".complete").write_text("")
    return python, lib


@pytest.mark.slow
@pytest.mark.parametrize("version", TRANSFORMERS)
def test_automodel_loads_the_export_exactly_under_each_claimed_transformers(version, exported,
                                                                           tmp_path):
    from safetensors.torch import save_file

    path, ours, cfg = exported
    python, lib = _compat_env(version)
    x = _inputs(cfg)
    with torch.no_grad():
        want = ours(x["feats"], x["block"], x["pos"], (x["mask"], x["mask"].any(-1, keepdim=True)))
    save_file({"feats": x["feats"], "block": x["block"], "mask": x["mask"], "want": want,
               "position_ids": torch.cat([x["ctx_pos"], x["pos"]], dim=1).contiguous()},
              str(tmp_path / "io.safetensors"))
    (tmp_path / "check.py").write_text(_CHECK)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(lib or ""),
           "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HOME": str(tmp_path),
           "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(python), str(tmp_path / "check.py"), str(path),
                        str(tmp_path / "io.safetensors")], capture_output=True, text=True,
                       timeout=300, env=env, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"transformers": version, "class": "DFlashDraftModel", "same_names": True,
                   "weights_equal": True, "outputs_equal": True}, (got, r.stderr[-1000:])


# --- a killed checkpoint writer -------------------------------------------------------------

_KILLED_SAVE = """
import dataclasses, sys, time, torch
from remote_payload.trainer import checkpoint
from remote_payload.trainer.config import preset
from remote_payload.trainer.model import Drafter
cfg = preset("tiny", draft_layers=2, feature_layers=2)
d = Drafter(cfg, "sdpa")
real = checkpoint.make_readable
def stall(paths):
    real(paths)
    print("written", flush=True)
    time.sleep(600)
checkpoint.make_readable = stall
checkpoint.save(sys.argv[1], 2, d, torch.optim.AdamW(d.parameters()),
                {"cfg": dataclasses.asdict(cfg)})
"""


def test_a_checkpoint_killed_mid_write_leaves_latest_loadable_and_its_temporary_is_removed(
        exported, tmp_path, monkeypatch):
    path, _, _ = exported
    run = tmp_path / "run"
    subprocess.run(["cp", "-a", str(path.parent / "run"), str(run)], check=True)
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, str(run)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "written\n"
    finally:
        proc.kill()
        proc.wait()
    (stale,) = [p for p in run.iterdir() if p.name.startswith(".ckpt-0000002.")]
    assert checkpoint.resolve("auto", str(run)).name == "ckpt-0000001"
    evaluate.load_drafter(str(run), torch.device("cpu"))
    monkeypatch.setattr(safe_write, "STALE_AFTER_S", 0.0)
    d, cfg = _drafter()
    checkpoint.save(str(run), 2, d, torch.optim.AdamW(d.parameters()),
                    {"cfg": dataclasses.asdict(cfg)})
    assert not stale.exists()
    assert checkpoint.resolve("auto", str(run)).name == "ckpt-0000002"
    evaluate.load_drafter(str(run), torch.device("cpu"))
