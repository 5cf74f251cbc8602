"""Batches: token records or synthetic streams, packed to a token budget in fixed shape buckets.

Every batch of bucket S has exactly ``rows(S) = min(max_batch, token_budget // S)`` rows
and N anchors per row, so the drafter sees one shape per bucket and torch.compile
compiles at most ``len(buckets)`` graphs. Batch ``j`` is a pure function of (seed, j),
which makes resume exact and lets a target rank in the split topology produce batch j
for any drafter rank.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

import numpy as np
import torch

from .config import TrainerConfigError
from .token_store import TokenTable


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
    """Per row, up to ``n`` distinct sorted anchors; missing ones get valid=False.

    The reference's rule (SpecForge DFlash): anchor a needs the loss mask at a and at a + 1
    (1 <= a, a + 1 < len), so every anchor has at least one trained position. Block positions
    past the response or the sequence are not a reason to drop the anchor; they get weight 0
    (:func:`block_inputs`), so a 12-token answer and its end-of-turn token are trained."""
    del block_size  # the block may run past the response: see the docstring
    bsz = loss_mask.shape[0]
    anchors = torch.zeros(bsz, n, dtype=torch.long)
    valid = torch.zeros(bsz, n, dtype=torch.bool)
    for r in range(bsz):
        length = int(lengths[r])
        if length < 3:
            continue
        lm = loss_mask[r, :length]
        ok = lm[1:-1] & lm[2:]  # anchor a = 1 .. length-2: mask at a and a + 1
        cand = ok.nonzero().squeeze(1) + 1
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

    def _pack(self, table: TokenTable, idx: np.ndarray, seq_len: int, j: int) -> Batch:
        rows = rows_for(seq_len, self.budget, self.max_batch)
        ids = np.zeros((rows, seq_len), dtype=np.int64)
        lm = np.zeros((rows, seq_len), dtype=np.bool_)
        lengths = [0] * rows
        for r, i in enumerate(idx[:rows]):
            toks, mask = table.record(int(i))
            m = min(len(toks), seq_len)
            ids[r, :m] = toks[:m]
            lm[r, :m] = mask[:m]
            lengths[r] = m
        lm_t = torch.from_numpy(lm)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + j)
        anchors, valid = sample_anchors(lm_t, lengths, self.n, self.k, gen)
        return Batch(torch.from_numpy(ids), lm_t, anchors, valid, sum(lengths))


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


class RecordSource(_Base):
    """Records from a :class:`TokenTable` (in memory, or a memory-mapped store). Each epoch
    shuffles, bins by bucket and emits full batches in the order they fill; a partial bin
    at epoch end is dropped. Binning is vectorised and done once per epoch (the last epoch
    is cached), so ``batch(j)`` only copies its own rows: ~0.1 ms, whatever the data size."""

    def __init__(self, table: TokenTable, where: str = "--data", **kw: t.Any):
        super().__init__(**kw)
        self.table = table
        self._epoch: tuple[int, np.ndarray, np.ndarray] | None = None
        buckets = np.asarray(self.buckets)
        self._bucket_of = np.minimum(np.searchsorted(buckets, table.lengths, side="left"),
                                     len(buckets) - 1)
        counts = np.bincount(self._bucket_of, minlength=len(buckets))
        self.per_epoch = int(sum(c // rows_for(s, self.budget, self.max_batch)
                                 for c, s in zip(counts.tolist(), self.buckets, strict=True)))
        if not self.per_epoch:
            raise TrainerConfigError(
                f"{where}: {len(table)} usable records make no full batch; lower "
                "--token-budget/--max-batch or add data")

    def batches_per_epoch(self) -> int:
        return self.per_epoch

    def _bins(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(bucket of each batch, (batches, max rows) record ids) of one epoch."""
        if self._epoch is not None and self._epoch[0] == epoch:
            return self._epoch[1], self._epoch[2]
        order = np.random.default_rng([self.seed, 31, epoch]).permutation(len(self.table))
        b_of = self._bucket_of[order]
        width = max(rows_for(s, self.budget, self.max_batch) for s in self.buckets)
        done_at, bucket, members = [], [], []
        for bi, s in enumerate(self.buckets):
            rows = rows_for(s, self.budget, self.max_batch)
            where = np.nonzero(b_of == bi)[0]  # positions in the shuffled order
            full = len(where) // rows
            if not full:
                continue
            chunks = order[where[: full * rows]].reshape(full, rows)
            padded = np.full((full, width), -1, dtype=np.int64)
            padded[:, :rows] = chunks
            done_at.append(where[rows - 1::rows][:full])  # a batch is emitted when it fills
            bucket.append(np.full(full, bi))
            members.append(padded)
        by_fill = np.argsort(np.concatenate(done_at), kind="stable")
        out = (np.concatenate(bucket)[by_fill], np.concatenate(members)[by_fill])
        self._epoch = (epoch, *out)
        return out

    def batch(self, j: int) -> Batch:
        bucket, members = self._bins(j // self.per_epoch)
        k = j % self.per_epoch
        seq_len = self.buckets[int(bucket[k])]
        return self._pack(self.table, members[k], seq_len, j)


def make_source(data: str, vocab_size: int, tokenizer: str | None = None, **kw: t.Any) -> Source:
    """``synthetic``; a store directory made by ``pack`` (memory-mapped); or JSONL (a file or
    a directory of ``*.jsonl`` shards, e.g. ``regenerate``'s output), read into memory.

    Raises:
        TrainerConfigError: unreadable data, or too little of it for one batch.
    """
    from . import chat_data, token_store

    if data == "synthetic":
        return SyntheticSource(vocab_size, **kw)
    if token_store.is_store(data):
        table = token_store.open_store(data)
    else:
        table = TokenTable.from_records(chat_data.iter_records(data, tokenizer),
                                        min_len=kw["block_size"])
    bad = int(table.tokens.max()) if len(table.tokens) else 0
    if bad >= vocab_size:
        raise TrainerConfigError(f"--data {data}: token id {bad} >= the target's vocabulary "
                                 f"({vocab_size})")
    return RecordSource(table, where=f"--data {data}", **kw)


def block_inputs(batch: Batch, block_size: int, mask_token_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block token ids, positions, targets and loss mask, each (B, N*K).

    Block b of a row is [token at anchor, MASK x (K-1)] at positions anchor..anchor+K-1;
    block position k predicts the token at anchor + k. Its loss mask is 0 past the response
    (padding has mask 0) and past the padded length, so those positions get weight 0."""
    bsz, n = batch.anchors.shape
    k = torch.arange(block_size, device=batch.anchors.device)
    pos = batch.anchors.unsqueeze(-1) + k  # (B, N, K)
    seq_len = batch.input_ids.shape[1]
    pos_c = pos.clamp(max=seq_len - 1).reshape(bsz, n * block_size)
    targets = batch.input_ids.gather(1, pos_c)
    # positions past the sequence are clamped for the gather: they must not borrow its mask
    lm = batch.loss_mask.gather(1, pos_c) & (pos.reshape(bsz, n * block_size) < seq_len)
    ids = torch.full_like(targets, mask_token_id).view(bsz, n, block_size)
    ids[:, :, 0] = batch.input_ids.gather(1, batch.anchors)
    return ids.view(bsz, n * block_size), pos.reshape(bsz, n * block_size), targets, lm
