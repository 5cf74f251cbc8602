"""How to serve an export: its README.md (a model card) and the vLLM and SGLang command lines,
built from the export's own ``config.json``.

``export`` writes the card into the export directory and prints the two lines at its end
(``python -m remote_payload.trainer export``, the ``dflash-export`` playbook). Everything here
is a pure function of the config (plus the target the checkpoint was trained against, when
its ``config.json`` is still readable), so the lines a user copies are the ones the suite
checks. Every command is an argv list joined once with :func:`shlex.join`, and the
``--speculative-config`` value is :func:`json.dumps` of a dict: a path with spaces or quotes
reaches the server intact.

The flags, as the servers' own documentation spells them (read 2026-12-02):

- vLLM 0.33 (docs/features/speculative_decoding, z-lab/dflash README "Run DFlash with vLLM",
  docs.vllm.ai "DFlash speculative decoding"): ``vllm serve TARGET --speculative-config
  '{"method": "dflash", "model": DRAFT, "num_speculative_tokens": K}'``. K is the number of
  drafted tokens per step: a block is the anchor token plus block_size - 1 masks, so
  K = block_size - 1 (z-lab's block-16 drafters are served with 15).
- SGLang 0.5.23 (docs.sglang.io advanced_features/speculative_decoding, "DFlash Decoding";
  z-lab/dflash README "SGLang"): ``python -m sglang.launch_server --model-path TARGET
  --speculative-algorithm DFLASH --speculative-draft-model-path DRAFT``. SGLang builds the
  drafter's model config with the server's context length; when the target's
  ``max_position_embeddings`` is longer than the drafter's, it refuses unless the length is
  given (``--context-length``) and allowed past the drafter's config
  (``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``, as z-lab's own examples set).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import sys
import typing as t
from dataclasses import dataclass

from .. import safe_write
from .config import TrainerConfigError

VLLM_VERSION = "0.33"
SGLANG_VERSION = "0.5.23"
#: written where the export does not know its target (a toy or synthetic run)
TARGET_PLACEHOLDER = "TARGET_MODEL"
SGLANG_LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
README_FILE = "README.md"
#: the card's first line: a README.md that starts otherwise is the user's and is kept
CARD_MARK = "<!-- written by opsctl's trainer export (serving.py); rewritten at every export -->"
#: the most of the target's config.json that is read (a real one is a few KiB)
TARGET_CONFIG_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Target:
    """The target model the drafter was trained against, as far as the export can tell."""

    path: str | None = None  # None: not recorded (synthetic data, the toy target)
    max_positions: int | None = None  # its config.json's max_position_embeddings, if readable


def _int(config: t.Mapping[str, t.Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TrainerConfigError(f"export config.json: {key!r} is {value!r}, not an integer")
    return value


def speculative_tokens(config: t.Mapping[str, t.Any]) -> int:
    """Drafted tokens per step: block_size - 1 (the block's first token is the anchor).

    Raises:
        TrainerConfigError: no usable ``block_size`` (at least 2).
    """
    block = _int(config, "block_size")
    if block < 2:
        raise TrainerConfigError(f"export config.json: block_size {block} drafts no token "
                                 "(at least 2)")
    return block - 1


def vllm_argv(config: t.Mapping[str, t.Any], draft_dir: str, target: Target) -> list[str]:
    spec = {"method": "dflash", "model": draft_dir,
            "num_speculative_tokens": speculative_tokens(config)}
    return ["vllm", "serve", target.path or TARGET_PLACEHOLDER,
            "--speculative-config", json.dumps(spec)]


def context_override(config: t.Mapping[str, t.Any], target: Target) -> int | None:
    """The context length SGLang must be told: the target's, when longer than the drafter's."""
    drafter = _int(config, "max_position_embeddings")
    if target.max_positions is not None and target.max_positions > drafter:
        return target.max_positions
    return None


def sglang_argv(config: t.Mapping[str, t.Any], draft_dir: str, target: Target) -> list[str]:
    argv = ["python3", "-m", "sglang.launch_server", "--model-path",
            target.path or TARGET_PLACEHOLDER, "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", draft_dir]
    longer = context_override(config, target)
    if longer is not None:
        argv = ["env", f"{SGLANG_LONGER_CONTEXT_ENV}=1", *argv, "--context-length", str(longer)]
    return argv


def serve_lines(config: t.Mapping[str, t.Any], draft_dir: str, target: Target) -> list[str]:
    """The two shell lines, vLLM's then SGLang's (each argv joined once with shlex.join)."""
    return [shlex.join(vllm_argv(config, draft_dir, target)),
            shlex.join(sglang_argv(config, draft_dir, target))]


def model_card(config: t.Mapping[str, t.Any], draft_dir: str, target: Target) -> str:
    """README.md of an export: what it is, the exact serve commands, how to load it.

    Raises:
        TrainerConfigError: the config lacks what the servers need.
    """
    vllm, sglang = serve_lines(config, draft_dir, target)
    dflash = config.get("dflash_config")
    dflash = dflash if isinstance(dflash, dict) else {}  # shown as unknown, not a crash
    ids = dflash.get("target_layer_ids")
    trained = (repr(target.path) + (f" ({target.max_positions} positions)"
                                     if target.max_positions else "")
               if target.path else "not recorded (replace `TARGET_MODEL` below with the target)")
    longer = context_override(config, target)
    context_note = (
        f"The target's context ({longer}) is longer than the drafter's config "
        f"({config['max_position_embeddings']}): SGLang is given `--context-length {longer}` and "
        f"`{SGLANG_LONGER_CONTEXT_ENV}=1`, as above." if longer else
        f"If the target's context is longer than the drafter's config "
        f"({config['max_position_embeddings']}), add `--context-length N` to SGLang's line and "
        f"run it with `{SGLANG_LONGER_CONTEXT_ENV}=1` in its environment.")
    rows = [("format", "z-lab/dflash `DFlashDraftModel` (config.json, model.safetensors, dflash.py)"),
            ("block size", f"{config.get('block_size')} (drafts {speculative_tokens(config)} tokens "
                           "per step)"),
            ("drafter layers", str(config.get("num_hidden_layers"))),
            ("target layers read", f"{ids} of {config.get('num_target_layers')}"),
            ("mask token id", str(dflash.get("mask_token_id"))),
            ("dtype", str(config.get("dtype"))),
            ("trained against", trained)]
    table = "\n".join(f"| {k} | {_cell(v)} |" for k, v in rows)
    load = (f"from transformers import AutoModel\ndraft = AutoModel.from_pretrained("
            f"{json.dumps(draft_dir)}, trust_remote_code=True, dtype=\"auto\")")
    fence = _fence(vllm + sglang + load)
    return f"""{CARD_MARK}
# DFlash drafter

A block drafter for speculative decoding, exported by opsctl's trainer
(`python -m remote_payload.trainer export`). The embedding and LM head are the target's:
serve it beside the target it was trained against.

| | |
| --- | --- |
{table}

## Serve with vLLM ({VLLM_VERSION})

{fence}bash
{vllm}
{fence}

## Serve with SGLang ({SGLANG_VERSION})

{fence}bash
{sglang}
{fence}

{context_note}

## Load with transformers

{fence}python
{load}
{fence}
"""


def _fence(text: str) -> str:
    """A Markdown code fence longer than any run of backticks in ``text`` (a path may hold
    some), so the block ends where the card means it to."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _cell(text: str) -> str:
    """Text for a Markdown table cell (a ``|`` would end the cell; line breaks are escaped
    already: paths are shown as ``repr``)."""
    return text.replace("|", "\\|")


def target_of(ckpt: pathlib.Path) -> Target:
    """The target recorded in a checkpoint's ``meta.json`` (``args.target_path``) and its
    context length, when its ``config.json`` is still there; anything unreadable is unknown
    (the card then says so), never an error: the export itself does not need the target."""
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
        path = meta["args"]["target_path"]
    except (OSError, ValueError, KeyError, TypeError):
        return Target()
    if not isinstance(path, str) or not path:
        return Target()
    try:
        cfg = json.loads(_small_file(pathlib.Path(path) / "config.json"))
        longest = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    except (OSError, ValueError, RecursionError):
        longest = None
    ok = isinstance(longest, int) and not isinstance(longest, bool) and longest > 0
    return Target(path, longest if ok else None)


def _small_file(path: pathlib.Path) -> bytes:
    """A regular file's bytes, at most :data:`TARGET_CONFIG_MAX_BYTES`. The target's path is
    the user's (meta.json): a FIFO there would block the export forever and ``/dev/zero``
    would fill memory, so :func:`remote_payload.boundedread.read_regular` reads it (a link
    the user made is followed) and anything else is refused.

    Raises:
        OSError: unreadable, not a regular file, or too big.
    """
    from remote_payload import boundedread

    return boundedread.read_regular(path, TARGET_CONFIG_MAX_BYTES, follow_links=True)


def write_card(path: pathlib.Path, text: str) -> None:
    """Write the card as UTF-8; a path that is not UTF-8 (a lone surrogate from the file
    system's bytes) is written back as those very bytes, so its lines name the real path.

    :func:`remote_payload.safe_write.write_bytes`: written beside it and renamed over it, so
    an export stopped halfway leaves the old card or the new one, not half of one; a link
    there is refused, never written through.

    Raises:
        DestinationRefused: ``path`` is a link or not a regular file.
        WriteFailed: the disk said no.
    """
    safe_write.write_bytes(path, text.encode("utf-8", "surrogateescape"), mode=0o644)


def ours(readme: pathlib.Path) -> bool:
    """Whether ``readme`` may be (re)written: absent, or a card an export wrote. A link, a
    special file or a README.md of the user's (an export into a hub repository's clone) is
    kept: nothing lost."""
    if not readme.exists() and not readme.is_symlink():
        return True
    if readme.is_symlink() or not readme.is_file():
        return False
    try:
        with readme.open(encoding="utf-8", errors="replace") as f:
            return f.readline().rstrip("\n") == CARD_MARK
    except OSError:
        return False


def export_card(config: t.Mapping[str, t.Any], out: pathlib.Path,
                ckpt: pathlib.Path) -> dict[str, str]:
    """The files ``export`` adds for people: ``{"README.md": card}`` (OUT as an absolute path,
    so the lines work from any directory), or nothing when OUT holds a README.md of its own
    (kept, and said in one line on stderr; the serve lines are still printed)."""
    if not ours(out / README_FILE):
        print(f"export: kept {out / README_FILE} (not written by an export); the serve lines "
              "follow the summary", file=sys.stderr, flush=True)
        return {}
    return {README_FILE: model_card(config, str(out.absolute()), target_of(ckpt))}


def carry_user_readme(out: pathlib.Path, staging: pathlib.Path) -> None:
    """Copy the user's own README.md (a file or a link, as it is) from OUT into the export
    being staged: the export replaces OUT as a whole directory, and the user's card stays."""
    readme = out / README_FILE
    if readme.is_symlink():
        os.symlink(os.readlink(readme), staging / README_FILE)
    elif readme.is_file():
        shutil.copy2(readme, staging / README_FILE)
    elif readme.is_dir():  # a directory of the user's by that name (said "kept": it is)
        shutil.copytree(readme, staging / README_FILE, symlinks=True)


def export_lines(out: pathlib.Path, ckpt: pathlib.Path) -> list[str]:
    """What ``export`` prints at its end: the two serve lines of the export just written."""
    config = json.loads((out / "config.json").read_text())
    vllm, sglang = serve_lines(config, str(out.absolute()), target_of(ckpt))
    readme = out.absolute() / README_FILE
    return ["serve it with vLLM:", f"  {vllm}", "or with SGLang:", f"  {sglang}",
            *([f"(also in {readme})"] if readme.is_file() and ours(readme) else [])]
