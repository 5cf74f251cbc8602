"""The frozen Qwen3 target: built with random weights from a preset shape, or loaded
from a local checkpoint directory (never from the hub), and run only as deep as the
drafter's deepest feature layer."""

from __future__ import annotations

import contextlib
import json
import pathlib
import typing as t

import torch
from torch import nn

from .config import DrafterConfig, TrainerConfigError


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


class Target(nn.Module):
    """Wraps a ``Qwen3ForCausalLM``; ``features(ids)`` returns the concatenated hidden
    states of the feature layers, (B, S, L*H)."""

    def __init__(self, model: nn.Module, layer_ids: t.Sequence[int]):
        super().__init__()
        # a transformers model: its submodules (model.layers, heads) are dynamic attributes
        self.model: t.Any = model.eval().requires_grad_(False)
        self.layer_ids = tuple(layer_ids)
        self._captured: dict[int, torch.Tensor] = {}
        self._active = False  # hooks only act inside features(), not on plain model calls
        hf: t.Any = self.model
        layers = hf.model.layers
        last = max(self.layer_ids, default=-1)
        for i in set(self.layer_ids):
            layers[i].register_forward_hook(self._hook(i, stop=i == last))

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


def build_target(cfg: DrafterConfig, device: torch.device, dtype: torch.dtype,
                 path: str | None = None, seed: int = 0, body: bool = True) -> Target:
    """Random-weight target of ``cfg``'s shape, or the checkpoint at ``path``.

    ``body=False`` keeps only the embedding and LM head (what a split drafter rank needs).
    Random embedding/head weights come from a dedicated seeded generator so that ranks
    with and without the body agree on them.

    Raises:
        TrainerConfigError: ``path`` is not a loadable checkpoint directory.
    """
    from transformers import Qwen3ForCausalLM

    if path is not None:
        if not pathlib.Path(path).is_dir():
            raise TrainerConfigError(f"--target-path {path} is not a directory")
        model: t.Any = Qwen3ForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa",
                                                 local_files_only=True)
        if not body:
            del model.model.layers[cfg.target_layers_run:]  # drop what no rank here runs
            model.model.layers = nn.ModuleList(model.model.layers[:1])
        return Target(model.to(device), cfg.target_layer_ids if body else ())
    hf_cfg = qwen3_config(cfg, layers=None if body else 1)
    hf_cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed + 1_000_003)
    with _default_dtype(dtype), torch.device(device), torch.no_grad():
        model = Qwen3ForCausalLM(hf_cfg)  # (t.Any: see above)
        # std 2/sqrt(H): with an RMS-normed input the frozen head then gives logits of
        # O(1), so a random target still has a learnable head (0.02 makes them ~0).
        g = torch.Generator(device=device).manual_seed(seed + 17)
        std = 2.0 / cfg.hidden_size ** 0.5
        emb = model.get_input_embeddings().weight
        emb.normal_(0.0, std, generator=g)
        head = model.get_output_embeddings().weight
        if head.data_ptr() != emb.data_ptr():
            head.normal_(0.0, std, generator=g)
    return Target(model.to(dtype), cfg.target_layer_ids if body else ())
