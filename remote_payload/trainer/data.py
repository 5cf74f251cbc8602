"""Batches: JSONL or synthetic token streams, packed to a token budget in fixed shape buckets.

Every batch of bucket S has exactly ``rows(S) = min(max_batch, token_budget // S)`` rows
and N anchors per row, so the drafter sees one shape per bucket and torch.compile
compiles at most ``len(buckets)`` graphs. Batch ``j`` is a pure function of (seed, j),
which makes resume exact and lets a target rank in the split topology produce batch j
for any drafter rank.
"""

from __future__ import annotations

import bisect
import json
import pathlib
import random
import typing as t
from dataclasses import dataclass

import torch

from .config import TrainerConfigError


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, S) long, padded with 0
    loss_mask: torch.Tensor  # (B, S) bool
    anchors: torch.Tensor  # (B, N) long, 0 where invalid
    valid: torch.Tensor  # (B, N) bool keep-mask
    n_tokens: int  # real (unpadded) tokens in the batch

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(self.input_ids.to(device, non_blocking=nb),
                     self.loss_mask.to(device, non_blocking=nb),
                     self.anchors.to(device, non_blocking=nb), self.valid.to(device, non_blocking=nb),
                     self.n_tokens)


def rows_for(seq_len: int, token_budget: int, max_batch: int) -> int:
    return max(1, min(max_batch, token_budget // seq_len))


def sample_anchors(loss_mask: torch.Tensor, lengths: t.Sequence[int], n: int, block_size: int,
                   gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, up to ``n`` distinct sorted anchors a with 1 <= a, a + K <= len and the loss
    mask set on all K-1 predicted positions; missing ones get valid=False."""
    bsz = loss_mask.shape[0]
    anchors = torch.zeros(bsz, n, dtype=torch.long)
    valid = torch.zeros(bsz, n, dtype=torch.bool)
    lm = loss_mask.long()
    csum = torch.cat([torch.zeros(bsz, 1, dtype=torch.long), lm.cumsum(1)], dim=1)
    for r in range(bsz):
        last = lengths[r] - block_size  # largest anchor with the whole block in range
        if last < 1:
            continue
        a = torch.arange(1, last + 1)
        ok = (csum[r, a + block_size] - csum[r, a + 1]) == block_size - 1
        cand = a[ok]
        if cand.numel() == 0:
            continue
        pick = cand[torch.randperm(cand.numel(), generator=gen)[:n]].sort().values
        anchors[r, : pick.numel()] = pick
        valid[r, : pick.numel()] = True
    return anchors, valid


class Source(t.Protocol):
    def batch(self, j: int) -> Batch: ...

    def shapes(self) -> list[tuple[int, int]]: ...


class _Base:
    def __init__(self, buckets: t.Sequence[int], token_budget: int, max_batch: int,
                 n_anchors: int, block_size: int, seed: int):
        self.buckets = sorted(buckets)
        self.budget, self.max_batch = token_budget, max_batch
        self.n, self.k, self.seed = n_anchors, block_size, seed

    def shapes(self) -> list[tuple[int, int]]:
        """(rows, seq_len) of every bucket: the complete set of compiled shapes."""
        return [(rows_for(s, self.budget, self.max_batch), s) for s in self.buckets]

    def _pack(self, seqs: list[tuple[list[int], list[int]]], seq_len: int, j: int) -> Batch:
        rows = rows_for(seq_len, self.budget, self.max_batch)
        ids = torch.zeros(rows, seq_len, dtype=torch.long)
        lm = torch.zeros(rows, seq_len, dtype=torch.bool)
        lengths = [0] * rows
        for r, (toks, mask) in enumerate(seqs[:rows]):
            m = min(len(toks), seq_len)
            ids[r, :m] = torch.tensor(toks[:m])
            lm[r, :m] = torch.tensor(mask[:m], dtype=torch.bool)
            lengths[r] = m
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + j)
        anchors, valid = sample_anchors(lm, lengths, self.n, self.k, gen)
        return Batch(ids, lm, anchors, valid, sum(lengths))


class SyntheticSource(_Base):
    """Learnable arithmetic sequences: x_t = (start + stride * t) mod (V - 1), stride in
    {1, 2, 3}; a random-length prompt is excluded from the loss. Batch j uses bucket
    ``buckets[j % len(buckets)]`` and fills it completely (benchmark-friendly)."""

    def __init__(self, vocab_size: int, **kw: t.Any):
        super().__init__(**kw)
        self.vocab = vocab_size - 1  # keep the last id free for MASK

    def batch(self, j: int) -> Batch:
        seq_len = self.buckets[j % len(self.buckets)]
        rows = rows_for(seq_len, self.budget, self.max_batch)
        g = torch.Generator().manual_seed(self.seed * 7_919 + j)
        start = torch.randint(0, self.vocab, (rows, 1), generator=g)
        stride = torch.randint(1, 4, (rows, 1), generator=g)
        ids = (start + stride * torch.arange(seq_len)) % self.vocab
        prompt = torch.randint(1, max(2, seq_len // 4), (rows, 1), generator=g)
        lm = torch.arange(seq_len) >= prompt
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + j)
        anchors, valid = sample_anchors(lm, [seq_len] * rows, self.n, self.k, gen)
        return Batch(ids, lm, anchors, valid, rows * seq_len)


class JsonlSource(_Base):
    """``{"input_ids": [...], "loss_mask": [...]}`` per line (``loss_mask`` optional), or
    ``{"text": ...}`` with a local tokenizer. Each epoch shuffles, bins by bucket and emits
    full batches; a partial bin at epoch end is dropped."""

    def __init__(self, path: str, tokenizer: str | None = None, **kw: t.Any):
        super().__init__(**kw)
        p = pathlib.Path(path)
        if not p.is_file():
            raise TrainerConfigError(f"--data {path}: no such file")
        tok = None
        self.records: list[tuple[list[int], list[int]]] = []
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise TrainerConfigError(f"{path}:{n}: not JSON ({e})") from None
            if "input_ids" in rec:
                ids = [int(x) for x in rec["input_ids"]]
            elif "text" in rec:
                if tokenizer is None:
                    raise TrainerConfigError(f"{path}:{n}: 'text' records need --tokenizer")
                if tok is None:
                    from transformers import AutoTokenizer

                    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
                ids = list(tok(rec["text"])["input_ids"])
            else:
                raise TrainerConfigError(f"{path}:{n}: needs 'input_ids' or 'text'")
            mask = [int(bool(x)) for x in rec.get("loss_mask", [1] * len(ids))]
            if len(mask) != len(ids):
                raise TrainerConfigError(f"{path}:{n}: loss_mask length != input_ids length")
            if len(ids) > self.k:
                self.records.append((ids, mask))
        self._epoch: tuple[int, list[tuple[int, list[int]]]] | None = None
        if not self._batches(0):
            raise TrainerConfigError(
                f"--data {path}: {len(self.records)} usable records make no full batch; lower "
                "--token-budget/--max-batch or add data")

    def _batches(self, epoch: int) -> list[tuple[int, list[int]]]:
        if self._epoch is not None and self._epoch[0] == epoch:
            return self._epoch[1]
        order = list(range(len(self.records)))
        random.Random(self.seed * 31 + epoch).shuffle(order)
        bins: dict[int, list[int]] = {s: [] for s in self.buckets}
        out: list[tuple[int, list[int]]] = []
        for i in order:
            n = len(self.records[i][0])
            s = self.buckets[min(bisect.bisect_left(self.buckets, n), len(self.buckets) - 1)]
            bins[s].append(i)
            if len(bins[s]) == rows_for(s, self.budget, self.max_batch):
                out.append((s, bins[s]))
                bins[s] = []
        self._epoch = (epoch, out)
        return out

    def batch(self, j: int) -> Batch:
        per_epoch = len(self._batches(0))
        seq_len, idx = self._batches(j // per_epoch)[j % per_epoch]
        return self._pack([self.records[i] for i in idx], seq_len, j)


def make_source(data: str, vocab_size: int, tokenizer: str | None = None, **kw: t.Any) -> Source:
    if data == "synthetic":
        return SyntheticSource(vocab_size, **kw)
    return JsonlSource(data, tokenizer, **kw)


def block_inputs(batch: Batch, block_size: int, mask_token_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block token ids, positions, targets and loss mask, each (B, N*K).

    Block b of a row is [token at anchor, MASK x (K-1)] at positions anchor..anchor+K-1;
    block position k predicts the token at anchor + k."""
    bsz, n = batch.anchors.shape
    k = torch.arange(block_size, device=batch.anchors.device)
    pos = batch.anchors.unsqueeze(-1) + k  # (B, N, K)
    seq_len = batch.input_ids.shape[1]
    pos_c = pos.clamp(max=seq_len - 1).reshape(bsz, n * block_size)
    targets = batch.input_ids.gather(1, pos_c)
    lm = batch.loss_mask.gather(1, pos_c)
    ids = torch.full_like(targets, mask_token_id).view(bsz, n, block_size)
    ids[:, :, 0] = batch.input_ids.gather(1, batch.anchors)
    return ids.view(bsz, n * block_size), pos.reshape(bsz, n * block_size), targets, lm
