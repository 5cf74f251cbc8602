"""Training records from JSONL: chat ``messages`` rendered with the tokenizer's own chat
template (loss on assistant turns only), plain ``text``, or pre-tokenized ``input_ids``.

Why character spans and not ``return_assistant_tokens_mask``: that flag needs a
``{% generation %}`` block in the template, which Qwen3's template (and most others) lacks.
Rendering the conversation up to each assistant turn gives that turn's character span in
the final text; the fast tokenizer's offsets then mark exactly the tokens inside it, so the
turn's end-of-turn token (``<|im_end|>`` for Qwen3) is trained too.
"""

from __future__ import annotations

import json
import pathlib
import typing as t

from .config import TrainerConfigError

Record = tuple[list[int], list[int]]  # (input_ids, loss_mask)


def load_tokenizer(path: str) -> t.Any:
    """A local tokenizer directory (never the hub).

    Raises:
        TrainerConfigError: ``path`` is not a tokenizer directory.
    """
    if not pathlib.Path(path).is_dir():
        raise TrainerConfigError(f"--tokenizer {path}: not a directory")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def mask_token_id(tok: t.Any, vocab_size: int) -> int:
    """The MASK id the drafter's blocks use: the tokenizer's own mask token when it defines
    one; otherwise the first id past the tokenizer's vocabulary, ``len(tok)``, when the
    target's embedding has a row for it (Qwen3: 151669, the id z-lab's released Qwen3
    drafters use; its embedding has 151936 rows); otherwise the last row, ``vocab_size - 1``.

    Raises:
        TrainerConfigError: the tokenizer's mask token is outside the target's vocabulary.
    """
    own = getattr(tok, "mask_token_id", None)
    if own is not None:
        if not 0 <= int(own) < vocab_size:
            raise TrainerConfigError(f"the tokenizer's mask token id {own} is outside the "
                                     f"target's vocabulary ({vocab_size})")
        return int(own)
    n = len(tok)
    return n if n < vocab_size else vocab_size - 1


def _template(tok: t.Any, messages: list[dict[str, t.Any]], gen: bool) -> str:
    return str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen))


def render_prompt(tok: t.Any, messages: list[dict[str, t.Any]]) -> list[int]:
    """Token ids of ``messages`` followed by the template's assistant header."""
    return list(tok(_template(tok, messages, True), add_special_tokens=False)["input_ids"])


def render_messages(tok: t.Any, messages: list[dict[str, t.Any]]) -> Record:
    """Token ids of the whole conversation and a mask that is 1 exactly on assistant turns
    (their content and the template's end-of-turn text).

    Raises:
        TrainerConfigError: an assistant turn cannot be located in the rendered text.
    """
    full = _template(tok, messages, False)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        head = _template(tok, messages[:i], True) if i else ""
        upto = _template(tok, messages[:i + 1], False)
        if full.startswith(upto) and upto.startswith(head) and len(head) >= cursor:
            spans.append((len(head), len(upto)))
            cursor = len(upto)
            continue
        # templates that rewrite earlier turns (Qwen3 drops old <think> blocks): find the
        # content itself after the previous turn
        start = full.find(str(m.get("content", "")), cursor)
        if start < 0:
            raise TrainerConfigError(f"assistant turn {i} not found in the rendered chat")
        cursor = start + len(str(m.get("content", "")))
        spans.append((start, cursor))
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask = [int(any(a <= s < b for a, b in spans)) for s, _e in enc["offset_mapping"]]
    return ids, mask


def prompt_messages(rec: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    """The conversation a target should answer: ``messages`` without a trailing assistant
    turn, or ``prompt`` as one user turn."""
    if "messages" in rec:
        msgs = list(rec["messages"])
        while msgs and msgs[-1].get("role") == "assistant":
            msgs.pop()
        return msgs
    if "prompt" in rec:
        return [{"role": "user", "content": str(rec["prompt"])}]
    raise TrainerConfigError("a prompt record needs 'messages' or 'prompt'")


def jsonl_files(path: str) -> list[pathlib.Path]:
    """``path`` itself, or the ``*.jsonl`` files of a directory in name order.

    Raises:
        TrainerConfigError: nothing to read there.
    """
    p = pathlib.Path(path)
    files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p] if p.is_file() else []
    if not files:
        raise TrainerConfigError(f"--data {path}: no such file, or a directory without *.jsonl")
    return files


def iter_json(path: str) -> t.Iterator[tuple[str, dict[str, t.Any]]]:
    """(``file:line``, record) for every non-empty line.

    Raises:
        TrainerConfigError: a line is not a JSON object.
    """
    for f in jsonl_files(path):
        with f.open() as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    raise TrainerConfigError(f"{f}:{n}: not JSON ({e})") from None
                if not isinstance(rec, dict):
                    raise TrainerConfigError(f"{f}:{n}: not a JSON object")
                yield f"{f}:{n}", rec


def iter_records(path: str, tokenizer: str | None = None) -> t.Iterator[Record]:
    """Training records of a JSONL file or shard directory.

    Raises:
        TrainerConfigError: a malformed record, or chat/text records without a tokenizer.
    """
    tok = None
    for where, rec in iter_json(path):
        if "input_ids" in rec:
            ids = [int(x) for x in rec["input_ids"]]
            mask = [int(bool(x)) for x in rec.get("loss_mask", [1] * len(ids))]
        elif "messages" in rec or "text" in rec:
            if tokenizer is None:
                raise TrainerConfigError(f"{where}: 'messages'/'text' records need --tokenizer")
            tok = tok or load_tokenizer(tokenizer)
            if "messages" in rec:
                ids, mask = render_messages(tok, list(rec["messages"]))
            else:
                ids = list(tok(rec["text"])["input_ids"])
                mask = [1] * len(ids)
        else:
            raise TrainerConfigError(f"{where}: needs 'input_ids', 'messages' or 'text'")
        if len(mask) != len(ids):
            raise TrainerConfigError(f"{where}: loss_mask length != input_ids length")
        yield ids, mask
