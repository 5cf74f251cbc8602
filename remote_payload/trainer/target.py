"""The frozen Qwen3 target: built with random weights from a preset shape, or loaded
from a local checkpoint directory (never from the hub), and run only as deep as the
drafter's deepest feature layer.

Its feature forward is 72 % of a training step on an H200, and a quarter of that was
unfused elementwise work in transformers' eager layers (RMSNorm, RoPE, SiLU, residual
adds). So the target runs through :class:`FusedLayer`: the same arithmetic as
``Qwen3DecoderLayer`` with the q/k/v and gate/up projections each fused into one matmul,
written as one pure function of (hidden, weights) so that ``torch.compile`` traces it once
per shape and every layer reuses that graph (a 36-layer unrolled graph would compile
~30x longer for the same kernels). transformers' own forward stays the reference
(``fused=False``) and the equality test's yardstick. ``precision="fp8"`` (opt-in) stores the
four matmul weights as row-scaled e4m3 (:mod:`.fp8`): the same layer at ~1.6x the speed on an
H200, its features carrying FP8's rounding (docs/trainer-performance.md, "2026-11-30, night", says how much).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import typing as t

import torch
import torch.nn.functional as F
from torch import nn

from . import fp8, safetensors_reader
from .config import TARGET_PRECISIONS, DrafterConfig, TrainerConfigError
from .target_weights import (
    GLOBAL_SEED_OFFSET,
    HEAD_SEED_OFFSET,
    LayerWeights,
    Rope,
    TargetWeights,
    default_inv_freq,
    fuse_layer,
    layout,
    random_weights,
)

#: a matmul weight of :class:`FusedLayer`: the bf16 tensor, or its FP8 codes and scales
Weight = torch.Tensor | fp8.Fp8Weight

_MATMULS = ("qkv", "o", "gate_up", "down")  # the weights --target-precision applies to


#: inductor options of the target's per-layer graph (docs/trainer-performance.md, "2026-12-02:
#: the target's tuned kernel configs survive a restart", has the measurements).
#:
#: - ``coordinate_descent_tuning``: tuned launch configs for the norm/RoPE reductions (0.48 ->
#:   0.30 ms per layer on an H200, ~8 ms a step; the first compile takes ~5 s longer):
#:   benchmarks/trainer_knobs.py. The tuned configs are cached, but two paths of torch 2.11
#:   drop them when a warm start, or a container seeded by ``opsctl cache seed``, loads the
#:   graph, and the tuning then runs again (2.7-6 s):
#: - ``use_static_cuda_launcher`` off: the static launcher ignores the config cached for a
#:   kernel of one heuristic config (``CachingAutotuner.recheck_autotune_cache`` wants two or
#:   more); Triton's own launcher reads it.
#: - ``compile_threads`` 1: a kernel built in a compile worker reaches this process pickled,
#:   and ``triton.Config.__setstate__`` keeps only its own fields, so the config loses inductor's
#:   ``found_by_coordesc`` mark and is tuned again. In this process it keeps the mark. The
#:   graph has a handful of kernels: its cold compile took 13.8 s so, 14.9-17.1 s before.
TARGET_COMPILE_OPTIONS: dict[str, t.Any] = {"coordinate_descent_tuning": True,
                                            "use_static_cuda_launcher": False,
                                            "compile_threads": 1}


class _Stop(Exception):
    """Raised by the last feature hook: the layers after it are not needed."""


def config_from_dir(path: str, base: DrafterConfig) -> dict[str, t.Any]:
    """Shape overrides read from ``path/config.json`` (so a real checkpoint wins over a preset).

    Raises:
        TrainerConfigError: no config.json, or one that does not describe a Qwen3 shape.
    """
    return config_from_raw(_read_config(pathlib.Path(path)), base, path)


def config_from_raw(c: dict[str, t.Any], base: DrafterConfig, path: str) -> dict[str, t.Any]:
    """The target-shape fields of a parsed config.json (``base`` fills what it leaves out).

    Raises:
        TrainerConfigError: a shape field missing, of the wrong type, or out of range.
    """
    def count(v: t.Any, key: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 24:
            raise TrainerConfigError(f"--target-path {path}: config.json {key} is {v!r}, "
                                     "not a positive integer")
        return v

    def real(v: t.Any, key: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise TrainerConfigError(f"--target-path {path}: config.json {key} is {v!r}, "
                                     "not a positive number")
        return float(v)

    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    tied = c.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):  # "false" must not read as true
        raise TrainerConfigError(f"--target-path {path}: config.json tie_word_embeddings is "
                                 f"{tied!r}, not true or false")
    heads = count(c.get("num_attention_heads"), "num_attention_heads")
    hidden = count(c.get("hidden_size"), "hidden_size")
    return {
        "vocab_size": count(c.get("vocab_size"), "vocab_size"), "hidden_size": hidden,
        "target_layers": count(c.get("num_hidden_layers"), "num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": count(c.get("num_key_value_heads", heads), "num_key_value_heads"),
        "head_dim": count(c.get("head_dim") or hidden // heads, "head_dim"),
        "intermediate_size": count(c.get("intermediate_size"), "intermediate_size"),
        "rope_theta": real(theta if theta is not None else c.get("rope_theta", base.rope_theta),
                           "rope_theta"),
        "rms_eps": real(c.get("rms_norm_eps", base.rms_eps), "rms_norm_eps"),
        "tie_embeddings": tied,
    }


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> t.Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``Qwen3RMSNorm``: fp32 statistics, cast back before the weight (same rounding)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def _linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    return fp8.linear(x, w) if isinstance(w, fp8.Fp8Weight) else F.linear(x, w)


def fused_layer_forward(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        w: tuple[t.Any, ...], heads: tuple[int, int, int],
                        eps: float) -> torch.Tensor:
    """One Qwen3 decoder layer, causal, no cache. h (B, S, H); cos/sin (B, S, hd);
    ``w`` = (in_norm, qkv, q_norm, k_norm, o, post_norm, gate_up, down) as in
    :class:`FusedLayer` (each matmul weight a tensor or an :class:`fp8.Fp8Weight`);
    ``heads`` = (query heads, kv heads, head dim)."""
    in_norm, qkv_w, q_norm, k_norm, o_w, post_norm, gate_up_w, down_w = w
    nh, nkv, hd = heads
    b, s, _ = h.shape
    qkv = _linear(_rms(h, in_norm, eps), qkv_w)
    q, k, v = qkv[..., :nh * hd], qkv[..., nh * hd:(nh + nkv) * hd], qkv[..., (nh + nkv) * hd:]
    q = _rms(q.view(b, s, nh, hd), q_norm, eps).transpose(1, 2)  # (B, nh, S, hd)
    k = _rms(k.view(b, s, nkv, hd), k_norm, eps).transpose(1, 2)  # (B, nkv, S, hd)
    v = v.view(b, s, nkv, hd).transpose(1, 2)
    c, sn = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = _rotate(q, c, sn), _rotate(k, c, sn)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=hd ** -0.5,
                                       enable_gqa=nh != nkv)
    h = h + _linear(a.transpose(1, 2).reshape(b, s, nh * hd), o_w)
    gate, up = _linear(_rms(h, post_norm, eps), gate_up_w).chunk(2, dim=-1)
    return h + _linear(F.silu(gate) * up, down_w)


class FusedLayer(nn.Module):
    """A frozen Qwen3 decoder layer's weights, q/k/v and gate/up concatenated (buffers:
    nothing here trains). ``precision="fp8"``: the four matmul weights as e4m3 codes
    (``<name>``) and per-row scales (``<name>_scale``)."""

    def __init__(self, w: LayerWeights, heads: tuple[int, int, int], eps: float,
                 precision: str = "bf16"):
        super().__init__()
        self.eps, self.heads = float(eps), heads
        for name, tensor in w._asdict().items():
            if precision == "fp8" and name in _MATMULS:
                codes, scale = fp8.quantize_weight(tensor.detach())
                self.register_buffer(name, codes, persistent=False)
                self.register_buffer(name + "_scale", scale, persistent=False)
            else:
                self.register_buffer(name, tensor.detach(), persistent=False)
        self.precision = precision

    def weights(self) -> tuple[Weight, ...]:
        def get(n: str) -> Weight:
            w = t.cast(torch.Tensor, getattr(self, n))
            if self.precision == "fp8" and n in _MATMULS:
                return fp8.Fp8Weight(w, t.cast(torch.Tensor, getattr(self, n + "_scale")))
            return w

        return tuple(get(n) for n in LayerWeights._fields)


class Target(nn.Module):
    """The frozen target: ``features(ids)`` returns the concatenated hidden states of the
    feature layers, (B, S, L*H), L = ``len(layer_ids)``; :attr:`embed` and :attr:`head_weight`
    are what the drafter shares.

    Built by :func:`build_target`, one of two ways:

    * fused (the trainer's path): the layers up to the deepest feature layer as
      :class:`FusedLayer` (``fused``), the embedding, the head and RoPE, and nothing of
      transformers; :meth:`compile` makes the per-layer function a compiled one (one graph per
      input shape, shared by all layers). ``fused`` is None on a rank that keeps no layer.
    * reference (``fused=False``): transformers' own model and forward, the feature layers'
      outputs caught by hooks (the yardstick of the equality tests and benchmarks)."""

    def __init__(self, embed: nn.Embedding, head_weight: torch.Tensor, layer_ids: t.Sequence[int],
                 rope: nn.Module | None = None, fused: t.Sequence[FusedLayer] | None = None,
                 reference: t.Any = None, read_bytes: int = 0):
        super().__init__()
        self.embed = embed.requires_grad_(False)
        self.read_bytes = read_bytes  # from a checkpoint: the bytes read (the read rate counts these)
        self.head_weight = head_weight
        self.layer_ids = tuple(layer_ids)
        self.rope = rope
        self.fused: nn.ModuleList | None = nn.ModuleList(fused) if fused else None
        self._layer_fn: t.Callable[..., torch.Tensor] = fused_layer_forward
        # transformers' model (reference only): its submodules are dynamic attributes
        self.model: t.Any = reference
        self._captured: dict[int, torch.Tensor] = {}
        self._active = False  # hooks only act inside features(), not on plain model calls
        if reference is not None:
            last = max(self.layer_ids, default=-1)
            for i in set(self.layer_ids):
                reference.model.layers[i].register_forward_hook(self._hook(i, stop=i == last))

    def compile(self, **kwargs: t.Any) -> None:
        """Compile the per-layer function (``dynamic=False``: one graph per bucket shape).

        The first :meth:`features` call of each shape compiles; callers run it under
        :func:`remote_payload.compile_guard.serialized_compile` like the drafter's step."""
        if self.fused is None:
            return
        import torch._dynamo

        # every layer calls the same function with the same shapes: one cache entry per
        # shape, so the limit needs to cover the buckets, not the layers
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 64))
        if "mode" not in kwargs:  # torch.compile takes a mode or options, not both
            kwargs.setdefault("options", dict(TARGET_COMPILE_OPTIONS))
        self._layer_fn = t.cast(t.Callable[..., torch.Tensor],
                                torch.compile(fused_layer_forward, dynamic=False, **kwargs))

    def _hook(self, i: int, stop: bool) -> t.Callable[..., None]:
        def hook(_mod: nn.Module, _args: t.Any, out: t.Any) -> None:
            if not self._active:
                return
            self._captured[i] = out[0] if isinstance(out, tuple) else out
            if stop:
                raise _Stop

        return hook

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.model is None:
            return self._fused_features(input_ids)
        self._captured.clear()
        self._active = True
        try:
            self.model.model(input_ids=input_ids, use_cache=False)
        except _Stop:
            pass
        finally:
            self._active = False
        feats = torch.cat([self._captured[i] for i in self.layer_ids], dim=-1)
        self._captured.clear()
        return feats

    def _fused_features(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.fused is None or self.rope is None:
            raise RuntimeError("features() on a target that keeps no layer (a split drafter rank)")
        h = self.embed(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        pos = pos.expand(input_ids.shape[0], -1)
        cos, sin = self.rope(h, pos)
        wanted = set(self.layer_ids)
        out: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.fused):
            lay = t.cast(FusedLayer, layer)
            h = self._layer_fn(h, cos, sin, lay.weights(), lay.heads, lay.eps)
            if i in wanted:
                out[i] = h
        # one (B, S, L*H) copy of the L feature outputs: ~1 ms of a ~1 s forward on an H200
        return torch.cat([out[i] for i in self.layer_ids], dim=-1)


def build_target(cfg: DrafterConfig, device: torch.device, dtype: torch.dtype,
                 path: str | None = None, seed: int = 0, body: bool = True,
                 fused: bool = True, precision: str = "bf16") -> Target:
    """Random-weight target of ``cfg``'s shape, or the checkpoint at ``path``.

    ``body=False`` keeps only the embedding and LM head (what a split drafter rank needs).
    Random embedding/head weights come from a dedicated seeded generator so that ranks
    with and without the body agree on them.

    The fused target is built without transformers (:mod:`.target_weights` says why): random
    weights are drawn on ``device`` by :func:`.target_weights.random_weights`, bit-identical to
    the eager transformers build the trainer used before (``tests/trainer/test_startup.py``); a
    checkpoint is read by :func:`.safetensors_reader.load` straight into ``device`` memory. No
    CPU copy of the weights is ever made, and only the layers up to the deepest feature layer
    are kept.
    ``fused=False`` builds transformers' own model with the same weights (the reference).

    Raises:
        TrainerConfigError: an unknown precision, or ``path`` is not a loadable checkpoint.
    """
    if precision not in TARGET_PRECISIONS:
        raise TrainerConfigError(f"target precision {precision!r}; choices: "
                                 f"{', '.join(TARGET_PRECISIONS)}")
    if precision != "bf16" and not fused:
        raise TrainerConfigError(f"target precision {precision} needs the fused target")
    layer_ids = cfg.target_layer_ids if body else ()
    if not fused:
        model = (load_causal_lm(path, device, dtype) if path is not None
                 else _materialize_random(cfg, device, dtype, seed, body).to(dtype))
        model.eval().requires_grad_(False)
        return Target(model.get_input_embeddings(), model.get_output_embeddings().weight,
                      layer_ids, reference=model)
    read_bytes = 0
    if path is not None:
        weights, rope, shape, read_bytes = _load_checkpoint(cfg, path, device, dtype, body)
    else:
        weights, shape = random_weights(cfg, device, dtype, seed, body), cfg
        # the eager build computed the tables on ``device`` and then cast the model to ``dtype``
        rope = Rope(default_inv_freq(cfg, device).to(dtype))
    last = max(layer_ids, default=-1)
    if last >= len(weights.layers):
        raise TrainerConfigError(f"feature layer {last} of a target with {len(weights.layers)} layers")
    heads = (shape.num_heads, shape.num_kv_heads, shape.head_dim)
    layers = [FusedLayer(w, heads, shape.rms_eps, precision) for w in weights.layers[:last + 1]]
    weights.layers.clear()  # the unused deeper layers are freed here
    vocab, hidden = weights.embed.shape
    embed = nn.Embedding(vocab, hidden, _weight=weights.embed, _freeze=True)
    head = (embed.weight if weights.head is weights.embed
            else nn.Parameter(weights.head, requires_grad=False))
    return Target(embed, head, layer_ids, rope if layers else None, layers or None,
                  read_bytes=read_bytes)


# --- transformers' own build of the random target: the reference and the checkpoint writer ----


def qwen3_config(cfg: DrafterConfig, layers: int | None = None) -> t.Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=layers or cfg.target_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        max_position_embeddings=32768, use_cache=False)


def _reset_all(modules: t.Iterable[nn.Module]) -> None:
    for m in modules:
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            reset()


def _materialize_random(cfg: DrafterConfig, device: torch.device, dtype: torch.dtype,
                        seed: int, body: bool) -> t.Any:
    """transformers' ``Qwen3ForCausalLM`` holding the random target's weights: what
    ``--compile``-free references (``fused=False``) run and what :func:`save_target` writes
    (benchmarks and tests make checkpoints with it). Built on meta and materialised on
    ``device``, its draws those of an eager build under ``torch.device(device)``: each
    module's own ``reset_parameters`` in construction order, then transformers' init, then the
    LM head's, then the head generator (:func:`.target_weights.random_weights` replays the
    same draws without transformers)."""
    from transformers import Qwen3ForCausalLM

    hf_cfg = qwen3_config(cfg, layers=None if body else 1)
    hf_cfg._attn_implementation = "sdpa"
    with _default_dtype(dtype), torch.device("meta"):
        model: t.Any = Qwen3ForCausalLM(hf_cfg)
    torch.manual_seed(seed + GLOBAL_SEED_OFFSET)
    with _default_dtype(dtype), torch.no_grad():
        model.to_empty(device=device)
        _reset_all(model.model.modules())
        model.model.init_weights()
        _reset_all([model.lm_head])
        model.init_weights()
        # RoPE tables are non-persistent buffers computed in the constructor: recomputed here
        rot = model.model.rotary_emb
        with torch.device(device):
            model.model.rotary_emb = type(rot)(config=model.config)
        g = torch.Generator(device=device).manual_seed(seed + HEAD_SEED_OFFSET)
        std = 2.0 / cfg.hidden_size ** 0.5
        emb = model.get_input_embeddings().weight
        emb.normal_(0.0, std, generator=g)
        head = model.get_output_embeddings().weight
        if head.data_ptr() != emb.data_ptr():
            head.normal_(0.0, std, generator=g)
    return model


# --- a checkpoint directory, read without transformers -----------------------------------------


class Loaded(t.NamedTuple):
    weights: TargetWeights
    rope: nn.Module
    shape: DrafterConfig  # the target shape config.json describes
    read_bytes: int  # bytes read from the safetensors files (what the read rate counts)


def _load_checkpoint(cfg: DrafterConfig, path: str, device: torch.device, dtype: torch.dtype,
                     body: bool) -> Loaded:
    """``path`` (a ``save_pretrained`` directory: config.json + safetensors shards) onto
    ``device``: the tensors its config.json's shape names, each read straight into ``device``
    memory; with the RoPE it asks for and that shape. ``body=False``: only the embedding and LM
    head are read. The layers past the deepest feature layer are not read at all.

    Raises:
        TrainerConfigError: not a directory, an unreadable config.json, an unsupported layout
            (attention biases, sliding windows), no safetensors, or tensors missing/misshapen.
    """
    root = pathlib.Path(path)
    if not root.is_dir():
        raise TrainerConfigError(f"--target-path {path} is not a directory")
    raw = _read_config(root)
    shape = _shape_of(raw, cfg, path)
    if raw.get("use_sliding_window") or "sliding_attention" in (raw.get("layer_types") or ()):
        raise TrainerConfigError(f"--target-path {path}: sliding-window attention is not supported")
    keep = max(cfg.target_layer_ids, default=-1) + 1 if body else 0
    tied = shape.tie_embeddings
    want = {k: s for k, s in layout(shape).items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < keep}
    read: list[int] = []
    state = safetensors_reader.load(root, device, dtype, keys=set(want) | _bias_keys(keep),
                                    read=read)
    if any(k.endswith(".bias") for k in state):
        raise TrainerConfigError(f"--target-path {path}: attention biases: not a Qwen3 layout")
    missing = sorted(k for k in want if k not in state)
    shapes = sorted(k for k, v in state.items() if tuple(v.shape) != want[k])
    if missing or shapes:
        raise TrainerConfigError(f"--target-path {path}: tensors missing {missing[:3]} or "
                                 f"misshapen {shapes[:3]} for {raw.get('model_type', '?')}")
    layers = [fuse_layer(state, n) for n in range(keep)]
    embed = state["model.embed_tokens.weight"]
    head = embed if tied else state["lm_head.weight"]
    return Loaded(TargetWeights(embed, head, layers), _checkpoint_rope(raw, root, shape, device),
                  shape, sum(read))


def _bias_keys(layers: int) -> set[str]:
    return {f"model.layers.{n}.self_attn.{p}_proj.bias" for n in range(layers) for p in "qkvo"}


def _read_config(root: pathlib.Path) -> dict[str, t.Any]:
    """``root/config.json`` as a JSON object.

    Raises:
        TrainerConfigError: missing, unreadable, not JSON, or not an object.
    """
    f = root / "config.json"
    if not f.is_file():
        raise TrainerConfigError(f"--target-path {root}: no config.json there")
    try:
        raw = json.loads(f.read_bytes())
    except (OSError, ValueError) as e:
        raise TrainerConfigError(f"--target-path {root}: unreadable config.json ({e})") from None
    if not isinstance(raw, dict):
        raise TrainerConfigError(f"--target-path {root}: config.json is not a JSON object")
    return raw


def _shape_of(raw: dict[str, t.Any], base: DrafterConfig, path: str) -> DrafterConfig:
    """The target shape a checkpoint's config.json describes (the drafter fields of ``base``)."""
    over = config_from_raw(raw, base, path)
    try:
        return dataclasses.replace(base, **over, target_layer_ids=(), feature_layers=0,
                                   mask_token_id=-1)
    except TrainerConfigError as e:  # e.g. query heads not a multiple of the key/value heads
        raise TrainerConfigError(f"--target-path {path}: config.json: {e}") from None


def _rope_type(raw: dict[str, t.Any]) -> str:
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "?"
    return str(kind or "default")


def _checkpoint_rope(raw: dict[str, t.Any], root: pathlib.Path, shape: DrafterConfig,
                     device: torch.device) -> nn.Module:
    """RoPE for a checkpoint: the default tables computed here, on the host in fp32 as
    transformers' loader computes them; any other ``rope_type`` (YaRN, linear, ...) from
    transformers' own rotary module, the one case that still imports it."""
    if _rope_type(raw) == "default":
        return Rope(default_inv_freq(shape, torch.device("cpu"))).to(device)
    from transformers import AutoConfig
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    try:
        hf_cfg = AutoConfig.from_pretrained(str(root), local_files_only=True)
        return Qwen3RotaryEmbedding(config=hf_cfg).to(device)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainerConfigError(f"--target-path {root}: RoPE {_rope_type(raw)!r} not "
                                 f"buildable ({e})") from None


def save_target(model: t.Any, out_dir: str) -> None:
    """Write a target the way every consumer here reads one (``--target-path``, ``eval``,
    ``regenerate``): transformers' ``save_pretrained``, safetensors shards of up to 5 GB."""
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="5GB")


# --- the target for inference (``regenerate``, ``eval``): one set of flags, one loader ----------


def add_target_args(p: t.Any) -> None:
    """``--target-path``, ``--tokenizer``, ``--device`` of the inference commands (argparse)."""
    p.add_argument("--target-path", required=True, help="local HF checkpoint dir of the target")
    p.add_argument("--tokenizer", default=None, help="tokenizer dir (default: --target-path)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")


def inference_device(choice: str, index: int = 0) -> torch.device:
    """``--device``: CUDA (GPU ``index``) when asked or, for ``auto``, when there is one.

    Raises:
        TrainerConfigError: ``cuda`` asked for and not available.
    """
    if choice == "cuda" and not torch.cuda.is_available():
        raise TrainerConfigError("--device cuda but torch.cuda.is_available() is False")
    if choice != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", index)
    return torch.device("cpu")


def load_causal_lm(path: str, device: torch.device, dtype: torch.dtype) -> t.Any:
    """The whole target (with its LM head) from a local checkpoint, in eval mode, on ``device``."""
    from transformers import AutoModelForCausalLM

    model: t.Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True,
                                                        attn_implementation="sdpa")
    return model.to(device).eval()
