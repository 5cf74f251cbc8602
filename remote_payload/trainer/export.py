"""``python -m remote_payload.trainer export CKPT OUT``: the drafter in the reference's format.

What SGLang, vLLM and z-lab/dflash's benchmark load (z-lab/dflash ``DFlashDraftModel``):
``OUT/config.json``, a Qwen3 config of the *drafter* (``num_hidden_layers`` = drafter depth,
``num_target_layers`` = the target's) with ``architectures: ["DFlashDraftModel"]`` and a
``dflash_config`` holding ``block_size``, ``mask_token_id`` and ``target_layer_ids``; and
``OUT/model.safetensors`` with the reference's parameter names. The embedding and LM head
are the target's and are not exported (the reference borrows them too).

``OUT/README.md`` is a model card with the exact vLLM and SGLang serve commands, built from
this config (:mod:`.serving`; a README.md of the user's already there is kept); ``export``
prints the same lines at its end.

OUT is written whole or not at all (:func:`remote_payload.safe_write.new_directory`: a
temporary sibling directory swapped in, the previous export kept until then) and carries
opsctl's marker. OUT is refused when it is a checkpoint, a run's directory (its ``latest``
points into it) or inside either, the current directory, a home or ``/``, a link, or a
directory opsctl did not write (a model's own ``config.json``/``model.safetensors``) unless
``--force`` says to replace it.

``OUT/dflash.py`` is this project's drafter for transformers (:mod:`.hf_dflash`, copied byte
for byte) and ``config.json``'s ``auto_map`` names it as z-lab's hub repositories do
(``{"AutoModel": "dflash.DFlashDraftModel"}``), so ``AutoModel.from_pretrained(OUT,
trust_remote_code=True)`` builds the drafter with these exact weights. Every file is 0644
(as the umask allows: :func:`.checkpoint.make_readable`), so a server running as another
user can read the weights.

``--dtype`` rounds the fp32 master weights: bfloat16 (the default; what the reference's
drafters ship and the servers run) moved the hidden states of a trained drafter by up to
4.7e-2 and its logits by up to 7.8e-2 against the fp32 export, with the same argmax at 84 of
84 positions; ``float32`` keeps the trained weights bit for bit.

Name map (ours -> reference), one rule per module so it cannot drift from ``model.py``:
``fc`` -> ``fc``, ``ctx_norm`` -> ``hidden_norm``, ``norm`` -> ``norm``, and per layer
``input_norm`` -> ``input_layernorm``, ``post_norm`` -> ``post_attention_layernorm``,
``{q,k,v,o}_proj``/``{q,k}_norm`` -> ``self_attn.*``, ``gate/up/down`` -> ``mlp.*_proj``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import typing as t

import torch

from .. import safe_write
from .config import DrafterConfig, TrainerConfigError
from .serving import carry_user_readme, export_card, write_card

_LAYER_MAP = {
    "input_norm": "input_layernorm", "post_norm": "post_attention_layernorm",
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
}
_TOP_MAP = {"fc": "fc", "ctx_norm": "hidden_norm", "norm": "norm"}
#: the modeling file's name in an export (z-lab's hub repositories call theirs ``dflash.py``)
MODELING_FILE = "dflash.py"
#: what a re-export carries over from OUT (the user's own model card): a change to it loses
#: nothing, so it does not make OUT someone else's
_KEPT = ("README.md",)
_LAYER_RE = re.compile(r"^layers\.(\d+)\.([a-z_]+)\.weight$")


def reference_name(ours: str) -> str:
    """The z-lab/dflash name of one of our drafter parameters.

    Raises:
        TrainerConfigError: a parameter the map does not know (the model grew a module).
    """
    m = _LAYER_RE.match(ours)
    if m and m.group(2) in _LAYER_MAP:
        return f"layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}.weight"
    top = ours.removesuffix(".weight")
    if ours.endswith(".weight") and top in _TOP_MAP:
        return f"{_TOP_MAP[top]}.weight"
    raise TrainerConfigError(f"export: no reference name for parameter {ours!r}")


def reference_config(cfg: DrafterConfig, dtype: str) -> dict[str, t.Any]:
    """config.json of the exported drafter (a Qwen3 config plus ``dflash_config``)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": f"{MODELING_FILE.removesuffix('.py')}.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.draft_layers,
        "num_target_layers": cfg.target_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "layer_types": ["full_attention"] * cfg.draft_layers,
        "max_position_embeddings": 40960,
        "rms_norm_eps": cfg.rms_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": cfg.vocab_size,
        "dtype": dtype,
        "block_size": cfg.block_size,
        "dflash_config": {"block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
                          "target_layer_ids": list(cfg.target_layer_ids)},
    }


def _is_checkpoint(d: pathlib.Path) -> bool:
    marker = safe_write.read_marker(d)
    return (marker is not None and marker.get("kind") == "checkpoint") or (d / "meta.json").is_file()


def check_out(ckpt: pathlib.Path, out: str, force: bool) -> None:
    """Refuse an OUT that would replace a checkpoint or a run (a checkpoint, inside one, a
    run's directory itself, or one containing the checkpoint read; ``run/export`` beside the
    checkpoints is fine), or anything :func:`safe_write.check_directory` refuses; ``force``
    replaces only a directory opsctl did not write, never a checkpoint.

    Raises:
        DestinationRefused: the rule and the path; nothing was written.
    """
    real = pathlib.Path(out).resolve() if out.strip() else pathlib.Path(out)
    src = ckpt.resolve()
    for d in (real, *real.parents):
        if d.is_dir() and (_is_checkpoint(d) or (d == real and (d / "latest").is_file())):
            what = "the checkpoint read" if d == src else \
                "a checkpoint" if _is_checkpoint(d) else "a training run's directory"
            where = "is" if d == real else f"is inside {d},"
            raise safe_write.DestinationRefused(
                out, f"refused as export OUT: it {where} {what} (resume and export read it); "
                     "name a directory of its own")
    if safe_write.protected_refusal(out) is None and src.is_relative_to(real):
        raise safe_write.DestinationRefused(out, "refused as export OUT: it contains the "
                                                 f"checkpoint read ({src})")
    safe_write.check_directory(out, kind="export", force=force, keep=_KEPT)


def export(ckpt: str, out: str, dtype: str = "bfloat16", *, force: bool = False) -> dict[str, t.Any]:
    """Write ``out/config.json``, ``out/model.safetensors`` and ``out/dflash.py`` as one
    directory swapped in whole; returns a summary.

    Raises:
        TrainerConfigError: unknown dtype or parameter. CheckpointError: unreadable ckpt.
        DestinationRefused: OUT is a checkpoint, a run, protected, a link or someone else's.
        WriteFailed: the disk said no (the previous export is kept).
    """
    from .checkpoint import make_readable, save_safetensors
    from .evaluate import load_drafter

    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(dtype)
    if dt is None:
        raise TrainerConfigError(f"--dtype {dtype!r}; choices: bfloat16, float16, float32")
    check_out(pathlib.Path(ckpt), out, force)  # before the weights are read: fail fast
    drafter, cfg, path = load_drafter(ckpt, torch.device("cpu"))
    check_out(path, out, force)
    state = {reference_name(k): v.detach().to(dt).contiguous()
             for k, v in drafter.state_dict().items()}
    config = reference_config(cfg, dtype)
    dst = pathlib.Path(out)
    with safe_write.new_directory(out, kind="export", force=force, keep=_KEPT) as tmp:
        save_safetensors(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / MODELING_FILE).write_bytes(
            pathlib.Path(__file__).with_name("hf_dflash.py").read_bytes())
        card = export_card(config, dst, path)  # README.md, unless OUT has one of the user's
        for name, text in card.items():
            write_card(tmp / name, text)
        if not card:
            carry_user_readme(dst, tmp)  # the directory is swapped whole: nothing lost
        mode = make_readable(tmp / n for n in ("model.safetensors", "config.json", MODELING_FILE,
                                               *card))
    return {"ckpt": str(path), "out": str(dst), "tensors": len(state), "dtype": dtype,
            "mode": f"{mode:04o}",
            "mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}


def run(argv: t.Sequence[str]) -> dict[str, t.Any]:
    p = argparse.ArgumentParser(prog="python -m remote_payload.trainer export",
                                description="Export a drafter checkpoint in z-lab/dflash's format.")
    p.add_argument("ckpt", help="checkpoint dir, or a run's --out-dir (its latest checkpoint)")
    p.add_argument("out", help="output directory (config.json + model.safetensors), written "
                               "whole; never a checkpoint, a run, the current directory or a "
                               "home; a leading ~ is the home, as in a shell")
    p.add_argument("--force", action="store_true",
                   help="replace OUT although opsctl did not write it (e.g. a model's own "
                        "directory); a checkpoint or a run is refused even so")
    p.add_argument("--dtype", default="bfloat16",
                   help="bfloat16 (default: what servers run; rounds the fp32 weights: hidden "
                        "states moved by up to 4.7e-2 and logits by 7.8e-2 against float32 on a "
                        "trained drafter, same argmax at 84/84 positions) | float16 | float32 "
                        "(the trained weights bit for bit)")
    a = p.parse_args(argv)
    # a playbook's argv reaches here with no shell to expand "~": "~/exports/x" meant the
    # home, never a directory named "~" in the job's working directory
    return export(os.path.expanduser(a.ckpt), os.path.expanduser(a.out), a.dtype, force=a.force)
