"""Token records as flat numpy arrays with an index, in memory or memory-mapped from disk.

Why: Python int lists cost ~46 bytes per token (a 1e9-token set would need ~46 GB on every
rank); here a token costs 4 bytes (int32) + 1 (loss mask), and a store written by
``python -m remote_payload.trainer pack DATA OUT`` is memory-mapped, so every rank of a
node shares one page-cache copy and startup reads only the index.

Layout of a store directory: ``tokens.bin`` (int32), ``mask.bin`` (uint8), ``index.npy``
((n, 2) int64: offset, length) and ``meta.json`` ({"format", "records", "tokens"}).
"""

from __future__ import annotations

import json
import os
import pathlib
import typing as t

import numpy as np

from .. import safe_write
from .config import TrainerConfigError

FORMAT = 1


class TokenTable:
    """Records ``i`` = ``tokens[offsets[i] : offsets[i] + lengths[i]]`` (and its mask)."""

    def __init__(self, tokens: np.ndarray, mask: np.ndarray, index: np.ndarray):
        self.tokens, self.mask = tokens, mask
        self.offsets = np.ascontiguousarray(index[:, 0])
        self.lengths = np.ascontiguousarray(index[:, 1])

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def record(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        o, n = int(self.offsets[i]), int(self.lengths[i])
        return self.tokens[o:o + n], self.mask[o:o + n]

    @classmethod
    def from_records(cls, records: t.Iterable[tuple[t.Sequence[int], t.Sequence[int]]],
                     min_len: int = 0) -> TokenTable:
        """In memory; records of ``min_len`` tokens or fewer are dropped."""
        toks: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        for ids, m in records:
            if len(ids) > min_len:
                toks.append(np.asarray(ids, dtype=np.int32))
                masks.append(np.asarray(m, dtype=np.uint8))
        lengths = np.array([len(x) for x in toks], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if toks else \
            np.zeros(0, dtype=np.int64)
        tokens = np.concatenate(toks) if toks else np.zeros(0, dtype=np.int32)
        mask = np.concatenate(masks) if masks else np.zeros(0, dtype=np.uint8)
        return cls(tokens, mask, np.stack([offsets, lengths], axis=1))


def is_store(path: str) -> bool:
    return (pathlib.Path(path) / "meta.json").is_file() and (pathlib.Path(path) / "index.npy").is_file()


#: the files of a store: a directory holding exactly these and no marker is a store
STORE_FILES = ("tokens.bin", "mask.bin", "index.npy", "meta.json")
#: the marker's kind of a store directory (:mod:`remote_payload.safe_write`)
KIND = "token-store"


def _unmarked_store(out: str) -> bool:
    """Whether ``out`` is a store without opsctl's marker: exactly :data:`STORE_FILES`,
    regular files (a store written by hand or copied without its marker). Packing into it
    again replaces what ``pack`` makes, nothing else."""
    try:
        with os.scandir(out) as it:
            entries = {e.name: e.is_file(follow_symlinks=False) for e in it}
    except OSError:
        return False
    return sorted(entries) == sorted(STORE_FILES) and all(entries.values())


def write_store(out: str, records: t.Iterable[tuple[t.Sequence[int], t.Sequence[int]]],
                min_len: int = 0, *, force: bool = False) -> dict[str, int]:
    """Stream ``records`` into a store at ``out``; returns its meta.

    Written whole or not at all (:func:`remote_payload.safe_write.new_directory`): filled
    under a temporary sibling, then swapped in; a failure or a kill at any step leaves the
    previous store readable (a killed writer's temporary sibling is removed by the next
    write). ``out`` is refused when it is a file, a link, the current directory, a home or
    ``/``, or a directory of someone else's files (``force`` replaces the latter).

    Raises:
        DestinationRefused: the rule and the path; nothing was written.
        WriteFailed: the disk said no (the previous store is kept).
    """
    force = force or _unmarked_store(out)
    safe_write.check_directory(out, kind=KIND, force=force)  # before a record is read
    with safe_write.new_directory(out, kind=KIND, force=force) as tmp:
        index: list[tuple[int, int]] = []
        total = 0
        with open(tmp / "tokens.bin", "wb") as ft, open(tmp / "mask.bin", "wb") as fm:
            for ids, m in records:
                if len(ids) <= min_len:
                    continue
                np.asarray(ids, dtype=np.int32).tofile(ft)
                np.asarray(m, dtype=np.uint8).tofile(fm)
                index.append((total, len(ids)))
                total += len(ids)
        np.save(tmp / "index.npy", np.array(index, dtype=np.int64).reshape(-1, 2))
        meta = {"format": FORMAT, "records": len(index), "tokens": total}
        (tmp / "meta.json").write_text(json.dumps(meta))
    return meta


def open_store(path: str) -> TokenTable:
    """Memory-map a store.

    Raises:
        TrainerConfigError: not a store, or another format.
    """
    p = pathlib.Path(path)
    try:
        meta = json.loads((p / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise TrainerConfigError(f"--data {path}: not a token store ({e})") from None
    if meta.get("format") != FORMAT:
        raise TrainerConfigError(f"--data {path}: store format {meta.get('format')!r}, "
                                 f"expected {FORMAT}")
    index = np.load(p / "index.npy")
    if meta["tokens"] == 0:
        return TokenTable(np.zeros(0, np.int32), np.zeros(0, np.uint8), index.reshape(-1, 2))
    tokens = np.memmap(p / "tokens.bin", dtype=np.int32, mode="r")
    mask = np.memmap(p / "mask.bin", dtype=np.uint8, mode="r")
    return TokenTable(tokens, mask, index)
