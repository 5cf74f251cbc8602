"""Read a checkpoint's safetensors files straight into device memory, several streams at once.

Why not ``safetensors.safe_open(..., device="cuda")``: it maps each file and copies tensor by
tensor from pageable memory, one page fault at a time, on one thread. A disk (or the page
cache) gives its rate only to several large reads in flight: on the H200 machine, buffered
reads after the pages were dropped gave 1.34 GB/s on one thread and 1.9 GB/s on four
(docs/benchmarks.md). Here each file's wanted byte range is cut into chunks that
:data:`READERS` threads read with ``os.preadv`` (which releases the GIL) into pinned buffers
of their own, each chunk copied asynchronously into one device buffer per file on the
thread's own CUDA stream while the thread reads its next chunk. The tensors are then cut from
those buffers on the device. Host memory stays at ``READERS`` x :data:`CHUNK` whatever the
checkpoint's size; no CPU copy of the weights is made. On CPU the threads read straight into
the tensors' memory.

Every header is checked against its file before a byte of data is read (:func:`header`), so
a damaged checkpoint is named before any device memory is spent on it.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import pathlib
import struct
import threading
import typing as t

import torch

from .config import TrainerConfigError

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
#: bytes per read: large enough to stream, small enough that every reader holds one pinned
CHUNK = 64 << 20
#: reader threads (the H200 machine's disk gave its best rate to four streams)
READERS = 4
_HEADER_LIMIT = 100 << 20  # safetensors' own limit: 100 MB of header


class _Span(t.NamedTuple):
    """One chunk: ``size`` bytes at ``offset`` of ``fd`` into ``dst`` from byte ``at``."""

    fd: int
    name: str
    offset: int
    dst: torch.Tensor
    at: int
    size: int


def load(root: pathlib.Path, device: torch.device, dtype: torch.dtype | None = None,
         keys: set[str] | None = None, read: list[int] | None = None, *,
         readers: int = 0, chunk: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file under ``root`` (or those in ``keys``),
    on ``device``, floating tensors cast to ``dtype``. ``read``, when given, gets the number of
    bytes read per file appended (the span from the first to the last wanted tensor).
    ``readers`` and ``chunk`` (0: :data:`READERS`, :data:`CHUNK`) are for tests and benchmarks.

    Raises:
        TrainerConfigError: no safetensors file, one whose header is not safetensors', or
            one that changed size while it was read.
    """
    readers, chunk = readers or READERS, chunk or CHUNK
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise TrainerConfigError(f"--target-path {root}: no *.safetensors files")
    opened: list[int] = []
    try:
        plan: list[tuple[int, dict[str, t.Any], torch.Tensor]] = []
        spans: list[_Span] = []
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            opened.append(fd)
            hlen, entries = header(fd, f)
            wanted = {k: v for k, v in entries.items() if keys is None or k in keys}
            if not wanted:
                continue
            lo = min(v["data_offsets"][0] for v in wanted.values())
            hi = max(v["data_offsets"][1] for v in wanted.values())
            if read is not None:
                read.append(hi - lo)
            buf = torch.empty(hi - lo, dtype=torch.uint8, device=device)
            plan.append((lo, wanted, buf))
            spans += [_Span(fd, str(f), 8 + hlen + lo + at, buf, at, min(chunk, hi - lo - at))
                      for at in range(0, hi - lo, chunk)]
        _read_all(spans, device, readers, chunk)
        out: dict[str, torch.Tensor] = {}
        for lo, wanted, buf in plan:
            for name, v in wanted.items():
                a, b = v["data_offsets"]
                x = buf[a - lo:b - lo].clone().view(DTYPES[v["dtype"]]).view(v["shape"])
                out[name] = x.to(dtype) if dtype is not None and x.is_floating_point() else x
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out
    finally:
        for fd in opened:
            os.close(fd)


def header(fd: int, f: pathlib.Path) -> tuple[int, dict[str, t.Any]]:
    """A safetensors header, every entry checked against the file before anything is read.

    Raises:
        TrainerConfigError: not safetensors' layout (length, JSON, dtypes, offsets, sizes).
    """
    size = os.fstat(fd).st_size

    def bad(why: str) -> TrainerConfigError:
        return TrainerConfigError(f"--target-path {f}: not a safetensors file ({why})")

    try:
        (hlen,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    except struct.error:
        raise bad("shorter than its 8-byte header length") from None
    if hlen > min(size - 8, _HEADER_LIMIT):
        raise bad(f"header length {hlen} in a file of {size} bytes")
    try:
        entries = json.loads(os.pread(fd, hlen, 8))
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"header is not JSON: {e}") from None
    if not isinstance(entries, dict):
        raise bad("header is not a JSON object")
    entries.pop("__metadata__", None)
    data = size - 8 - hlen
    for name, v in entries.items():
        try:
            dtype = DTYPES[v["dtype"]]
            a, b = (int(x) for x in v["data_offsets"])
            n = math.prod(int(d) for d in v["shape"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"entry {name!r}: dtype, shape or offsets unreadable") from None
        if not 0 <= a <= b <= data or b - a != n * dtype.itemsize:
            raise bad(f"entry {name!r}: bytes {a}..{b} for {n} x {v['dtype']} in {data} bytes")
    return hlen, entries


def _read_all(spans: list[_Span], device: torch.device, readers: int, chunk: int) -> None:
    """Read every span on up to ``readers`` threads; the first failure stops the others
    (and so does Ctrl-C: the threads see ``stop`` before their next chunk)."""
    if not spans:
        return
    todo = iter(spans)
    lock, stop = threading.Lock(), threading.Event()

    def next_span() -> _Span | None:
        with lock:
            return None if stop.is_set() else next(todo, None)

    workers = min(readers, len(spans))
    reader = _cuda_reader if device.type == "cuda" else _cpu_reader

    def run() -> None:
        try:
            reader(next_span, device, chunk)
        except BaseException:
            stop.set()  # the others take no new chunk
            raise

    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="ckpt-read")
    try:
        futures = [pool.submit(run) for _ in range(workers)]
        for fut in concurrent.futures.as_completed(futures):
            fut.result()
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True)


def _cpu_reader(next_span: t.Callable[[], _Span | None], _device: torch.device,
                _chunk: int) -> None:
    while (s := next_span()) is not None:
        _pread_full(s, memoryview(t.cast(t.Any, s.dst[s.at:s.at + s.size].numpy())).cast("B"))


def _cuda_reader(next_span: t.Callable[[], _Span | None], device: torch.device,
                 chunk: int) -> None:
    stage = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
    view = memoryview(t.cast(t.Any, stage.numpy())).cast("B")
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    copied: t.Any = None  # the event of the last copy out of ``stage``
    while (s := next_span()) is not None:
        if copied is not None:
            copied.synchronize()  # ``stage`` is free again
        _pread_full(s, view[:s.size])
        with torch.cuda.stream(stream):
            s.dst[s.at:s.at + s.size].copy_(stage[:s.size], non_blocking=True)
            copied = stream.record_event()
    if copied is not None:
        copied.synchronize()


def _pread_full(s: _Span, into: memoryview) -> None:
    got = 0
    while got < s.size:
        n = os.preadv(s.fd, [into[got:]], s.offset + got)
        if not n:
            raise TrainerConfigError(f"--target-path {s.name}: truncated while read")
        got += n
