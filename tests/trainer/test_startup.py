"""Start-up and wind-down of the trainer: the target built without transformers and
the meta-device drafter draw exactly what the eager builds drew, RoPE gives transformers' tables,
a checkpoint directory loads straight to the device with the same tensors transformers reads,
the run says when each start-up phase ended, and ``done`` comes only after a durable, loadable
final checkpoint."""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.paths import REPO
from tests.waiting import wait_for

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from remote_payload import wire  # noqa: E402
from remote_payload.trainer import checkpoint, safetensors_reader  # noqa: E402
from remote_payload.trainer import target as T  # noqa: E402
from remote_payload.trainer import target_weights as TW  # noqa: E402
from remote_payload.trainer.config import TrainerConfigError, preset  # noqa: E402
from remote_payload.trainer.model import Drafter, build_drafter  # noqa: E402
from remote_payload.trainer.train import _StopFlag, main  # noqa: E402

CPU = torch.device("cpu")
FAST = ["--preset", "tiny", "--device", "cpu", "--attn", "sdpa", "--compile", "off",
        "--seq-buckets", "48", "--token-budget", "192", "--log-every", "1"]
#: the trainer at the base commit of the start-up work, for the loss comparison
BASELINE_COMMIT = "00924ac"


@pytest.fixture(autouse=True)
def _fresh_stop_flag():
    _StopFlag.requested, _StopFlag.signame = False, ""
    yield
    _StopFlag.requested, _StopFlag.signame = False, ""


def _eager_target(cfg, dtype, seed, body):
    """The random target exactly as ``build_target`` built it at the base commit of the start-up work."""
    from transformers import Qwen3ForCausalLM

    hf_cfg = T.qwen3_config(cfg, layers=None if body else 1)
    hf_cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed + 1_000_003)
    with T._default_dtype(dtype), torch.device(CPU), torch.no_grad():
        model = Qwen3ForCausalLM(hf_cfg)
        g = torch.Generator(device=CPU).manual_seed(seed + 17)
        std = 2.0 / cfg.hidden_size ** 0.5
        emb = model.get_input_embeddings().weight
        emb.normal_(0.0, std, generator=g)
        head = model.get_output_embeddings().weight
        if head.data_ptr() != emb.data_ptr():
            head.normal_(0.0, std, generator=g)
    return model


def _differing(a, b) -> list[str]:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return [k for k in sa if sa[k].dtype != sb[k].dtype or not torch.equal(sa[k], sb[k])]


def _as_state(w: TW.TargetWeights, cfg) -> dict[str, torch.Tensor]:
    """``random_weights``' fused tensors under transformers' names, split back."""
    nh, nkv, hd, i = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    out = {"model.embed_tokens.weight": w.embed}
    if w.head is not w.embed:
        out["lm_head.weight"] = w.head
    for n, lw in enumerate(w.layers):
        q, k, v = lw.qkv.split([nh * hd, nkv * hd, nkv * hd])
        gate, up = lw.gate_up.split([i, i])
        out.update({f"model.layers.{n}.{name}.weight": x for name, x in (
            ("self_attn.q_proj", q), ("self_attn.k_proj", k), ("self_attn.v_proj", v),
            ("self_attn.o_proj", lw.o), ("self_attn.q_norm", lw.q_norm),
            ("self_attn.k_norm", lw.k_norm), ("mlp.gate_proj", gate), ("mlp.up_proj", up),
            ("mlp.down_proj", lw.down), ("input_layernorm", lw.in_norm),
            ("post_attention_layernorm", lw.post_norm))})
    return out


def _differing_from(model, state: dict[str, torch.Tensor], skip: str = "model.norm.") -> list[str]:
    """transformers' tensors that ``state`` lacks or holds differently (the final norm is
    never used by the features: the fused target keeps no copy)."""
    ref = {k: v for k, v in model.state_dict().items() if not k.startswith(skip)}
    if model.config.tie_word_embeddings:
        ref.pop("lm_head.weight", None)
    return sorted(k for k, v in ref.items()
                  if k not in state or state[k].dtype != v.dtype or not torch.equal(state[k], v))


class TestTheTargetWithoutTransformers:
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    def test_draws_every_target_weight_the_eager_build_drew(self, dtype):
        cfg = preset("tiny")
        eager = _eager_target(cfg, dtype, seed=3, body=True)
        ours = TW.random_weights(cfg, CPU, dtype, seed=3, body=True)
        assert _differing_from(eager, _as_state(ours, cfg)) == []

    def test_draws_the_tied_target_the_eager_build_drew(self):
        cfg = preset("tiny", tie_embeddings=True)
        ours = TW.random_weights(cfg, CPU, torch.float32, 0, True)
        assert ours.head is ours.embed
        assert _differing_from(_eager_target(cfg, torch.float32, 0, True), _as_state(ours, cfg)) == []

    def test_gives_a_split_drafter_rank_the_eager_embedding_and_head_and_no_layer(self):
        cfg = preset("tiny")
        eager = _eager_target(cfg, torch.float32, seed=2, body=False)
        ours = TW.random_weights(cfg, CPU, torch.float32, seed=2, body=False)
        assert ours.layers == []
        assert torch.equal(ours.embed, eager.get_input_embeddings().weight)
        assert torch.equal(ours.head, eager.get_output_embeddings().weight)

    def test_leaves_the_generators_where_the_eager_build_left_them(self):
        cfg = preset("tiny")
        _eager_target(cfg, torch.float32, seed=4, body=True)
        after_eager = torch.rand(4)
        TW.random_weights(cfg, CPU, torch.float32, seed=4, body=True)
        assert torch.equal(torch.rand(4), after_eager)

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("theta", [10_000.0, 1_000_000.0])
    def test_makes_transformers_rope_tables(self, dtype, theta):
        cfg = preset("tiny", rope_theta=theta, head_dim=32)
        model = _eager_target(cfg, dtype, seed=0, body=False).to(dtype)  # as the trainer did
        x = torch.zeros(2, 300, cfg.hidden_size, dtype=dtype)
        pos = torch.arange(300).unsqueeze(0).expand(2, -1)
        want = model.model.rotary_emb(x, pos)
        got = TW.Rope(TW.default_inv_freq(cfg, CPU).to(dtype))(x, pos)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))

    def test_names_every_tensor_transformers_has(self):
        cfg = preset("tiny")
        model = _eager_target(cfg, torch.float32, seed=0, body=True)
        assert TW.layout(cfg) == {k: tuple(v.shape) for k, v in model.state_dict().items()}

    def test_imports_nothing_of_transformers_to_build_and_run_the_fused_target(self):
        code = ("import sys, torch; from remote_payload.trainer.config import preset; "
                "from remote_payload.trainer.target import build_target; "
                "t = build_target(preset('tiny'), torch.device('cpu'), torch.float32); "
                "t.features(torch.zeros(1, 8, dtype=torch.long)); "
                "print(sorted(m for m in sys.modules if m.startswith('transformers')))")
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "[]"


class TestTheTargetsCompileOptions:
    """The options that keep the target's tuned kernel configs across restarts (torch 2.11 lost
    them on two paths: ``target.TARGET_COMPILE_OPTIONS`` says which)."""

    def test_are_options_this_torch_knows(self):
        import torch._inductor.config as inductor_config

        with inductor_config.patch(T.TARGET_COMPILE_OPTIONS):  # raises on an unknown knob
            assert inductor_config.compile_threads == 1

    def test_are_what_the_target_compiles_with_and_leave_the_process_settings_alone(
            self, monkeypatch):
        import torch._inductor.config as inductor_config

        seen: dict = {}
        monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.update(kw) or fn)
        threads = inductor_config.compile_threads
        T.build_target(preset("tiny"), CPU, torch.float32).compile()
        assert seen == {"dynamic": False, "options": T.TARGET_COMPILE_OPTIONS}
        assert seen["options"] is not T.TARGET_COMPILE_OPTIONS  # a copy: torch may keep it
        assert inductor_config.compile_threads == threads


class TestTheMetaBuild:
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("body", [True, False])
    def test_draws_every_reference_weight_and_buffer_the_eager_build_drew(self, dtype, body):
        cfg = preset("tiny")
        eager = _eager_target(cfg, dtype, seed=3, body=body)
        meta = T._materialize_random(cfg, CPU, dtype, seed=3, body=body)
        assert _differing(eager, meta) == []
        buffers = dict(meta.named_buffers())
        assert [n for n, b in eager.named_buffers() if not torch.equal(b, buffers[n])] == []

    def test_draws_every_drafter_weight_the_eager_build_drew_and_leaves_the_rng_alike(self):
        cfg = preset("tiny")
        torch.manual_seed(11)
        eager = Drafter(cfg, "sdpa")
        after_eager = torch.rand(4)
        meta = build_drafter(cfg, "sdpa", CPU, 11)
        assert _differing(eager, meta) == []
        assert torch.equal(torch.rand(4), after_eager)  # what is drawn next is the same too

    def test_keeps_no_tensor_on_the_meta_device(self):
        target = T.build_target(preset("tiny"), CPU, torch.float32)
        drafter = build_drafter(preset("tiny"), "sdpa", CPU, 0)
        for m in (target, drafter):
            assert {p.device.type for p in [*m.parameters(), *m.buffers()]} == {"cpu"}


class TestTheCheckpointLoader:
    @pytest.fixture(scope="class")
    def ckpt(self, tmp_path_factory):
        out = tmp_path_factory.mktemp("target")
        T.save_target(T._materialize_random(preset("tiny"), CPU, torch.bfloat16, 5, True), str(out))
        return out

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    def test_reads_the_tensors_transformers_reads(self, ckpt, dtype):
        from transformers import Qwen3ForCausalLM

        cfg = preset("tiny", target_layer_ids=(1, 5))  # the deepest layer: every layer is read
        ref = Qwen3ForCausalLM.from_pretrained(str(ckpt), dtype=dtype)
        ours, rope, _shape, _read = T._load_checkpoint(cfg, str(ckpt), CPU, dtype, body=True)
        assert _differing_from(ref, _as_state(ours, cfg)) == []
        x, pos = torch.zeros(1, 64, cfg.hidden_size, dtype=dtype), torch.arange(64).unsqueeze(0)
        assert all(torch.equal(a, b) for a, b in zip(rope(x, pos), ref.model.rotary_emb(x, pos),
                                                     strict=True))

    def test_reads_no_layer_past_the_deepest_feature_layer_and_counts_what_it_read(self, ckpt):
        cfg = preset("tiny")
        ours, _rope, _shape, read = T._load_checkpoint(cfg, str(ckpt), CPU, torch.float32, True)
        assert len(ours.layers) == max(cfg.target_layer_ids) + 1
        size = (ckpt / "model.safetensors").stat().st_size
        kept = sum(v.numel() * 2 for k, v in safetensors_reader.load(ckpt, CPU).items()
                   if not k.startswith("model.layers.") or int(k.split(".")[2]) < len(ours.layers))
        assert kept <= read < size

    def test_gives_a_split_drafter_rank_the_embedding_and_head_only(self, ckpt):
        full = T.build_target(preset("tiny"), CPU, torch.bfloat16, path=str(ckpt))
        head_only = T.build_target(preset("tiny"), CPU, torch.bfloat16, path=str(ckpt), body=False)
        assert torch.equal(full.head_weight, head_only.head_weight)
        assert torch.equal(full.embed.weight, head_only.embed.weight)
        assert head_only.fused is None and head_only.rope is None

    def test_computes_the_features_transformers_computes(self, ckpt):
        fused = T.build_target(preset("tiny"), CPU, torch.float32, path=str(ckpt))
        ref = T.build_target(preset("tiny"), CPU, torch.float32, path=str(ckpt), fused=False)
        ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(fused.features(ids), ref.features(ids), rtol=1e-5, atol=1e-5)

    @pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
    def test_names_a_damaged_checkpoint_in_one_line(self, ckpt, tmp_path, damage):
        bad = tmp_path / "bad"
        shutil.copytree(ckpt, bad)
        f = bad / "model.safetensors"
        data = f.read_bytes()
        f.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\xff" * 64,
                       "empty": b""}[damage])
        with pytest.raises(TrainerConfigError, match="--target-path"):
            T.build_target(preset("tiny"), CPU, torch.float32, path=str(bad))

    def test_names_a_directory_without_safetensors(self, ckpt, tmp_path):
        shutil.copy(ckpt / "config.json", tmp_path / "config.json")
        with pytest.raises(TrainerConfigError, match=r"no \*\.safetensors"):
            T.build_target(preset("tiny"), CPU, torch.float32, path=str(tmp_path))

    def test_names_tensors_that_do_not_fit_the_config(self, ckpt, tmp_path):
        bad = _edited(ckpt, tmp_path, lambda c: c.update(intermediate_size=c["intermediate_size"] * 2))
        with pytest.raises(TrainerConfigError, match="misshapen"):
            T.build_target(preset("tiny"), CPU, torch.float32, path=str(bad))

    @pytest.mark.parametrize(("edit", "says"), [
        (lambda c: c.update(use_sliding_window=True), "sliding-window"),
        (lambda c: c.update(hidden_size="64"), "hidden_size is '64'"),
        (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers is None"),
        (lambda c: c.update(rms_norm_eps=-1), "rms_norm_eps is -1"),
        (lambda c: c.update(num_attention_heads=3), r"config\.json: num_heads \(3\)"),
        (lambda c: c.update(tie_word_embeddings="false"), "not true or false"),
    ])
    def test_names_a_config_it_cannot_build_in_one_line(self, ckpt, tmp_path, edit, says):
        bad = _edited(ckpt, tmp_path, edit)
        with pytest.raises(TrainerConfigError, match=says):
            T.build_target(preset("tiny"), CPU, torch.float32, path=str(bad))

    @pytest.mark.parametrize("text", ["", "{", "[1, 2]", "\xff\xfe", "null"])
    def test_names_an_unreadable_config_json(self, ckpt, tmp_path, text):
        bad = tmp_path / "bad"
        shutil.copytree(ckpt, bad)
        (bad / "config.json").write_bytes(text.encode("latin-1"))
        with pytest.raises(TrainerConfigError, match=r"config\.json"):
            T.build_target(preset("tiny"), CPU, torch.float32, path=str(bad))

    def test_names_attention_biases(self, ckpt, tmp_path):
        from safetensors.torch import load_file, save_file

        bad = tmp_path / "bad"
        shutil.copytree(ckpt, bad)
        state = load_file(str(bad / "model.safetensors"))
        state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64, dtype=torch.bfloat16)
        save_file(state, str(bad / "model.safetensors"))
        with pytest.raises(TrainerConfigError, match="attention biases"):
            T.build_target(preset("tiny"), CPU, torch.float32, path=str(bad))


#: a config.json value of any JSON type (flat: a nested one is refused the same way)
_LEAF = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6)
_JSON = _LEAF | st.lists(_LEAF, max_size=2) | st.dictionaries(st.text(max_size=6), _LEAF, max_size=2)
_KEYS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "intermediate_size", "rope_theta", "rms_norm_eps",
         "tie_word_embeddings", "rope_parameters", "rope_scaling"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_KEYS), _JSON | st.integers(1, 64)))
def test_a_config_json_of_any_content_gives_a_shape_or_one_named_error(raw):
    try:
        shape = T.config_from_raw(raw, preset("tiny"), "/ckpt")
    except TrainerConfigError as e:
        assert "/ckpt" in str(e) and "\n" not in str(e)
    else:
        assert all(shape[k] >= 1 for k in ("vocab_size", "hidden_size", "num_heads", "head_dim"))


def _edited(ckpt: pathlib.Path, tmp_path: pathlib.Path, edit) -> pathlib.Path:
    import json

    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    cfg = json.loads((bad / "config.json").read_text())
    edit(cfg)
    (bad / "config.json").write_text(json.dumps(cfg))
    return bad


class _Recorder:
    """A stdout that notes, in order, each event line and each fsync of a checkpoint."""

    def __init__(self, order: list[str]):
        self.order, self.text = order, []

    def write(self, s: str) -> int:
        self.text.append(s)
        ev = wire.parse_event(s)
        if ev is not None:
            self.order.append(f"event:{ev['event']}")
        return len(s)

    def flush(self) -> None:
        pass

    def reconfigure(self, **_kw) -> None:
        pass


class TestTheRun:
    def test_says_done_only_after_the_final_checkpoint_is_durable_and_loadable(
            self, tmp_path, monkeypatch):
        order: list[str] = []
        real = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: (
            order.append(f"fsync:{pathlib.Path(os.readlink(f'/proc/self/fd/{fd}')).name}"),
            real(fd)))
        out = _Recorder(order)
        monkeypatch.setattr(sys, "stdout", out)
        assert main([*FAST, "--steps", "3", "--out-dir", str(tmp_path)]) == 0
        done = order.index("event:done")
        assert "fsync:latest" not in order  # the pointer's temporary name is fsynced
        synced = [o for o in order[:done] if o.startswith("fsync:")]
        assert {"fsync:model.safetensors", "fsync:optim.pt", "fsync:meta.json",
                f"fsync:{tmp_path.name}"} <= set(synced), order
        assert any(o.startswith("fsync:.ckpt-0000003.") for o in synced), order
        assert any(o.startswith("fsync:.latest.") for o in synced), order
        assert not [o for o in order[done:] if o.startswith("fsync:")]
        events = [e for e in map(wire.parse_event, "".join(out.text).splitlines()) if e]
        final = next(e for e in events if e["event"] == "done")
        assert final["step"] == 3 and final["ckpt_s"] >= 0 and final["shutdown_s"] >= 0
        path = checkpoint.resolve("auto", str(tmp_path))
        assert path is not None and path.name == "ckpt-0000003"
        assert checkpoint.read_meta(path)["step"] == 3
        from safetensors.torch import load_file

        assert load_file(str(path / "model.safetensors"))

    def test_a_latest_link_in_the_out_dir_is_one_line_and_exit_2_never_written_through(
            self, capsys, tmp_path):
        victim = tmp_path / "victim"
        victim.write_text("keep\n")
        out = tmp_path / "run"
        out.mkdir()
        (out / "latest").symlink_to(victim)
        assert main([*FAST, "--steps", "1", "--out-dir", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == f"error: {out}/latest: is a symbolic link; not followed, nothing written"
        assert victim.read_text() == "keep\n"

    def test_every_event_of_a_run_has_the_shape_the_wire_defines(self, capsys, tmp_path):
        from remote_payload.wire_shapes import event_problem

        assert main([*FAST, "--steps", "2", "--out-dir", str(tmp_path)]) == 0
        events = [e for e in map(wire.parse_event, capsys.readouterr().out.splitlines()) if e]
        assert {"step", "checkpoint", "done"} <= {e["event"] for e in events}
        assert [(e, event_problem(e)) for e in events if event_problem(e)] == []

    def test_tells_when_each_start_up_phase_ended_once_in_order(self, capsys, tmp_path):
        assert main([*FAST, "--steps", "2", "--out-dir", str(tmp_path)]) == 0
        events = [e for e in map(wire.parse_event, capsys.readouterr().out.splitlines()) if e]
        startup = [e for e in events if e["event"] == "startup"]
        assert len(startup) == 1, startup
        s = startup[0]
        assert 0 < s["pg_ready_at"] <= s["target_built_at"] <= s["drafter_built_at"] \
            <= s["first_step_at"], s
        assert "load_gb_per_s" not in s and "drafter_compile_s" not in s  # random, no compile

    def test_tells_when_a_resumed_run_had_its_checkpoint_back(self, capsys, tmp_path):
        assert main([*FAST, "--steps", "1", "--out-dir", str(tmp_path)]) == 0
        capsys.readouterr()
        assert main([*FAST, "--steps", "2", "--resume", "auto", "--out-dir", str(tmp_path)]) == 0
        events = [e for e in map(wire.parse_event, capsys.readouterr().out.splitlines()) if e]
        s = next(e for e in events if e["event"] == "startup")
        assert s["drafter_built_at"] <= s["resumed_at"] <= s["first_step_at"], s

    def test_reports_the_read_rate_of_a_target_checkpoint(self, capsys, tmp_path):
        ckpt = tmp_path / "target"
        T.save_target(T._materialize_random(preset("tiny"), CPU, torch.float32, 0, True), str(ckpt))
        assert main([*FAST, "--steps", "1", "--target-path", str(ckpt),
                     "--out-dir", str(tmp_path / "out")]) == 0
        events = [e for e in map(wire.parse_event, capsys.readouterr().out.splitlines()) if e]
        s = next(e for e in events if e["event"] == "startup")
        assert s["load_gb"] > 0 and s["load_gb_per_s"] > 0 and s["load_s"] > 0


_KILL_MID_WRITE = r"""
import pathlib, sys, time, torch
from remote_payload.trainer import checkpoint
out = sys.argv[1]
model = torch.nn.Linear(4, 4)
opt = torch.optim.AdamW(model.parameters())
checkpoint.save(out, 1, model, opt, {"run_id": "r"})
real = torch.save
def stuck(obj, f, *a, **k):
    real(obj, f, *a, **k)
    pathlib.Path(out, "writing").touch()
    time.sleep(600)  # the parent kills us here, mid-checkpoint
torch.save = stuck
checkpoint.save(out, 2, model, opt, {"run_id": "r"})
"""


def test_a_kill_during_the_write_leaves_the_previous_checkpoint(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _KILL_MID_WRITE, str(tmp_path)], env=env)
    try:
        wait_for(lambda: (tmp_path / "writing").exists() or proc.poll() is not None,
                 timeout=60, what="the second checkpoint's write")
        assert proc.poll() is None, "the writer ended before it was killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    path = checkpoint.resolve("auto", str(tmp_path))
    assert path is not None and path.name == "ckpt-0000001"
    model = torch.nn.Linear(4, 4)
    assert checkpoint.load(path, model, torch.optim.AdamW(model.parameters()), CPU)["step"] == 1
    assert not (tmp_path / "ckpt-0000002").exists()


def _baseline_tree(dest: pathlib.Path) -> pathlib.Path | None:
    """``remote_payload`` at :data:`BASELINE_COMMIT`, or None without git or that commit."""
    try:
        blob = subprocess.run(["git", "-C", str(REPO), "archive", BASELINE_COMMIT, "remote_payload"],
                              capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _losses(root: pathlib.Path, out: pathlib.Path) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "remote_payload.trainer", *FAST, "--steps", "4",
                           "--out-dir", str(out)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [e for e in map(wire.parse_event, proc.stdout.splitlines()) if e]
    return [e["loss"] for e in events if e["event"] == "step"]


def test_the_loss_curve_is_the_one_the_trainer_had_before(tmp_path):
    base = _baseline_tree(tmp_path / "baseline")
    if base is None:
        pytest.skip(f"no git checkout with commit {BASELINE_COMMIT}")
    before = _losses(base, tmp_path / "before")
    after = _losses(REPO, tmp_path / "after")
    assert len(after) == 4 and after == before


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("startup_bench", REPO / "benchmarks" / "startup.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_reads_the_phases_of_either_code_from_arrival_times():
    bench = _bench()
    ev = wire.format_event
    lines = [(1.0, ev("phase", phase="loading", torch="2.11.0+cu130")),
             (2.0, ev("phase", phase="loading", detail="process groups ready")),
             (5.0, "dflash trainer: preset qwen3-8b, ..."),
             (9.0, ev("compile", name="target_features", seconds=3.5)),
             (14.0, ev("compile", name="drafter_step", seconds=4.0)),
             (14.5, ev("step", step=1)),
             (14.6, ev("startup", pg_ready_at=2.5, target_built_at=4.5, first_step_at=15.0)),
             (15.5, ev("step", step=2)), (16.0, "not an event"),
             (19.5, ev("done", step=2, ckpt_s=3.0))]
    got = bench.phases(lines, exit_at=20.0)
    assert {k: got[k] for k in ("first_event", "pg_ready", "built", "target_compile_s",
                                "drafter_compile_s", "first_step", "last_step_to_done", "ckpt_s",
                                "done_to_exit", "total", "torch")} == {
        "first_event": 1.0, "pg_ready": 2.0, "built": 5.0, "target_compile_s": 3.5,
        "drafter_compile_s": 4.0, "first_step": 14.5, "last_step_to_done": 4.0, "ckpt_s": 3.0,
        "done_to_exit": 0.5, "total": 20.0, "torch": "2.11.0+cu130"}
    assert got["target_built"] == 4.0  # the trainer's own clock, shifted onto the spawn's
    base = bench.phases(lines[:6], exit_at=None)  # the old code: no startup event, no exit
    assert "target_built" not in base and "done_to_exit" not in base
    md = bench.table({"base warm": base, "new warm": got})
    assert md.splitlines()[0] == "| phase | base warm | new warm |"
    assert "| target + drafter built (s after spawn) | 5.00 | 5.00 |" in md


def test_the_benchmark_refuses_a_baseline_without_the_trainer(tmp_path, capsys):
    bench = _bench()
    with pytest.raises(SystemExit) as e:
        bench.parse(["--baseline", str(tmp_path), "--out", str(tmp_path / "o.json")])
    assert e.value.code == 2 and "no remote_payload/trainer" in capsys.readouterr().err
    (tmp_path / "remote_payload" / "trainer").mkdir(parents=True)
    for bad in (["--modes", "hot"], ["--base-modes", "cold,hot"], ["--steps", "1"]):
        with pytest.raises(SystemExit):
            bench.parse(["--baseline", str(tmp_path), "--out", str(tmp_path / "o.json"), *bad])
