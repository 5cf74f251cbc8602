"""``python -m remote_payload.trainer regenerate``: the frozen target answers the prompts, and
its own answers become the drafter's training set (the paper trains on target-regenerated
responses, so the drafter learns the target's distribution, not the dataset's).

Launch::

    # one GPU (or CPU); shards of 1024 prompts, resumable: rerun the same command
    python -m remote_payload.trainer regenerate --target-path /models/Qwen3-8B \\
        --tokenizer /models/Qwen3-8B --prompts prompts.jsonl --out /data/regen
    # 8 GPUs: one process per GPU, shards dealt round-robin by RANK / WORLD_SIZE
    torchrun --nproc-per-node 8 -m remote_payload.trainer regenerate ...

Input records: ``{"messages": [...]}`` (a trailing assistant turn is dropped and answered
anew) or ``{"prompt": "..."}``. Output: ``OUT/shard-<k>.jsonl``, one record per prompt with
``messages`` (the answer as text) and the token-exact ``input_ids``/``loss_mask`` (loss on
the answer, its end-of-turn token included) that ``--data OUT`` trains on. A shard is
written to ``.shard-<k>.partial`` one batch at a time and renamed when complete; a rerun
skips complete shards and the finished records of a partial one.

Engines: vLLM when importable and on CUDA (``--engine auto``), else ``transformers``
``generate`` (greedy; static KV cache on CUDA, so decode shapes stay fixed).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time
import typing as t

import torch

from .. import wire
from .chat_data import iter_json, load_tokenizer, prompt_messages, render_prompt
from .config import TrainerConfigError
from .events import Log
from .target import add_target_args, inference_device, load_causal_lm

EVENT = wire.EVENT_REGENERATE


def parse(argv: t.Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m remote_payload.trainer regenerate",
                                description="Write the target's own answers to the prompts.")
    add_target_args(p)
    p.add_argument("--prompts", required=True, help="JSONL file or directory of prompt records")
    p.add_argument("--out", required=True, help="output directory of shard-<k>.jsonl files")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=64, help="prompts per generate call")
    p.add_argument("--shard-size", type=int, default=1024, help="prompts per output shard")
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts (0 = all)")
    p.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto")
    a = p.parse_args(argv)
    if min(a.max_new_tokens, a.batch_size, a.shard_size) < 1:
        raise TrainerConfigError("--max-new-tokens, --batch-size and --shard-size must be >= 1")
    return a


def _prompts(path: str, tok: t.Any, limit: int) -> list[tuple[list[dict[str, t.Any]], list[int]]]:
    out = []
    for where, rec in iter_json(path):
        try:
            msgs = prompt_messages(rec)
        except TrainerConfigError as e:
            raise TrainerConfigError(f"{where}: {e}") from None
        out.append((msgs, render_prompt(tok, msgs)))
        if limit and len(out) >= limit:
            break
    return out


class HfEngine:
    """Batched greedy ``generate`` of a ``transformers`` causal LM, prompts left-padded."""

    name = "hf"

    def __init__(self, path: str, device: torch.device, dtype: torch.dtype, tok: t.Any):
        self.model = load_causal_lm(path, device, dtype)
        self.device = device
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.eos = tok.eos_token_id

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        n = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), n), self.pad, dtype=torch.long)
        att = torch.zeros((len(prompts), n), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, n - len(p):] = torch.tensor(p)
            att[r, n - len(p):] = 1
        kw: dict[str, t.Any] = {}
        if self.device.type == "cuda":
            kw["cache_implementation"] = "static"
        out = self.model.generate(input_ids=ids.to(self.device), attention_mask=att.to(self.device),
                                  max_new_tokens=max_new, do_sample=False, pad_token_id=self.pad,
                                  eos_token_id=self.eos, **kw)
        res = []
        for row in out[:, n:].tolist():
            if self.eos in row:
                row = row[: row.index(self.eos) + 1]  # keep the end-of-turn token: it is trained
            res.append(row)
        return res


class VllmEngine:
    """vLLM offline inference (greedy) on this process's GPU."""

    name = "vllm"

    def __init__(self, path: str, tok: t.Any):
        from vllm import LLM  # type: ignore[import-not-found,unused-ignore]

        self.llm = LLM(model=path, tokenizer=path, tensor_parallel_size=1, enforce_eager=False)
        self.eos = tok.eos_token_id

    def generate(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        from vllm import SamplingParams  # type: ignore[import-not-found,unused-ignore]

        sp = SamplingParams(temperature=0.0, max_tokens=max_new)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


def _engine(a: argparse.Namespace, device: torch.device, dtype: torch.dtype, tok: t.Any) -> t.Any:
    if a.engine in ("auto", "vllm") and device.type == "cuda":
        try:
            import vllm  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
        except ImportError:
            if a.engine == "vllm":
                raise TrainerConfigError("--engine vllm: vllm is not importable here") from None
        else:
            return VllmEngine(a.target_path, tok)
    return HfEngine(a.target_path, device, dtype, tok)


def _done_lines(path: pathlib.Path) -> list[str]:
    """Complete lines of a partial shard (a line cut by a crash is dropped)."""
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.split("\n")
    return [x for x in lines[:-1] if x.strip()]  # the last piece has no newline: incomplete


def run(argv: t.Sequence[str], log: Log | None = None) -> dict[str, t.Any]:
    """Regenerate this rank's shards; returns the summary also sent as a ``regenerate`` event.

    Raises:
        TrainerConfigError: bad flags, prompts or paths.
    """
    a = parse(argv)
    log = log or Log(int(os.environ.get("RANK", "0")))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    device = inference_device(a.device, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if (a.dtype == "bf16" or (a.dtype == "auto" and cuda)) else torch.float32
    log.event(wire.EVENT_PHASE, phase="loading", detail="regenerate", budget_s=300.0)
    tok = load_tokenizer(a.tokenizer or a.target_path)
    prompts = _prompts(a.prompts, tok, a.limit)
    if not prompts:
        raise TrainerConfigError(f"--prompts {a.prompts}: no prompt records")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    n_shards = (len(prompts) + a.shard_size - 1) // a.shard_size
    assigned = [k for k in range(n_shards) if k % world == rank]
    mine = [k for k in assigned if not (out / f"shard-{k:06d}.jsonl").is_file()]
    engine = _engine(a, device, dtype, tok) if mine else None
    log.event(wire.EVENT_PHASE, phase="training", detail="regenerate", shards=len(mine),
              budget_s=600.0)
    new_tokens = records = 0
    t0 = time.perf_counter()
    for k in mine:
        part = out / f".shard-{k:06d}.partial"
        done = _done_lines(part)
        part.write_text("".join(x + "\n" for x in done))  # drop a torn last line
        chunk = prompts[k * a.shard_size:(k + 1) * a.shard_size]
        with part.open("a") as fh:
            for b in range(len(done), len(chunk), a.batch_size):
                batch = chunk[b:b + a.batch_size]
                answers = engine.generate([p for _, p in batch], a.max_new_tokens)  # type: ignore[union-attr,unused-ignore]
                for (msgs, p_ids), ans in zip(batch, answers, strict=True):
                    text = tok.decode([x for x in ans if x != tok.eos_token_id],
                                      skip_special_tokens=True)
                    rec = {"messages": [*msgs, {"role": "assistant", "content": text}],
                           "input_ids": p_ids + ans, "loss_mask": [0] * len(p_ids) + [1] * len(ans)}
                    fh.write(json.dumps(rec) + "\n")
                    new_tokens += len(ans)
                    records += 1
                fh.flush()
                secs = time.perf_counter() - t0
                log.event(EVENT, shard=k, records=records, tokens=new_tokens,
                          tok_s=round(new_tokens / max(secs, 1e-9), 1), budget_s=600.0)
        os.replace(part, out / f"shard-{k:06d}.jsonl")
    secs = time.perf_counter() - t0
    summary = {"engine": engine.name if engine else "none", "rank": rank, "world": world,
               "shards": len(mine), "skipped_shards": len(assigned) - len(mine),
               "records": records, "tokens": new_tokens,
               "seconds": round(secs, 3), "tok_s": round(new_tokens / secs, 1) if secs > 0 else 0.0}
    log.event(EVENT, done=True, **summary)
    log.say(f"regenerate: {records} records, {new_tokens} new tokens in {secs:.1f}s "
            f"({summary['tok_s']:,.0f} tok/s, engine {summary['engine']})")
    return summary
