"""A job's bounded, downsampled history: metrics and GPU load over time, plus marks.

The wrapper feeds a :class:`Recorder`: every step event (``loss``, ``tok_s``, ``mfu``,
``mem_gib``, ``feature_wait_pct``), every GPU sample (the 2 s ``gpus.json`` sampler: mean
utilisation, memory in use), and *marks* for what explains a bend in a curve: a recompile
(``compile`` events, ``phase: compiling``), a restart from a checkpoint (``resume``), an
error event, a hang, the end. It rewrites ``history.json`` in the job dir at most every
:data:`FLUSH_S` (write-then-rename), so readers never parse ``events.jsonl``, and once more
when the job ends, before the wrapper writes the terminal status (``wrapper.advance``).

Bounded by construction: rows are time buckets of one width; past :data:`CAP` rows the width
doubles and neighbours merge, so a week-long job's file stays at most ``CAP`` rows (~30 KB)
at a uniform resolution. The step events are also kept by *step* (``steps``: rows of a step
width, 1 at first, coarsened the same way), so a short job's plot is its step events
themselves and any job can be plotted by step. ``last`` holds the newest sample of each
field as it came (no rounding, no mean): a curve ends at the value the metrics line shows.
``status`` returns a further reduced copy (:data:`STATUS_POINTS`, :func:`for_status`); the
``history`` verb returns the file's full resolution.

Verb ``history [--job ID] [--since S] [--points N]`` (docs/contracts.md). Stdlib only:
this runs in the container, on Python 3.10.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import time
import typing as t

from remote_payload import boundedread, safe_write

if t.TYPE_CHECKING:
    import threading

FILE = "history.json"
FORMAT = 1
CAP = 512  # rows kept (history verb, plots), of each table; wire_shapes.HISTORY_ROWS_MAX
#: the largest history.json read (512 rows of a few numbers are well under it)
MAX_FILE_BYTES = 8 << 20
#: the longest events.jsonl line replayed whole (a longer one is cut, so it does not parse)
MAX_EVENT_LINE_BYTES = 1 << 20
STATUS_POINTS = 120  # rows in a status reply (sparklines are narrower than this)
STATUS_MARKS = 24  # the latest marks in a status reply (the history verb has them all)
BUCKET0_S = 2.0  # the GPU sampler's interval: finer rows would hold nothing more
FLUSH_S = 5.0
#: the largest step kept by step (a step past it is damage: no trainer runs 2**53 steps)
STEP_MAX = 2**53
#: significant digits of a stored mean: a step event's loss as the metrics line shows it
#: (``loss 13.4091``) survives a row of one event
SIGNIFICANT = 6
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
    """:data:`SIGNIFICANT` digits: a plot needs no more, and the file stays small.

    Near the largest float the rounded text reads past it (1.798e+308), so such a value is
    kept as it is rather than turned into inf."""
    rounded = float(f"{v:.{SIGNIFICANT}g}")
    return rounded if math.isfinite(rounded) else v


def _merged_mean(mean_a: float, n_a: float, mean_b: float, n_b: float) -> float:
    """The mean of two groups from their means and counts, finite for any finite inputs.

    A running sum of finite values overflows (two steps at loss 1e308 sum to inf), so rows
    keep means and merge them as a weighted average of the two: each weighted term is at most
    its mean, their exact sum lies between the two means, and the result is held there so
    that rounding cannot push it past the largest float either.
    """
    if n_a <= 0:
        return mean_b
    if n_b <= 0:
        return mean_a
    total = n_a + n_b
    merged = mean_a * (n_a / total) + mean_b * (n_b / total)
    return min(max(merged, min(mean_a, mean_b)), max(mean_a, mean_b))


def step_of(ev: t.Mapping[str, t.Any]) -> int | None:
    """A step event's step when it is one the step table can hold: an integer (never a
    bool, never a float) in ``[0, STEP_MAX]``; None otherwise (the event still counts by
    time). A job's events are its trainer's output, so anything may be in them."""
    step = ev.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= STEP_MAX:
        return None
    return step


def _merge_rows(keys: list[float], rows: list[dict[str, list[float]]],
                width: float) -> tuple[list[float], list[dict[str, list[float]]]]:
    """Rows keyed by their bucket start, merged into buckets of ``width`` (means by count)."""
    out_keys: list[float] = []
    out_rows: list[dict[str, list[float]]] = []
    for key, row in zip(keys, rows, strict=True):
        start = math.floor(key / width) * width
        if out_keys and out_keys[-1] == start:
            for k, (mean, n) in row.items():
                acc = out_rows[-1].setdefault(k, [0.0, 0.0])
                acc[0] = _merged_mean(acc[0], acc[1], mean, n)
                acc[1] += n
        else:
            out_keys.append(start)
            out_rows.append({k: list(v) for k, v in row.items()})
    return out_keys, out_rows


def _fold(row: dict[str, list[float]], nums: t.Mapping[str, float]) -> None:
    for k, n in nums.items():
        acc = row.setdefault(k, [0.0, 0.0])
        acc[0] = _merged_mean(acc[0], acc[1], n, 1.0)
        acc[1] += 1


def _mean(values: t.Sequence[float]) -> float:
    """The mean of finite values without overflow (see :func:`_merged_mean`)."""
    mean, n = 0.0, 0.0
    for v in values:
        mean = _merged_mean(mean, n, v, 1.0)
        n += 1
    return mean


class History:
    """Time buckets of width ``bucket_s`` holding per-field means and counts, the step
    events again by step (buckets of ``step_width`` steps, each with its mean time), the
    newest sample of each field, and marks."""

    def __init__(self, cap: int = CAP, bucket_s: float = BUCKET0_S):
        if cap < 2:
            raise ValueError("cap must be at least 2")
        self.cap = cap
        self.bucket_s = bucket_s
        self.starts: list[float] = []
        self.sums: list[dict[str, list[float]]] = []  # field -> [mean, count]
        self.step_width = 1
        self.step_starts: list[float] = []  # sorted, whatever order the steps came in
        self.step_sums: list[dict[str, list[float]]] = []  # field (and "t") -> [mean, count]
        self.last: dict[str, dict[str, float]] = {}  # field -> {"t", "v"[, "step"]}
        self.marks: list[dict[str, t.Any]] = []

    def add(self, at: float, values: t.Mapping[str, t.Any], step: int | None = None) -> None:
        """Add one sample at time ``at``; non-numeric and unknown fields are ignored.

        With ``step`` (a step event's, :func:`step_of`) its step fields go into the step
        table too."""
        nums = {k: n for k, n in ((k, _number(values.get(k))) for k in FIELDS) if n is not None}
        if not nums or _number(at) is None:
            return
        start = math.floor(at / self.bucket_s) * self.bucket_s
        if self.starts and start <= self.starts[-1]:  # same bucket (or a late sample)
            row = self.sums[-1]
        else:
            self.starts.append(start)
            row = {}
            self.sums.append(row)
        _fold(row, nums)
        for k, n in nums.items():
            newest = self.last.get(k)
            if newest is None or at >= newest["t"]:
                self.last[k] = {"t": at, "v": n, **({"step": step} if step is not None else {})}
        if len(self.starts) > self.cap:
            self._coarsen()
        if step is not None:
            self._add_step(at, step, {k: n for k, n in nums.items() if k in STEP_FIELDS})

    def _add_step(self, at: float, step: int, nums: dict[str, float]) -> None:
        if not nums:
            return
        start = float(step // self.step_width * self.step_width)
        i = bisect.bisect_left(self.step_starts, start)
        if i == len(self.step_starts) or self.step_starts[i] != start:
            self.step_starts.insert(i, start)
            self.step_sums.insert(i, {})
        _fold(self.step_sums[i], {**nums, "t": at})
        while len(self.step_starts) > self.cap:
            self.step_width *= 2
            self.step_starts, self.step_sums = _merge_rows(self.step_starts, self.step_sums,
                                                           self.step_width)

    def _coarsen(self) -> None:
        while len(self.starts) > self.cap:
            self.bucket_s *= 2
            self.starts, self.sums = _merge_rows(self.starts, self.sums, self.bucket_s)

    def mark(self, at: float, kind: str, label: str = "") -> None:
        """A moment worth a line on the time axis; repeats of one kind within a bucket fold."""
        last = self.marks[-1] if self.marks else None
        if last and last["kind"] == kind and at - last["t"] < self.bucket_s:
            return
        self.marks.append({"t": round(at, 3), "kind": kind, "label": label[:120]})
        if len(self.marks) > MAX_MARKS:  # the first ones (the initial compile) and the latest
            del self.marks[8]

    def columns(self) -> dict[str, t.Any]:
        """``{"format", "bucket_s", "t": [...], <field>: [mean or None, ...], "marks",
        "last": {<field>: {"t", "v"[, "step"]}}, "steps": {"width", "step": [...],
        "t": [...], <step field>: [...]}}``."""
        doc: dict[str, t.Any] = {"format": FORMAT, "bucket_s": self.bucket_s,
                                 "t": [round(s, 3) for s in self.starts]}
        doc.update(_value_columns(self.sums, FIELDS))
        doc["marks"] = list(self.marks)
        doc["last"] = {k: dict(v) for k, v in self.last.items()}
        if self.step_starts:
            steps: dict[str, t.Any] = {
                "width": self.step_width, "step": [int(s) for s in self.step_starts],
                "t": [round(row["t"][0], 3) for row in self.step_sums]}
            steps.update(_value_columns(self.step_sums, STEP_FIELDS))
            doc["steps"] = steps
        return doc


def _value_columns(rows: t.Sequence[t.Mapping[str, list[float]]],
                   fields: t.Sequence[str]) -> dict[str, list[float | None]]:
    """Each field's column of row means (None where a row has none), fields without any left out."""
    out: dict[str, list[float | None]] = {}
    for k in fields:
        col = [(_round(row[k][0]) if k in row and row[k][1] else None) for row in rows]
        if any(v is not None for v in col):
            out[k] = col
    return out


# --- reading -----------------------------------------------------------------------------


def reduce(doc: dict[str, t.Any], points: int, fields: t.Sequence[str] = FIELDS,
           since: float | None = None) -> dict[str, t.Any]:
    """``doc`` (columns) cut to ``t >= since`` and merged down to at most ``points`` rows,
    its step table likewise; ``last`` of the fields asked for, as it is.

    A merged row is the mean of the values it covers (None where it covers none).
    """
    out = _reduce_table(doc, "t", points, fields, since)
    out["format"] = doc.get("format", FORMAT)
    out["bucket_s"] = float(doc.get("bucket_s") or BUCKET0_S) * out.pop("group")
    out["marks"] = [m for m in doc.get("marks") or []
                    if since is None or (m.get("t") or 0) >= since]
    last = doc.get("last")
    if isinstance(last, dict):
        out["last"] = {k: v for k, v in last.items() if k in fields and isinstance(v, dict)
                       and (since is None or (_number(v.get("t")) or 0) >= since)}
    steps = doc.get("steps")
    if isinstance(steps, dict) and isinstance(steps.get("step"), list):
        table = _reduce_table(steps, "step", points, [f for f in fields if f in STEP_FIELDS],
                              since)
        table["t"] = [_round_time(x) for x in table["t"]]
        if table["step"]:
            group = table.pop("group")
            out["steps"] = {"width": int(_number(steps.get("width")) or 1) * group, **table}
    return out


def _round_time(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _reduce_table(doc: t.Mapping[str, t.Any], key: str, points: int, fields: t.Sequence[str],
                  since: float | None) -> dict[str, t.Any]:
    """The rows of ``doc`` (aligned columns, ``key`` the first one) whose ``t`` is ``since``
    or later, merged ``group`` by ``group`` into at most ``points``: ``key`` keeps each
    group's first value, ``t`` (when not ``key``) and the fields their means."""
    keys: list[t.Any] = list(doc.get(key) or [])
    ts: list[t.Any] = keys if key == "t" else list(doc.get("t") or [])
    rows = [i for i in range(len(keys)) if since is None
            or (_number(ts[i] if i < len(ts) else None) or 0) >= since]
    group = max(1, math.ceil(len(rows) / max(points, 1)))
    chunks = [rows[j:j + group] for j in range(0, len(rows), group)]
    out: dict[str, t.Any] = {"group": group, key: [keys[c[0]] for c in chunks]}
    for k in ([] if key == "t" else ["t"]) + list(fields):
        col = doc.get(k)
        if not isinstance(col, list):
            continue
        merged: list[float | None] = []
        for c in chunks:
            vals = [f for f in (_number(col[i] if i < len(col) else None) for i in c)
                    if f is not None]
            merged.append((_mean(vals) if k == "t" else _round(_mean(vals))) if vals else None)
        out[k] = merged
    return out


def read(job_path: str) -> dict[str, t.Any] | None:
    """The columns the wrapper wrote, or None (no file yet, an older wrapper, unreadable)."""
    try:
        doc = json.loads(boundedread.read_regular(os.path.join(job_path, FILE), MAX_FILE_BYTES))
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
        h.add(at, ev, step_of(ev))
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
        out["gpu_util"] = _mean(utils)
    if mems:
        out["gpu_mem_gib"] = sum(mems) / 1024.0
    return out


def from_events(path: str, cap: int = CAP) -> History:
    """Replay an ``events.jsonl`` (each line stamped ``_at`` by the wrapper) into a History:
    the history of a job whose wrapper predates ``history.json``."""
    h = History(cap)
    try:
        for line in boundedread.lines(path, MAX_EVENT_LINE_BYTES):
            try:
                ev = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            if isinstance(ev, dict) and _number(ev.get("_at")) is not None:
                feed_event(h, ev, float(ev["_at"]))
    except OSError:  # none yet, unreadable, or a link/FIFO that is not the wrapper's
        pass
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
