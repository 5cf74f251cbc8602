"""The goodput ledger of one training run: where its wall-clock time went, by cause.

Pure functions over what a run's job dirs already hold (``events.jsonl`` lines with the
wrapper's ``_at`` stamps, the restart records, the start and end times in ``status.json``):
nothing here reads a file or the clock, so every rule is tested on its own
(``tests/unit/test_goodput.py``, hypothesis included). The verb that reads the job dirs is
:mod:`remote_payload.agent.verbs.goodput`; the ledger is derived on every call, never
stored as a second record of state.

A *run* is every attempt and re-deploy that continues one training: the jobs that train into
one out-dir, where each later job resumes (``--resume``); a restart by the policy is one more
attempt of its job. Its wall time (from the first job's creation to the last job's end, or
now) is split into :data:`CAUSES`, each instant counted once (the highest in
:data:`PRIORITY` that covers it), so the causes sum to the wall time:

- ``productive``: optimizer steps whose progress survived (a live attempt's steps in flight
  count until a hang or a failure is named);
- ``startup``: from an attempt's process start to its first optimizer step (the
  ``startup`` event's ``first_step_at``; its ``*_at`` marks split it by phase);
- ``compile``: recompiles after start-up (``compile`` events' ``seconds``);
- ``checkpoint``: training blocked on a checkpoint (``checkpoint`` events' ``blocked_s``, else
  their ``seconds``; ``done``'s ``ckpt_s`` when the final one has no event with a duration);
- ``stall``: an attempt that failed or hung, from its last step to the end that named it;
- ``lost``: steps computed again after a resume from an older checkpoint, valued at the
  time they first took (from the step resumed at to the attempt's last step);
- ``shutdown``: an attempt that ended cleanly, from its last step to its end, less the final
  checkpoint;
- ``restart_gap``: between an attempt's end and the next one's start (the policy's backoff, a
  stop and a re-deploy);
- ``queue_wait``: a job's creation to its first start (the queue, the launch);
- ``unknown``: time no record explains (damaged or missing events); the ledger's ``unknown``
  list says why. Never guessed into another cause.

Apart from the partition, ``slow_s`` is the productive time whose ``step`` events report a
rate below the playbook's ``expect_tok_s``, and ``slow_shortfall_s`` what that time would
have been at the expected rate. Goodput is ``productive / wall``; the effective rate is the
surviving tokens over the wall time, and the ETA divides the steps left by it.

Stdlib only, Python 3.10: this runs in the container.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import typing as t

from remote_payload import wire

PRODUCTIVE, STARTUP, COMPILE, CHECKPOINT, STALL, LOST, SHUTDOWN = (
    "productive", "startup", "compile", "checkpoint", "stall", "lost", "shutdown")
RESTART_GAP, QUEUE_WAIT, UNKNOWN = "restart_gap", "queue_wait", "unknown"
#: every cause a ledger names, in the order tables show them
CAUSES = (PRODUCTIVE, STARTUP, COMPILE, CHECKPOINT, STALL, LOST, SHUTDOWN, RESTART_GAP,
          QUEUE_WAIT, UNKNOWN)
#: which cause an instant goes to when several intervals cover it (first wins); ``unknown``
#: is what no interval covers
PRIORITY = (QUEUE_WAIT, RESTART_GAP, STARTUP, STALL, CHECKPOINT, COMPILE, LOST, SHUTDOWN,
            PRODUCTIVE)
_RANK = {c: i for i, c in enumerate(PRIORITY)}

#: times a ledger computes with: epoch seconds from 1970 to ~5000 (anything else is damaged)
TIME_RANGE = (0.0, 1e11)
#: a duration an event may claim (a week); more is damaged
MAX_SECONDS = 7 * 86400.0
MAX_STEP = 10**12
MAX_LINE_CHARS = 1 << 20  # an events.jsonl line longer than this is damaged, never parsed
MAX_SPANS = 2048  # timeline segments a ledger keeps (merged into buckets past this)
MAX_ATTEMPT_ROWS = 1024  # attempt rows a ledger lists (the newest; every one is counted)
#: how far an event's ``_at`` may stray outside its job's life (created to ended, or now) or
#: behind an earlier line of its file: the wrapper stamps each line as it writes it, on the
#: clock that stamps ``status.json``, so more is damage (a line copied from elsewhere, a file
#: edited by hand, a clock stepped back), never a time to count
CLOCK_SLACK_S = 5.0
#: the event kinds a ledger reads; every other line is skipped unparsed beyond its kind
KINDS = frozenset({"step", "startup", "compile", "checkpoint", "resume", "restart", "done",
                   "phase"})
#: the restart policy's pause before attempt n+1 (``agent/restart.py``'s rule), used only
#: when the attempt that followed left no start-up record
BACKOFF_BASE_S, BACKOFF_MAX_S = 1.0, 30.0


class Interval(t.NamedTuple):
    cause: str
    start: float
    end: float


# --- the partition (the arithmetic every figure rests on) ----------------------------------


def spans(start: float, end: float, intervals: t.Iterable[Interval]) -> list[Interval]:
    """``[start, end]`` cut into consecutive segments, each labelled with the highest-priority
    cause of the intervals covering it (``unknown`` where none does); neighbours of one
    cause are merged. Intervals are clipped to the window; empty or reversed ones and unknown
    causes are ignored, so overlapping intervals are counted once."""
    if not end > start:
        return []
    edges: list[tuple[float, int, str]] = []
    for iv in intervals:
        if iv.cause not in _RANK:
            continue
        lo, hi = max(iv.start, start), min(iv.end, end)
        if hi > lo:
            edges.append((lo, 1, iv.cause))
            edges.append((hi, -1, iv.cause))
    edges.sort(key=lambda e: e[0])
    active = [0] * len(PRIORITY)
    out: list[Interval] = []
    at = start
    i = 0
    while at < end:
        while i < len(edges) and edges[i][0] <= at:
            active[_RANK[edges[i][2]]] += edges[i][1]
            i += 1
        nxt = edges[i][0] if i < len(edges) else end
        nxt = min(nxt, end)
        cause = next((PRIORITY[k] for k, n in enumerate(active) if n > 0), UNKNOWN)
        if nxt > at:
            if out and out[-1].cause == cause:
                out[-1] = Interval(cause, out[-1].start, nxt)
            else:
                out.append(Interval(cause, at, nxt))
        at = nxt
    return out


def totals(segments: t.Iterable[Interval]) -> dict[str, float]:
    """Seconds per cause (every cause of :data:`CAUSES`, zero where none)."""
    out = dict.fromkeys(CAUSES, 0.0)
    for s in segments:
        out[s.cause] = out.get(s.cause, 0.0) + (s.end - s.start)
    return out


def overlap(segments: t.Sequence[Interval], lo: float, hi: float, cause: str) -> float:
    """Seconds of ``cause`` in ``segments`` (sorted, disjoint) within ``[lo, hi]``."""
    total = 0.0
    first = max(0, bisect.bisect_right(segments, lo, key=lambda s: s.end) - 1)
    for s in segments[first:]:
        if s.start >= hi:
            break
        if s.cause == cause and s.end > lo:
            total += min(s.end, hi) - max(s.start, lo)
    return total


def bucketed(segments: t.Sequence[Interval], start: float, end: float,
             n: int) -> list[str]:
    """``n`` equal columns of ``[start, end]``, each the cause with most time in it (a
    picture's cells)."""
    if n <= 0 or not end > start:
        return []
    width = (end - start) / n
    cols: list[dict[str, float]] = [{} for _ in range(n)]
    for s in segments:
        a = max(0, min(n - 1, int((s.start - start) / width)))
        b = max(0, min(n - 1, int((s.end - start) / width)))
        for k in range(a, b + 1):
            lo, hi = start + k * width, start + (k + 1) * width
            part = min(s.end, hi) - max(s.start, lo)
            if part > 0:
                cols[k][s.cause] = cols[k].get(s.cause, 0.0) + part
    return [max(c.items(), key=lambda kv: (kv[1], -_order(kv[0])))[0] if c else UNKNOWN
            for c in cols]


def _order(cause: str) -> int:
    return CAUSES.index(cause) if cause in CAUSES else len(CAUSES)


def bounded(segments: list[Interval], start: float, end: float,
            limit: int = MAX_SPANS) -> list[Interval]:
    """At most ``limit`` segments: past it, equal buckets labelled by their main cause."""
    if len(segments) <= limit:
        return segments
    width = (end - start) / limit
    out: list[Interval] = []
    for k, cause in enumerate(bucketed(segments, start, end, limit)):
        lo, hi = start + k * width, start + (k + 1) * width
        if out and out[-1].cause == cause:
            out[-1] = Interval(cause, out[-1].start, hi)
        else:
            out.append(Interval(cause, lo, hi))
    return out


# --- events as read back (untrusted text) -------------------------------------------------


def number(v: t.Any, low: float = 0.0, high: float = MAX_SECONDS) -> float | None:
    """``v`` as a finite float within ``[low, high]``, else None (:func:`wire.number_in`;
    seconds by default)."""
    return wire.number_in(v, low, high)


def step_of(v: t.Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP else None


def parse_line(line: str | bytes) -> dict[str, t.Any] | None:
    """One ``events.jsonl`` line as an event the ledger reads, or None when it is damaged
    (not JSON, not an object, no ``event`` name, no ``_at`` time in :data:`TIME_RANGE`,
    longer than :data:`MAX_LINE_CHARS`). Kinds outside :data:`KINDS` come back as
    ``{"event": kind, "_at": at}`` only, and ``step`` events with the fields a ledger reads
    only (a run's millions of them are held at once: 1.2 GB for 10**6 whole ones). Never
    raises."""
    if len(line) > MAX_LINE_CHARS:
        return None
    try:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
        ev = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(ev, dict):
        return None
    kind, at = ev.get("event"), number(ev.get("_at"), *TIME_RANGE)
    if not isinstance(kind, str) or at is None:
        return None
    if kind not in KINDS:
        return {"event": kind, "_at": at}
    if kind == "step":
        return {"event": kind, "_at": at, "step": ev.get("step"), "tok_s": ev.get("tok_s")}
    return ev


def backoff_s(attempts: int) -> float:
    # the exponent is capped: 2.0 ** 1024 overflows, and a job's file may hold any count
    return float(min(BACKOFF_BASE_S * 2.0 ** min(max(attempts - 1, 0), 64), BACKOFF_MAX_S))


# --- one run's facts, as the verb gathers them ---------------------------------------------


class JobFacts(t.NamedTuple):
    """One job of a run: its times from ``status.json`` and its events, in file order (the
    wrapper's ``restart`` events between attempts)."""

    job_id: str
    created_at: float | None
    started_at: float | None  # the first attempt's process start
    ended_at: float | None  # None: still running (or never started)
    state: str  # the job's reconciled state name
    events: list[dict[str, t.Any]]  # parsed lines (:func:`parse_line`), damaged ones dropped
    damaged_lines: int = 0


class _Attempt:
    """One attempt of one job, as its events describe it."""

    def __init__(self, job: JobFacts, index: int, events: list[dict[str, t.Any]]):
        self.job, self.number, self.events = job, index, events
        self.restart_ev: dict[str, t.Any] | None = None  # the wrapper's record that began it
        self.end_ev: dict[str, t.Any] | None = None  # ... and the one that ended it
        self.start: float | None = None
        self.start_known = True  # False: taken from its first event (what came before is unknown)
        self.end: float | None = None
        self.window_start = 0.0  # where this attempt's row begins (the previous one's end)
        self.how = "running"
        self.start_step = 0
        self.resumed = False
        self.steps: list[tuple[float, int, float | None]] = []  # (at, step, tok_s)
        self.first_step_at: float | None = None  # the first optimizer step's end (startup)
        self.startup: list[tuple[str, float]] = []
        self.done: dict[str, t.Any] | None = None
        self.frontier: float = math.inf  # later resumes: progress past this step is lost
        self.target_steps: int | None = None
        for ev in events:
            kind = ev["event"]
            if kind == "resume" and step_of(ev.get("step")) is not None and not self.resumed:
                self.start_step, self.resumed = int(ev["step"]), True
            elif kind == "step" and step_of(ev.get("step")) is not None:
                self.steps.append((ev["_at"], int(ev["step"]),
                                   number(ev.get("tok_s"), 0.0, 1e15)))
            elif kind == "done":
                self.done = ev
            elif kind == "phase" and step_of(ev.get("steps")) is not None:
                self.target_steps = int(ev["steps"])
        self.steps.sort(key=lambda s: s[0])
        self.last_step = max([self.start_step, *(s for _, s, _ in self.steps)])
        self.startup_ev = next((e for e in events if e["event"] == "startup"), None)

    @property
    def surviving_to(self) -> int:
        return int(max(self.start_step, min(self.frontier, self.last_step)))

    def time_at_step(self, step: float) -> float | None:
        """When this attempt reached ``step``: interpolated between its step events; the
        first step's time for steps at or before where it started."""
        points = [(self.first_step_at, self.start_step)] if self.first_step_at is not None else []
        points += [(a, s) for a, s, _ in self.steps]
        if not points:
            return None
        if step <= points[0][1]:
            return points[0][0]
        for (a0, s0), (a1, s1) in itertools.pairwise(points):
            if s0 <= step <= s1:
                return a0 if s1 == s0 else a0 + (a1 - a0) * (step - s0) / (s1 - s0)
        return points[-1][0]


def _in_time(job: JobFacts, now: float, notes: list[str]) -> JobFacts:
    """The job with its events that fit its life: an event stamped before the job was
    created, after it ended (or after ``now``), or behind an earlier line of its file by more
    than :data:`CLOCK_SLACK_S` is damaged, counted and dropped."""
    lo = job.created_at - CLOCK_SLACK_S if job.created_at is not None else -math.inf
    hi = (job.ended_at if job.ended_at is not None else now) + CLOCK_SLACK_S
    kept: list[dict[str, t.Any]] = []
    newest = -math.inf
    for ev in job.events:
        at = ev["_at"]
        if lo <= at <= hi and at >= newest - CLOCK_SLACK_S:
            kept.append(ev)
            newest = max(newest, at)
    dropped = len(job.events) - len(kept)
    if not dropped:
        return job
    notes.append(f"job {job.job_id}: {dropped} event(s) stamped outside the job's life or "
                 "behind an earlier line: damaged, skipped")
    return job._replace(events=kept, damaged_lines=job.damaged_lines + dropped)


def _split_attempts(job: JobFacts, notes: list[str]) -> list[_Attempt]:
    """The job's events cut at the wrapper's ``restart`` events (attempt N starts). A
    ``restart`` event whose ``attempt`` is not past the one before it (a line the job printed
    itself, a copy) is no attempt's start: skipped, and said."""
    groups: list[list[dict[str, t.Any]]] = [[]]
    restarts: list[dict[str, t.Any]] = []
    current, skipped = 1, 0
    for ev in job.events:
        if ev["event"] == "restart":
            n = step_of(ev.get("attempt"))
            if n is None or n <= current:
                skipped += 1
                continue
            current = n
            restarts.append(ev)
            groups.append([])
        else:
            groups[-1].append(ev)
    if skipped:
        notes.append(f"job {job.job_id}: {skipped} restart event(s) that start no new attempt "
                     "skipped")
    attempts = [_Attempt(job, i + 1, evs) for i, evs in enumerate(groups)]
    for i, att in enumerate(attempts):
        att.restart_ev = restarts[i - 1] if i > 0 else None
        att.end_ev = restarts[i] if i < len(restarts) else None
    return attempts


def _place(att: _Attempt, notes: list[str]) -> None:
    """The attempt's start, end, first step and how it ended, from its records."""
    job = att.job
    su = att.startup_ev
    first = number(su.get("first_step_at")) if su else None
    if su is not None and first is not None and job.created_at is not None \
            and su["_at"] - first < job.created_at - CLOCK_SLACK_S:
        notes.append(f"job {job.job_id} attempt {att.number}: its startup event's "
                     "first_step_at reaches back before the job was created: not used")
        su, first = None, None
    if su is not None and first is not None:
        att.start = su["_at"] - first
        att.first_step_at = su["_at"]
        marks = sorted((v, k[:-3]) for k, v in su.items()
                       if k.endswith("_at") and k != "_at" and number(v) is not None)
        prev = 0.0
        for v, name in marks:
            att.startup.append((name, round(max(0.0, float(v) - prev), 3)))
            prev = max(prev, float(v))
    elif su is not None:
        notes.append(f"job {job.job_id} attempt {att.number}: startup event without "
                     "first_step_at: its start-up is not split")
    if att.start is None:
        restart_ev = att.restart_ev
        if att.number == 1:
            att.start = job.started_at
        elif restart_ev is not None:
            att.start = restart_ev["_at"] + backoff_s(att.number - 1)
    if att.first_step_at is None and att.steps:
        att.first_step_at = att.steps[0][0]
        if att.startup_ev is None:
            notes.append(f"job {job.job_id} attempt {att.number}: no startup event: start-up "
                         "runs to the first step event, not split by phase")
    end_ev = att.end_ev
    if end_ev is not None:
        att.end = end_ev["_at"]
        reason = end_ev.get("reason")
        att.how = f"restarted: {reason}" if isinstance(reason, str) else "restarted"
    else:
        att.end = job.ended_at
        if att.done is not None:
            att.how = "done: " + str(att.done.get("reason") or "finished")[:60]
        elif job.ended_at is not None:
            att.how = job.state.lower()
    last_seen = max((e["_at"] for e in att.events), default=None)
    if att.start is None and last_seen is not None:
        att.start = min(e["_at"] for e in att.events)
        att.start_known = False
        notes.append(f"job {job.job_id} attempt {att.number}: its start is not recorded: the "
                     "time before its first event is unknown")
    if att.end is None and att.how != "running":
        att.end = last_seen


_HUNG = "restarted: hang"  # the hang watch's restart (``agent/restart.py``'s ``hang``)


def crashed(att: _Attempt) -> bool:
    """Ended without a ``done`` event, and neither running nor a success (a command that is
    no trainer says no ``done``)."""
    return att.how not in ("running", "succeeded") and att.done is None


def _intervals(att: _Attempt, now: float) -> list[Interval]:
    """The attempt's own intervals (start-up, stalls, checkpoints, compiles, lost progress,
    wind-down, productive); :func:`spans` decides what overlaps."""
    start = att.start
    end = att.end if att.end is not None else now
    if start is None or not end > start:
        return []
    out: list[Interval] = []
    first = att.first_step_at
    live = att.how == "running"
    if first is not None:
        out.append(Interval(STARTUP, start, first))
    elif live:  # still starting
        out.append(Interval(STARTUP, start, end))
    elif att.events:  # never reached a step: start-up to its last word
        out.append(Interval(STARTUP, start, max(e["_at"] for e in att.events)))
    last_step_at = att.steps[-1][0] if att.steps else first
    if last_step_at is not None and live:
        # the steps in flight count as productive until a hang or failure is named
        out.append(Interval(PRODUCTIVE, first or start, end))
    elif last_step_at is not None:
        if crashed(att):
            out.append(Interval(STALL, last_step_at, end))
        else:
            out.append(Interval(SHUTDOWN, last_step_at, end))
        out.append(Interval(PRODUCTIVE, first or start, last_step_at))
    elif crashed(att) and att.events:
        out.append(Interval(STALL, max(e["_at"] for e in att.events), end))
    timed_final = False
    for ev in att.events:
        kind = ev["event"]
        if kind == "checkpoint":
            secs = number(ev.get("blocked_s"))
            if secs is None:
                secs = number(ev.get("seconds"))
            if secs is not None:
                out.append(Interval(CHECKPOINT, ev["_at"] - secs, ev["_at"]))
                if att.done is not None and step_of(ev.get("step")) == step_of(
                        att.done.get("step")):
                    timed_final = True
        elif kind == "compile" and first is not None and ev["_at"] > first:
            secs = number(ev.get("seconds"))
            if secs is not None:
                out.append(Interval(COMPILE, ev["_at"] - secs, ev["_at"]))
    if att.done is not None and not timed_final:
        secs = number(att.done.get("ckpt_s"))
        if secs is not None:
            out.append(Interval(CHECKPOINT, att.done["_at"] - secs, att.done["_at"]))
    if att.surviving_to < att.last_step:
        lo = att.time_at_step(att.surviving_to)
        if lo is not None and last_step_at is not None:
            out.append(Interval(LOST, lo, last_step_at))
    return out


# --- the ledger ------------------------------------------------------------------------------


def ledger(jobs: t.Sequence[JobFacts], now: float,
           expect_tok_s: float | None = None) -> dict[str, t.Any]:
    """The ledger of the run made of ``jobs`` (oldest first), as of ``now``.

    Returns the ``goodput`` reply's ledger part (``wire_shapes.GoodputLedgerDoc``). Damaged
    or missing records never raise: the time they would explain is ``unknown`` and the
    ``unknown`` list says why.
    """
    notes: list[str] = []
    attempts: list[_Attempt] = []
    jobs = [_in_time(job, now, notes) for job in jobs]
    for job in jobs:
        if job.damaged_lines:
            notes.append(f"job {job.job_id}: {job.damaged_lines} damaged events.jsonl line(s) "
                         "skipped")
        for att in _split_attempts(job, notes):
            _place(att, notes)
            attempts.append(att)
    # a later attempt that resumed from step R (0 when it did not resume) undoes every
    # earlier attempt's progress past R
    later_min = math.inf
    for att in reversed(attempts):
        att.frontier = later_min
        if att.steps or att.resumed:  # an attempt that computed nothing undoes nothing
            later_min = min(later_min, att.start_step)
    starts = [x for x in ([j.created_at for j in jobs] + [a.start for a in attempts])
              if x is not None]
    wall_start = min(starts) if starts else now
    running = any(a.how == "running" for a in attempts) or not jobs
    ends = [a.end for a in attempts if a.end is not None] + [
        j.ended_at for j in jobs if j.ended_at is not None]
    wall_end = now if running or not ends else max(ends)
    wall_end = max(wall_end, wall_start)
    intervals: list[Interval] = []
    prev_end: float | None = None
    for job in jobs:
        job_atts = [a for a in attempts if a.job is job]
        first_start = next((a.start for a in job_atts if a.start is not None and a.start_known),
                           None)
        if job.created_at is not None and first_start is not None:
            if prev_end is not None and job.created_at > prev_end:
                intervals.append(Interval(RESTART_GAP, prev_end, job.created_at))
            intervals.append(Interval(QUEUE_WAIT, job.created_at, first_start))
        for att in job_atts:
            if prev_end is not None and att.start is not None and att.start_known \
                    and att.number > 1:
                intervals.append(Interval(RESTART_GAP, prev_end, att.start))
            att.window_start = prev_end if prev_end is not None else wall_start
            intervals += _intervals(att, now)
            if att.end is not None:
                prev_end = att.end if prev_end is None else max(prev_end, att.end)
    segs = spans(wall_start, wall_end, intervals)
    causes = totals(segs)
    wall = wall_end - wall_start
    slow_s = shortfall = tokens = 0.0
    untimed = 0
    rows = []
    for att in attempts:
        prev_at = att.first_step_at
        for at, step, tok_s in att.steps:
            if prev_at is not None and tok_s is not None and step <= att.surviving_to:
                prod = overlap(segs, prev_at, at, PRODUCTIVE)
                tokens += prod * tok_s
                if expect_tok_s and tok_s < expect_tok_s:
                    slow_s += prod
                    shortfall += prod * (1.0 - tok_s / expect_tok_s)
            prev_at = at
        untimed += sum(1 for e in att.events if e["event"] == "checkpoint"
                       and number(e.get("blocked_s")) is None and number(e.get("seconds")) is None)
        hi = att.end if att.end is not None else (now if att.how == "running" else att.window_start)
        hi = max(hi, att.window_start)
        row_causes = {c: round(overlap(segs, att.window_start, hi, c), 3) for c in CAUSES}
        rows.append({
            "job_id": att.job.job_id, "attempt": att.number, "start": att.start, "end": att.end,
            "ended": att.how, "crashed": crashed(att), "start_step": att.start_step,
            "resumed": att.resumed, "last_step": att.last_step,
            "surviving_steps": att.surviving_to - att.start_step,
            "lost_steps": att.last_step - att.surviving_to,
            "startup": [{"phase": p, "seconds": s} for p, s in att.startup],
            "causes": row_causes,
        })
    if len(rows) > MAX_ATTEMPT_ROWS:
        notes.append(f"only the newest {MAX_ATTEMPT_ROWS} of the run's {len(rows)} attempts "
                     "are listed (all are counted)")
        rows = rows[-MAX_ATTEMPT_ROWS:]
    if untimed:
        notes.append(f"{untimed} checkpoint event(s) carry no duration (blocked_s or seconds): "
                     "their time is counted as productive")
    if causes[UNKNOWN] > 0:
        notes.append(f"{causes[UNKNOWN]:.1f} s of the wall time no record explains")
    surviving = sum(a.surviving_to - a.start_step for a in attempts)
    target = next((a.target_steps for a in reversed(attempts) if a.target_steps), None)
    last = max((a.last_step for a in attempts), default=0)
    effective = tokens / wall if wall > 0 else None
    eta = None
    if target is not None and surviving > 0 and wall > 0:
        eta = round(max(0, target - (attempts[-1].surviving_to if attempts else 0))
                    * wall / surviving, 1)
    return {
        "started_at": wall_start, "ended_at": None if running else wall_end, "now": now,
        "wall_s": round(wall, 3),
        "goodput": round(causes[PRODUCTIVE] / wall, 4) if wall > 0 else None,
        "causes": {c: round(v, 3) for c, v in causes.items()},
        "expect_tok_s": expect_tok_s, "slow_s": round(slow_s, 3),
        "slow_shortfall_s": round(shortfall, 3),
        "surviving_steps": surviving, "last_step": last, "target_steps": target,
        "surviving_tokens": round(tokens), "effective_tok_s":
            round(effective, 1) if effective is not None else None,
        "eta_s": eta,
        "crashes": sum(1 for a in attempts if crashed(a) and a.how != _HUNG),
        "hangs": sum(1 for a in attempts if a.how == _HUNG),
        "restarts": sum(1 for a in attempts if a.number > 1),
        "redeploys": max(0, len(jobs) - 1),
        "attempts": rows,
        "timeline": [[s.cause, round(s.start, 3), round(s.end, 3)]
                     for s in bounded(segs, wall_start, wall_end)],
        "unknown": notes[:32],
        "damaged_lines": sum(j.damaged_lines for j in jobs),
    }


def summary(doc: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The few figures a ``status`` reply carries (``GoodputSummaryDoc``)."""
    keys = ("wall_s", "goodput", "causes", "crashes", "hangs", "restarts", "redeploys",
            "effective_tok_s", "eta_s")
    return {k: doc.get(k) for k in keys}
