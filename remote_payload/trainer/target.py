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
H200, its features carrying FP8's rounding (docs/benchmarks.md, "Third pass", says how much).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import typing as t

import torch
import torch.nn.functional as F
from torch import nn

from . import fp8
from .config import TARGET_PRECISIONS, DrafterConfig, TrainerConfigError

#: a matmul weight of :class:`FusedLayer`: the bf16 tensor, or its FP8 codes and scales
Weight = torch.Tensor | fp8.Fp8Weight

_MATMULS = ("qkv", "o", "gate_up", "down")  # the weights --target-precision applies to


class _Stop(Exception):
    """Raised by the last feature hook: the layers after it are not needed."""


def qwen3_config(cfg: DrafterConfig, layers: int | None = None) -> t.Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=layers or cfg.target_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        max_position_embeddings=32768, use_cache=False)


def config_from_dir(path: str, base: DrafterConfig) -> dict[str, t.Any]:
    """Shape overrides read from ``path/config.json`` (so a real checkpoint wins over a preset)."""
    cfg_file = pathlib.Path(path) / "config.json"
    if not cfg_file.is_file():
        raise TrainerConfigError(f"--target-path {path}: no config.json there")
    c = json.loads(cfg_file.read_text())
    rope = c.get("rope_parameters") or {}
    return {
        "vocab_size": c["vocab_size"], "hidden_size": c["hidden_size"],
        "target_layers": c["num_hidden_layers"], "num_heads": c["num_attention_heads"],
        "num_kv_heads": c.get("num_key_value_heads", c["num_attention_heads"]),
        "head_dim": c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
        "intermediate_size": c["intermediate_size"],
        "rope_theta": float(rope.get("rope_theta", c.get("rope_theta", base.rope_theta))),
        "rms_eps": c.get("rms_norm_eps", base.rms_eps),
        "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
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
    """A frozen ``Qwen3DecoderLayer``'s weights, q/k/v and gate/up concatenated (buffers:
    nothing here trains). Built from the transformers layer, which can then be freed.
    ``precision="fp8"``: the four matmul weights as e4m3 codes (``<name>``) and per-row
    scales (``<name>_scale``)."""

    def __init__(self, layer: t.Any, precision: str = "bf16"):
        super().__init__()
        att, mlp = layer.self_attn, layer.mlp
        if any(getattr(m, "bias", None) is not None
               for m in (att.q_proj, att.k_proj, att.v_proj, att.o_proj)):
            raise TrainerConfigError("target with attention biases: not a Qwen3 layout")
        if getattr(att, "sliding_window", None):
            raise TrainerConfigError("target uses sliding-window attention: not supported")
        self.eps = float(layer.input_layernorm.variance_epsilon)
        self.heads = (att.config.num_attention_heads, att.config.num_key_value_heads, att.head_dim)
        cat = torch.cat
        for name, tensor in (
                ("in_norm", layer.input_layernorm.weight),
                ("qkv", cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])),
                ("q_norm", att.q_norm.weight), ("k_norm", att.k_norm.weight),
                ("o", att.o_proj.weight), ("post_norm", layer.post_attention_layernorm.weight),
                ("gate_up", cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                ("down", mlp.down_proj.weight)):
            if precision == "fp8" and name in _MATMULS:
                codes, scale = fp8.quantize_weight(tensor.detach())
                self.register_buffer(name, codes, persistent=False)
                self.register_buffer(name + "_scale", scale, persistent=False)
            else:
                self.register_buffer(name, tensor.detach().clone(), persistent=False)
        self.precision = precision

    def weights(self) -> tuple[Weight, ...]:
        def get(n: str) -> Weight:
            w = t.cast(torch.Tensor, getattr(self, n))
            if self.precision == "fp8" and n in _MATMULS:
                return fp8.Fp8Weight(w, t.cast(torch.Tensor, getattr(self, n + "_scale")))
            return w

        return tuple(get(n) for n in
                     ("in_norm", "qkv", "q_norm", "k_norm", "o", "post_norm", "gate_up", "down"))


class Target(nn.Module):
    """Wraps a ``Qwen3ForCausalLM``; ``features(ids)`` returns the concatenated hidden
    states of the feature layers, (B, S, L*H), L = ``len(layer_ids)``.

    ``fused=True`` (the trainer's path): the layers up to the deepest feature layer are
    rebuilt as :class:`FusedLayer` and transformers' copies freed; :meth:`compile` makes the
    per-layer function a compiled one (one graph per input shape, shared by all layers).
    ``fused=False``: transformers' own forward with hooks (the reference).
    ``precision``: the fused layers' matmul weights (``TARGET_PRECISIONS``)."""

    def __init__(self, model: nn.Module, layer_ids: t.Sequence[int], fused: bool = True,
                 precision: str = "bf16"):
        super().__init__()
        if precision not in TARGET_PRECISIONS:
            raise TrainerConfigError(f"target precision {precision!r}; choices: "
                                     f"{', '.join(TARGET_PRECISIONS)}")
        if precision != "bf16" and not fused:
            raise TrainerConfigError(f"target precision {precision} needs the fused target")
        # a transformers model: its submodules (model.layers, heads) are dynamic attributes
        self.model: t.Any = model.eval().requires_grad_(False)
        self.layer_ids = tuple(layer_ids)
        self._captured: dict[int, torch.Tensor] = {}
        self._active = False  # hooks only act inside features(), not on plain model calls
        self._layer_fn: t.Callable[..., torch.Tensor] = fused_layer_forward
        self.fused: nn.ModuleList | None = None
        hf: t.Any = self.model
        layers = hf.model.layers
        last = max(self.layer_ids, default=-1)
        if fused and self.layer_ids:
            self.fused = nn.ModuleList()
            for i in range(len(layers)):
                if i <= last:
                    self.fused.append(FusedLayer(layers[i], precision))
                layers[i] = nn.Identity()  # free transformers' copy as we go (peak +1 layer)
            return
        for i in set(self.layer_ids):
            layers[i].register_forward_hook(self._hook(i, stop=i == last))

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
            # tuned launch configs for the norm/RoPE reductions (0.48 -> 0.30 ms per layer on an
            # H200, ~8 ms a step; the first call compiles ~5 s longer): benchmarks/trainer_knobs.py
            kwargs.setdefault("options", {"coordinate_descent_tuning": True})
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

    @property
    def embed(self) -> nn.Embedding:
        return t.cast(nn.Embedding, self.model.get_input_embeddings())

    @property
    def head_weight(self) -> torch.Tensor:
        return t.cast(torch.Tensor, self.model.get_output_embeddings().weight)

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
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
        assert self.fused is not None
        hf: t.Any = self.model
        h = hf.model.embed_tokens(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        pos = pos.expand(input_ids.shape[0], -1)
        cos, sin = hf.model.rotary_emb(h, pos)  # transformers' own RoPE (any rope_type)
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

    Both paths build the model on the ``meta`` device (no storage, no init work) and then
    give it storage on ``device`` only: random weights are drawn there by
    :func:`_materialize_random` in the same order and from the same generator as an eager
    build on ``device`` (bit-identical; ``tests/trainer/test_startup.py``), a checkpoint is
    read by :func:`load_safetensors` straight into ``device`` memory. No CPU copy of the
    weights is ever made (issue 28: a restart spent ~20 s building an 8B model on the host).

    Raises:
        TrainerConfigError: ``path`` is not a loadable checkpoint directory.
    """
    if path is not None:
        model = _load_checkpoint(cfg, path, device, dtype, body)
        return Target(model, cfg.target_layer_ids if body else (), fused, precision)
    model = _materialize_random(cfg, device, dtype, seed, body)
    return Target(model.to(dtype), cfg.target_layer_ids if body else (), fused, precision)


def _meta_model(hf_cfg: t.Any, dtype: torch.dtype) -> t.Any:
    """A ``Qwen3ForCausalLM`` of ``hf_cfg`` on the meta device: shapes only, no init work."""
    from transformers import Qwen3ForCausalLM

    hf_cfg._attn_implementation = "sdpa"
    with _default_dtype(dtype), torch.device("meta"):
        return Qwen3ForCausalLM(hf_cfg)


def _fresh_rotary(model: t.Any, device: torch.device, dtype: torch.dtype,
                  on: torch.device | None = None) -> None:
    """RoPE tables are non-persistent buffers computed in the constructor: after
    ``to_empty`` (or a load, which never carries them) they are recomputed where the eager
    path computed them (``on``, default ``device``: a random build ran there, a loaded one
    on the host) under the default dtype it had, and moved to ``device``."""
    rot = model.model.rotary_emb
    with _default_dtype(dtype), torch.device(on or device):
        fresh = type(rot)(config=model.config)
    model.model.rotary_emb = fresh.to(device)


def _reset_all(modules: t.Iterable[nn.Module]) -> None:
    for m in modules:
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            reset()


def _materialize_random(cfg: DrafterConfig, device: torch.device, dtype: torch.dtype,
                        seed: int, body: bool) -> t.Any:
    """The random target, built on meta and materialised on ``device``.

    The draws replay an eager ``Qwen3ForCausalLM(hf_cfg)`` under ``torch.device(device)``
    exactly: each module's own ``reset_parameters`` in construction order (the inner
    ``Qwen3Model`` first, whose ``post_init`` then runs transformers' init, then the LM head
    and the outer ``post_init``), from the same seeded global generator, so the weights are
    bit-identical to the eager build on the same device (the equality test pins this for
    the installed transformers). Then the head's own generator as before."""
    hf_cfg = qwen3_config(cfg, layers=None if body else 1)
    model = _meta_model(hf_cfg, dtype)
    torch.manual_seed(seed + 1_000_003)
    with _default_dtype(dtype), torch.no_grad():
        model.to_empty(device=device)
        _reset_all(model.model.modules())
        model.model.init_weights()
        _reset_all([model.lm_head])
        model.init_weights()
        _fresh_rotary(model, device, dtype)
        # std 2/sqrt(H): with an RMS-normed input the frozen head then gives logits of
        # O(1), so a random target still has a learnable head (0.02 makes them ~0).
        g = torch.Generator(device=device).manual_seed(seed + 17)
        std = 2.0 / cfg.hidden_size ** 0.5
        emb = model.get_input_embeddings().weight
        emb.normal_(0.0, std, generator=g)
        head = model.get_output_embeddings().weight
        if head.data_ptr() != emb.data_ptr():
            head.normal_(0.0, std, generator=g)
    return model


def _load_checkpoint(cfg: DrafterConfig, path: str, device: torch.device, dtype: torch.dtype,
                     body: bool) -> t.Any:
    """``path`` (a ``save_pretrained`` directory: config.json + safetensors shards) onto
    ``device``: the model on meta, each tensor read straight into ``device`` memory and
    assigned. ``body=False``: only the embedding and LM head are read.

    Raises:
        TrainerConfigError: not a directory, no safetensors, or tensors missing/misshapen.
    """
    from transformers import AutoConfig

    root = pathlib.Path(path)
    if not root.is_dir():
        raise TrainerConfigError(f"--target-path {path} is not a directory")
    try:
        hf_cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise TrainerConfigError(f"--target-path {path}: unreadable config.json ({e})") from None
    hf_cfg.use_cache = False
    if not body:
        hf_cfg.num_hidden_layers = 1
    model = _meta_model(hf_cfg, dtype)
    want = {k: v for k, v in model.state_dict().items()
            if body or not k.startswith("model.layers.")}
    state = load_safetensors(root, device, dtype, keys=set(want))
    tied = bool(getattr(hf_cfg, "tie_word_embeddings", False))
    if tied:
        state.pop("lm_head.weight", None)
    missing = sorted(k for k in want if k not in state and not (tied and k == "lm_head.weight"))
    shapes = sorted(k for k, v in state.items() if tuple(v.shape) != tuple(want[k].shape))
    if missing or shapes:
        raise TrainerConfigError(f"--target-path {path}: tensors missing {missing[:3]} or "
                                 f"misshapen {shapes[:3]} for {hf_cfg.model_type}")
    if not body:
        model.model.layers = nn.ModuleList([nn.Identity()])  # no rank here runs a layer
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()
    _fresh_rotary(model, device, dtype, on=torch.device("cpu"))
    return model


_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
              "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
              "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_CHUNK = 64 << 20  # bytes per read: large enough to stream, small enough for two pinned buffers


def load_safetensors(root: pathlib.Path, device: torch.device, dtype: torch.dtype | None = None,
                     keys: set[str] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file under ``root`` (or those in ``keys``),
    on ``device``, floating tensors cast to ``dtype``.

    Why not ``safetensors.safe_open(..., device="cuda")``: it maps the file and copies each
    tensor from pageable memory, one page fault at a time. Here each file's data section is
    read sequentially in 64 MiB chunks into two pinned buffers that alternate, each chunk
    copied to one ``device`` byte buffer per file asynchronously while the next is read;
    tensors are then cut from that buffer on the device. Host memory stays at 128 MiB
    whatever the checkpoint's size. On CPU the same loop reads into the tensor buffer.

    Raises:
        TrainerConfigError: no safetensors file, or one whose header is not safetensors'.
    """
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise TrainerConfigError(f"--target-path {root}: no *.safetensors files")
    cuda = device.type == "cuda"
    stage = [torch.empty(_CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2 if cuda else 0)]
    done_ev: list[t.Any] = [None, None]
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            hlen, header = _header(fh, f)
            wanted = {k: v for k, v in header.items() if keys is None or k in keys}
            if not wanted:
                continue
            lo = min(v["data_offsets"][0] for v in wanted.values())
            hi = max(v["data_offsets"][1] for v in wanted.values())
            buf = torch.empty(hi - lo, dtype=torch.uint8, device=device)
            fh.seek(8 + hlen + lo)
            with torch.cuda.device(device) if cuda else contextlib.nullcontext():
                _read_into(fh, buf, stage, done_ev)
            for name, v in wanted.items():
                a, b = v["data_offsets"]
                x = buf[a - lo:b - lo].clone().view(_ST_DTYPES[v["dtype"]]).view(v["shape"])
                out[name] = x.to(dtype) if dtype is not None and x.is_floating_point() else x
            del buf
    if cuda:
        torch.cuda.synchronize(device)
    return out


def _header(fh: t.Any, f: pathlib.Path) -> tuple[int, dict[str, t.Any]]:
    """A safetensors header, every entry checked against the file before anything is read.

    Raises:
        TrainerConfigError: not safetensors' layout (length, JSON, dtypes, offsets, sizes).
    """
    import json as _json
    import math
    import struct

    size = f.stat().st_size

    def bad(why: str) -> TrainerConfigError:
        return TrainerConfigError(f"--target-path {f}: not a safetensors file ({why})")

    try:
        (hlen,) = struct.unpack("<Q", fh.read(8))
    except struct.error:
        raise bad("shorter than its 8-byte header length") from None
    if hlen > min(size - 8, 100 << 20):  # safetensors' own limit: 100 MB of header
        raise bad(f"header length {hlen} in a file of {size} bytes")
    try:
        header = _json.loads(fh.read(hlen))
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    header.pop("__metadata__", None)
    data = size - 8 - hlen
    for name, v in header.items():
        try:
            dtype = _ST_DTYPES[v["dtype"]]
            a, b = (int(x) for x in v["data_offsets"])
            n = math.prod(int(d) for d in v["shape"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"entry {name!r}: dtype, shape or offsets unreadable") from None
        if not 0 <= a <= b <= data or b - a != n * dtype.itemsize:
            raise bad(f"entry {name!r}: bytes {a}..{b} for {n} x {v['dtype']} in {data} bytes")
    return hlen, header


def _read_into(fh: t.Any, buf: torch.Tensor, stage: list[torch.Tensor],
               done_ev: list[t.Any]) -> None:
    """Fill ``buf`` (uint8) from ``fh``'s current position, through ``stage`` when on CUDA."""
    n, off, i = buf.numel(), 0, 0
    while off < n:
        size = min(_CHUNK, n - off)
        if not stage:  # CPU: read straight into the tensor's memory
            view = memoryview(t.cast(t.Any, buf[off:off + size].numpy())).cast("B")
        else:
            if done_ev[i] is not None:
                done_ev[i].synchronize()  # the copy out of this pinned buffer has finished
            view = memoryview(t.cast(t.Any, stage[i].numpy())).cast("B")[:size]
        got = 0
        while got < size:
            r = fh.readinto(view[got:])
            if not r:
                raise TrainerConfigError(f"--target-path {getattr(fh, 'name', '?')}: truncated")
            got += r
        if stage:
            buf[off:off + size].copy_(stage[i][:size], non_blocking=True)
            ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ev.record(torch.cuda.current_stream(buf.device))
            done_ev[i] = ev
            i ^= 1
        off += size


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
