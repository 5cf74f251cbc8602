"""A job's bounded, downsampled history: metrics and GPU load over time, plus marks.

The wrapper feeds a :class:`Recorder`: every step event (``loss``, ``tok_s``, ``mfu``,
``mem_gib``, ``feature_wait_pct``), every GPU sample (the 2 s ``gpus.json`` sampler: mean
utilisation, memory in use), and *marks* for what explains a bend in a curve: a recompile
(``compile`` events, ``phase: compiling``), a restart from a checkpoint (``resume``), an
error event, a hang, the end. It rewrites ``history.json`` in the job dir at most every
:data:`FLUSH_S` (write-then-rename), so readers never parse ``events.jsonl``.

Bounded by construction: rows are time buckets of one width; past :data:`CAP` rows the width
doubles and neighbours merge, so a week-long job's file stays at most ``CAP`` rows (~30 KB)
at a uniform resolution. ``status`` returns a further reduced copy (:data:`STATUS_POINTS`,
:func:`for_status`); the ``history`` verb returns the file's full resolution.

Verb ``history [--job ID] [--since S] [--points N]`` (docs/contracts.md). Stdlib only:
this runs in the container, on Python 3.10.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import typing as t

from remote_payload import safe_write

if t.TYPE_CHECKING:
    import threading

FILE = "history.json"
FORMAT = 1
CAP = 512  # rows kept (history verb, plots)
STATUS_POINTS = 120  # rows in a status reply (sparklines are narrower than this)
STATUS_MARKS = 24  # the latest marks in a status reply (the history verb has them all)
BUCKET0_S = 2.0  # the GPU sampler's interval: finer rows would hold nothing more
FLUSH_S = 5.0
MAX_MARKS = 64
# step-event fields kept, and the two the wrapper derives from GPU samples
STEP_FIELDS = ("loss", "tok_s", "mfu", "mem_gib", "feature_wait_pct")
GPU_FIELDS = ("gpu_util", "gpu_mem_gib")
FIELDS = STEP_FIELDS + GPU_FIELDS
STATUS_FIELDS = ("loss", "tok_s", "gpu_util")
# mark kinds; the CLI draws each with its own letter
MARK_COMPILE, MARK_RESTART, MARK_ERROR, MARK_HANG, MARK_END, MARK_DIAGNOSIS = (
    "compile", "restart", "error", "hang", "end", "diagnosis")


def _number(v: t.Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int past float range: a job's event is data, not trusted
        return None
    return f if math.isfinite(f) else None


def _round(v: float) -> float:
    """4 significant digits: a plot needs no more, and the file stays small."""
    return float(f"{v:.4g}")


class History:
    """Time buckets of width ``bucket_s`` holding per-field sums and counts, plus marks."""

    def __init__(self, cap: int = CAP, bucket_s: float = BUCKET0_S):
        if cap < 2:
            raise ValueError("cap must be at least 2")
        self.cap = cap
        self.bucket_s = bucket_s
        self.starts: list[float] = []
        self.sums: list[dict[str, list[float]]] = []  # field -> [sum, count]
        self.marks: list[dict[str, t.Any]] = []

    def add(self, at: float, values: t.Mapping[str, t.Any]) -> None:
        """Add one sample at time ``at``; non-numeric and unknown fields are ignored."""
        nums = {k: n for k, n in ((k, _number(values.get(k))) for k in FIELDS) if n is not None}
        if not nums:
            return
        start = math.floor(at / self.bucket_s) * self.bucket_s
        if self.starts and start <= self.starts[-1]:  # same bucket (or a late sample)
            row = self.sums[-1]
        else:
            self.starts.append(start)
            row = {}
            self.sums.append(row)
        for k, n in nums.items():
            acc = row.setdefault(k, [0.0, 0.0])
            acc[0] += n
            acc[1] += 1
        if len(self.starts) > self.cap:
            self._coarsen()

    def _coarsen(self) -> None:
        while len(self.starts) > self.cap:
            self.bucket_s *= 2
            starts: list[float] = []
            sums: list[dict[str, list[float]]] = []
            for s, row in zip(self.starts, self.sums, strict=True):
                start = math.floor(s / self.bucket_s) * self.bucket_s
                if starts and starts[-1] == start:
                    for k, (total, n) in row.items():
                        acc = sums[-1].setdefault(k, [0.0, 0.0])
                        acc[0] += total
                        acc[1] += n
                else:
                    starts.append(start)
                    sums.append({k: list(v) for k, v in row.items()})
            self.starts, self.sums = starts, sums

    def mark(self, at: float, kind: str, label: str = "") -> None:
        """A moment worth a line on the time axis; repeats of one kind within a bucket fold."""
        last = self.marks[-1] if self.marks else None
        if last and last["kind"] == kind and at - last["t"] < self.bucket_s:
            return
        self.marks.append({"t": round(at, 3), "kind": kind, "label": label[:120]})
        if len(self.marks) > MAX_MARKS:  # the first ones (the initial compile) and the latest
            del self.marks[8]

    def columns(self) -> dict[str, t.Any]:
        """``{"format", "bucket_s", "t": [...], <field>: [mean or None, ...], "marks"}``."""
        doc: dict[str, t.Any] = {"format": FORMAT, "bucket_s": self.bucket_s,
                                 "t": [round(s, 3) for s in self.starts]}
        for k in FIELDS:
            col = [(_round(row[k][0] / row[k][1]) if k in row and row[k][1] else None)
                   for row in self.sums]
            if any(v is not None for v in col):
                doc[k] = col
        doc["marks"] = list(self.marks)
        return doc


# --- reading -----------------------------------------------------------------------------


def reduce(doc: dict[str, t.Any], points: int, fields: t.Sequence[str] = FIELDS,
           since: float | None = None) -> dict[str, t.Any]:
    """``doc`` (columns) cut to ``t >= since`` and merged down to at most ``points`` rows.

    A merged row is the mean of the values it covers (None where it covers none).
    """
    ts: list[float] = list(doc.get("t") or [])
    lo = 0
    if since is not None:
        while lo < len(ts) and ts[lo] < since:
            lo += 1
    n = len(ts) - lo
    group = max(1, math.ceil(n / max(points, 1)))
    out: dict[str, t.Any] = {"format": doc.get("format", FORMAT),
                             "bucket_s": float(doc.get("bucket_s") or BUCKET0_S) * group,
                             "t": [ts[i] for i in range(lo, len(ts), group)]}
    for k in fields:
        col = doc.get(k)
        if not isinstance(col, list):
            continue
        merged: list[float | None] = []
        for i in range(lo, len(ts), group):
            vals = [v for v in col[i:i + group] if isinstance(v, int | float)]
            merged.append(_round(sum(vals) / len(vals)) if vals else None)
        out[k] = merged
    out["marks"] = [m for m in doc.get("marks") or []
                    if since is None or (m.get("t") or 0) >= since]
    return out


def read(job_path: str) -> dict[str, t.Any] | None:
    """The columns the wrapper wrote, or None (no file yet, an older wrapper, unreadable)."""
    try:
        with open(os.path.join(job_path, FILE), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("t"), list):
        return None
    return doc if all(_number(x) is not None for x in doc["t"]) else None


def for_status(job_path: str, diagnosis: t.Sequence[t.Mapping[str, t.Any]] = (),
               at: float | None = None) -> dict[str, t.Any] | None:
    """The small history a status reply carries (:data:`STATUS_POINTS` rows of loss, tok/s,
    GPU utilisation) with the marks, plus one for a current error-severity diagnosis.

    Never raises: a damaged file costs the sparklines, never the status."""
    doc = read(job_path)
    if doc is None:
        return None
    try:
        out = reduce(doc, STATUS_POINTS, STATUS_FIELDS)
        out["marks"] = out["marks"][-STATUS_MARKS:]
        add_diagnosis_marks(out, diagnosis, at)
    except Exception:
        return None
    return out


def add_diagnosis_marks(doc: dict[str, t.Any], diagnosis: t.Sequence[t.Mapping[str, t.Any]],
                        at: float | None) -> None:
    if at is None:
        return
    for d in diagnosis:
        if d.get("severity") == "error":
            doc["marks"] = [*doc.get("marks", []), {"t": round(at, 3), "kind": MARK_DIAGNOSIS,
                                                    "label": str(d.get("cause") or "")[:120]}]


# --- feeding ------------------------------------------------------------------------------


def feed_event(h: History, ev: t.Mapping[str, t.Any], at: float) -> None:
    """One event (as the wrapper records it) into ``h``: step metrics, or a mark."""
    kind = ev.get("event")
    if kind == "step":
        h.add(at, ev)
    elif kind == "compile":
        h.mark(at, MARK_COMPILE, str(ev.get("name") or "compile"))
    elif kind == "phase" and ev.get("phase") == "compiling":
        h.mark(at, MARK_COMPILE, "phase compiling")
    elif kind == "resume":
        h.mark(at, MARK_RESTART, f"resumed at step {ev.get('step')}")
    elif kind == "error":
        h.mark(at, MARK_ERROR, f"{ev.get('type') or 'error'}: {ev.get('message') or ''}")


def gpu_values(table: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, float]:
    """Mean utilisation (%) and total memory in use (GiB) of one GPU sample."""
    utils = [u for u in (_number(g.get("util_pct")) for g in table) if u is not None]
    mems = [m for m in (_number(g.get("mem_used_mib")) for g in table) if m is not None]
    out: dict[str, float] = {}
    if utils:
        out["gpu_util"] = sum(utils) / len(utils)
    if mems:
        out["gpu_mem_gib"] = sum(mems) / 1024.0
    return out


def from_events(path: str, cap: int = CAP) -> History:
    """Replay an ``events.jsonl`` (each line stamped ``_at`` by the wrapper) into a History:
    the history of a job whose wrapper predates ``history.json``."""
    h = History(cap)
    try:
        f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError:
        return h
    with f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and _number(ev.get("_at")) is not None:
                feed_event(h, ev, float(ev["_at"]))
    return h


class Recorder:
    """The wrapper's side: thread-safe feeding, throttled atomic writes of ``history.json``.

    Nothing here raises into the wrapper: a history bug or a full disk loses plot data,
    never the job or its state record.
    """

    def __init__(self, job_path: str, history: History | None = None):
        self.path = os.path.join(job_path, FILE)
        self.history = history or History()
        import threading  # here: `status` reads history without it (~1 ms of its start)

        self.lock = threading.Lock()
        self.write_lock = threading.Lock()  # the flush thread and the wrapper's final flush
        self.dirty = False
        self.last_flush = 0.0

    def on_event(self, ev: t.Mapping[str, t.Any], at: float | None = None) -> None:
        with self.lock, contextlib.suppress(Exception):
            feed_event(self.history, ev, time.time() if at is None else at)
            self.dirty = True

    def on_gpus(self, table: t.Sequence[t.Mapping[str, t.Any]], at: float) -> None:
        with self.lock, contextlib.suppress(Exception):
            values = gpu_values(table)
            if values:
                self.history.add(at, values)
                self.dirty = True

    def mark(self, kind: str, label: str, at: float | None = None) -> None:
        with self.lock, contextlib.suppress(Exception):
            self.history.mark(time.time() if at is None else at, kind, label)
            self.dirty = True

    def flush(self, force: bool = False) -> bool:
        """Write the file when something changed (and ``FLUSH_S`` passed, unless ``force``).

        The flush thread and the wrapper's final flush serialize on ``write_lock``, snapshot
        included, so an older snapshot never replaces a newer file.
        """
        with self.write_lock:
            now = time.monotonic()
            with self.lock:
                if not self.dirty or (not force and now - self.last_flush < FLUSH_S):
                    return False
                try:
                    doc = self.history.columns()
                except Exception:
                    return False
                self.dirty = False
                self.last_flush = now
            try:  # rewritten as the job runs: not fsynced (the next flush rewrites it)
                safe_write.write_text(self.path, json.dumps(doc, separators=(",", ":")),
                                      durable=False)
            except (OSError, ValueError, TypeError):  # a full disk; never into the wrapper
                with self.lock:
                    self.dirty = True
                return False
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(FLUSH_S):
            try:
                self.flush()
            except Exception:  # a history bug must never take the wrapper down
                return


# --- the ``history`` verb -------------------------------------------------------------------
