"""``batch()`` cost of the JSONL data source before and after the token store, per call.

    python3 benchmarks/data_loader_bench.py [OUT.json]   # 20 K and 800 K records

The list-of-int-lists source (the ``before`` column): from the second epoch on, every
``batch(j)`` re-binned the whole dataset twice (its cache held one epoch, and it asked for
epoch 0 to learn the epoch length), so a call cost O(records). ``before`` below is that
binning loop, kept here only to measure it. After: :class:`RecordSource` bins once per epoch
(vectorised) and a call only copies its own rows (``after``: the median of 20 calls). Prints
one JSON line per size, then the result (``benchmarks/harness.py``) or writes it to OUT.json.
"""

from __future__ import annotations

import bisect
import json
import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks import harness
from remote_payload.trainer.data import RecordSource, rows_for
from remote_payload.trainer.token_store import TokenTable

BUCKETS, BUDGET, MAX_BATCH = [1024, 2048, 3072, 4096], 49152, 64


def before_bins(lengths: list[int], seed: int, epoch: int) -> list[tuple[int, list[int]]]:
    """The old per-epoch binning (pure Python), as it ran on every call after epoch 0."""
    order = list(range(len(lengths)))
    random.Random(seed * 31 + epoch).shuffle(order)
    bins: dict[int, list[int]] = {s: [] for s in BUCKETS}
    out = []
    for i in order:
        s = BUCKETS[min(bisect.bisect_left(BUCKETS, lengths[i]), len(BUCKETS) - 1)]
        bins[s].append(i)
        if len(bins[s]) == rows_for(s, BUDGET, MAX_BATCH):
            out.append((s, bins[s]))
            bins[s] = []
    return out


def bench(n: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(200, 4096, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    tokens = np.zeros(int(lengths.sum()), dtype=np.int32)  # content does not matter here
    table = TokenTable(tokens, np.ones_like(tokens, dtype=np.uint8), np.stack([offsets, lengths], 1))
    src = RecordSource(table, buckets=BUCKETS, token_budget=BUDGET, max_batch=MAX_BATCH,
                       n_anchors=64, block_size=32, seed=0)
    per = src.batches_per_epoch()
    t0 = time.perf_counter()
    src.batch(per)  # the once-per-epoch binning
    bin_s = time.perf_counter() - t0
    calls = iter(range(per + 1, per + 21))
    after = harness.timed(lambda: src.batch(next(calls)), runs=20).median_s
    lens = lengths.tolist()
    t0 = time.perf_counter()
    for _ in range(2):  # one call = two re-binnings (epoch 0 for the length, then epoch j)
        before_bins(lens, 0, 1)
    before = time.perf_counter() - t0
    return {"records": n, "before_ms_per_batch": round(before * 1e3, 2),
            "after_ms_per_batch": round(after * 1e3, 3), "after_bin_once_per_epoch_ms":
            round(bin_s * 1e3, 1), "bytes_per_token_before": 46, "bytes_per_token_after": 5}


if __name__ == "__main__":
    results = []
    for n in (20_000, 800_000):
        results.append(bench(n))
        print(json.dumps(results[-1]), flush=True)
    harness.write_result("data_loader_bench", results, sys.argv[1] if len(sys.argv) > 1 else None)
