"""The ``goodput`` verb: a run's ledger, derived from its job dirs on every call.

``goodput [--job ID | --run RUN]``: the run the job belongs to (default: the current job's).
The arithmetic is :mod:`remote_payload.agent.goodput` (pure); this module finds a run's job
dirs and reads them: ``spec.json`` (the command's ``--out-dir``, ``--run-id`` and
``--resume``), ``status.json`` (creation, start, end, restart records) and ``events.jsonl``
(bounded, never following a link, damaged lines counted and skipped).

Which jobs make a run: jobs whose command trains into one out-dir (resolved against the
job's workdir), oldest first; a job continues the run before it when its command resumes
(``--resume``) and it did not start over from step 0 (steps without a ``resume`` event), and
when neither names a different ``--run-id``. A job that resumed from a checkpoint outside its
out-dir (``--resume DIR`` of another run), or that was created while the run's last job was
still running (two trainers sharing one out-dir), is a run of its own, and its ledger says
why. A job whose command has no ``--out-dir`` is a run of its own. The verb writes nothing:
the ledger is never a second record of state (the brief copy ``status`` carries is cached in
the job dir, :data:`SUMMARY_CACHE`, and never read as a record).
"""

from __future__ import annotations

import argparse
import errno
import os
import time
import typing as t

from remote_payload import boundedread
from remote_payload.agent import goodput, jobrecord
from remote_payload.agent import jobstore as jobs
from remote_payload.agent.common import AgentFailure
from remote_payload.wire import ErrorType, JobState

if t.TYPE_CHECKING:
    from remote_payload.wire_shapes import GoodputDoc, GoodputSummaryDoc

#: bytes of one job's events.jsonl read (the newest part is what a live run needs least;
#: past this the rest is skipped and the ledger says so)
MAX_EVENTS_BYTES = 256 * 2**20
MAX_RUN_JOBS = 256  # the newest jobs of one run that a ledger reads


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", default=None, help="a job of the run (default: the current job)")
    p.add_argument("--run", default=None,
                   help="the run: its first job's id, its --run-id, its out-dir, or a job of "
                        "it (id or unique prefix)")


def run(verb: str, args: argparse.Namespace) -> GoodputDoc:
    if args.run is not None and args.job is not None:
        raise AgentFailure(ErrorType.UsageError, "goodput takes --job or --run, not both")
    root = args.root
    runs = group_runs(root)
    found = [r for r in runs if args.run is not None
             and args.run in (r.run_id, r.trainer_run_id, r.out_dir)]
    if found:
        return document(root, found[-1])
    name = args.run if args.run is not None else args.job
    if args.run is not None and not jobs.JOB_ID_RE.fullmatch(args.run):
        raise AgentFailure(ErrorType.NoSuchJob, f"no run {args.run[:200]!r} under {root} (a "
                           "job id, the run's --run-id or its out-dir)", job_id=None)
    jid = jobs.resolve_job(root, name)  # a job of the run, or its unique prefix
    return document(root, next(r for r in runs if jid in r.job_ids))


class Run(t.NamedTuple):
    run_id: str  # its first job's id
    trainer_run_id: str | None  # the command's --run-id
    out_dir: str | None
    job_ids: list[str]  # oldest first
    specs: list[dict[str, t.Any]]
    statuses: list[dict[str, t.Any]]
    #: why its first job does not continue the run before it in its out-dir (its ledger says)
    notes: tuple[str, ...] = ()


def command_facts(spec: t.Mapping[str, t.Any]) -> tuple[str | None, str | None, bool]:
    """``(out-dir, run id, resumes)`` of a job's command (the trainer's flags, wherever in
    the argv: behind ``torchrun`` or ``python -m`` alike). The out-dir is resolved against
    the job's workdir and normalised; it is a key, never a path this agent opens."""
    argv = spec.get("command")
    if not isinstance(argv, list):
        return None, None, False
    words = [a for a in argv if isinstance(a, str)]
    values: dict[str, str] = {}
    resumes = False
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in ("--out-dir", "--out_dir", "--run-id", "--run_id"):
            if not eq:
                value = words[i + 1] if i + 1 < len(words) else ""
            values[name.replace("_", "-")] = value
        elif name == "--resume":
            resumes = True
    out = values.get("--out-dir") or None
    if out is not None:
        workdir = spec.get("workdir")
        base = workdir if isinstance(workdir, str) and workdir else "/"
        out = os.path.normpath(os.path.join(base, out))
    return out, values.get("--run-id") or None, resumes


def group_runs(root: str) -> list[Run]:
    """Every job dir of ``root`` in its run (damaged records: a run of their own, empty)."""
    rows = []
    for jid in jobs.list_job_ids(root):
        path = jobs.job_dir(root, jid)
        try:
            st = jobrecord.read_status(path, {}) or {}
            spec = jobrecord.read_spec(path)
        except jobrecord.DamagedRecord:
            st, spec = {}, {}
        rows.append((float(st.get("created_at") or 0.0), jid, spec, st))
    rows.sort(key=lambda r: (r[0], r[1]))
    runs: list[Run] = []
    open_runs: dict[str, Run] = {}  # out-dir -> its latest run
    for created, jid, spec, st in rows:
        out, run_id, resumes = command_facts(spec)
        prev = open_runs.get(out) if out is not None else None
        joins = (prev is not None and resumes
                 and not (run_id and prev.trainer_run_id and run_id != prev.trainer_run_id))
        first = _first_word(jobs.job_dir(root, jid)) if joins else None
        joins = joins and not (first is not None and first["event"] == "step")
        why = _apart(root, prev, spec, out, created, first) if joins and prev is not None else ""
        if joins and prev is not None and not why:
            prev.job_ids.append(jid)
            prev.specs.append(spec)
            prev.statuses.append(st)
            continue
        new = Run(jid, run_id, out, [jid], [spec], [st],
                  (f"job {jid} shares the out-dir of run {prev.run_id if prev else ''} but {why}: "
                   "a run of its own",) if why else ())
        runs.append(new)
        if out is not None:
            open_runs[out] = new
    return runs


def _first_word(path: str) -> dict[str, t.Any] | None:
    """The job's first ``step``, ``resume`` or ``restart`` event (None: none yet). A ``step``
    first: it trained from step 0 (a ``--resume auto`` that found no checkpoint), a new run."""
    found = read_events(os.path.join(path, jobs.EVENTS), stop_at_first=True)[0]
    return found[0] if found else None


def _apart(root: str, prev: Run, spec: t.Mapping[str, t.Any], out: str | None, created: float,
           first: dict[str, t.Any] | None) -> str:
    """Why a resuming job in ``prev``'s out-dir is no continuation of ``prev`` ("" when it
    is): it resumed from a checkpoint outside that out-dir (another run's), or it was created
    while ``prev``'s last job still ran (two trainers in one out-dir at once)."""
    path = first.get("path") if first is not None and first["event"] == "resume" else None
    if isinstance(path, str) and out is not None:
        workdir = spec.get("workdir")
        base = workdir if isinstance(workdir, str) and workdir else "/"
        if os.path.dirname(os.path.normpath(os.path.join(base, path))) != out:
            return f"it resumed from {path[:200]!r}, outside that out-dir"
    last_id, last = prev.job_ids[-1], prev.statuses[-1]
    ended = goodput.number(last.get("ended_at"), *goodput.TIME_RANGE)
    if ended is None and last.get("state") not in _TERMINAL:
        live = _reconciled(root, last_id, last)
        if live.get("state") not in _TERMINAL:
            return f"it was created while job {last_id} still ran (two trainers at once)"
        ended = goodput.number(live.get("ended_at"), *goodput.TIME_RANGE)
    if ended is not None and created and ended > created + goodput.CLOCK_SLACK_S:
        return f"it was created while job {last_id} still ran (two trainers at once)"
    return ""


def read_events(path: str, stop_at_first: bool = False) -> tuple[list[dict[str, t.Any]], int]:
    """``(events, damaged lines)`` of an ``events.jsonl``: at most
    :data:`MAX_EVENTS_BYTES`, a line at most ``goodput.MAX_LINE_CHARS`` (a longer one is
    damaged and skipped without being held), never through a link or from a FIFO (each
    counts as one damaged line). With ``stop_at_first``, only until the first ``step``,
    ``resume`` or ``restart`` event, which alone is returned (whether the job started over,
    and from where it resumed)."""
    try:
        f = boundedread.open_binary(path)  # a regular file, never a link, never a wait
    except boundedread.Refused:
        return [], 1
    except OSError as exc:
        return [], 0 if exc.errno == errno.ENOENT else 1
    events: list[dict[str, t.Any]] = []
    damaged = 0
    with f:
        read = 0
        while read <= MAX_EVENTS_BYTES:
            line = f.readline(goodput.MAX_LINE_CHARS + 1)
            if not line:
                break
            read += len(line)
            if len(line) > goodput.MAX_LINE_CHARS:  # the rest of an overlong line: skipped
                damaged += 1
                while line and not line.endswith(b"\n"):
                    line = f.readline(goodput.MAX_LINE_CHARS)
                    read += len(line)
                continue
            ev = goodput.parse_line(line)
            if ev is None:
                damaged += line.strip() != b""
                continue
            if stop_at_first and ev["event"] in ("step", "resume", "restart"):
                return [ev], 0
            if ev["event"] in goodput.KINDS:
                events.append(ev)
        else:
            damaged += 1  # past the bound: the rest is not read
    return events, damaged


def job_facts(root: str, job_id: str, status: t.Mapping[str, t.Any]) -> goodput.JobFacts:
    """One job's facts for its run's ledger (``status``: its status.json or status doc)."""
    path = jobs.job_dir(root, job_id)
    events, damaged = read_events(os.path.join(path, jobs.EVENTS))
    state = status.get("state") if isinstance(status.get("state"), str) else "LOST"
    ended = goodput.number(status.get("ended_at"), *goodput.TIME_RANGE)
    if ended is None and state in _TERMINAL:
        ended = max((e["_at"] for e in events), default=None)
    return goodput.JobFacts(
        job_id, goodput.number(status.get("created_at"), *goodput.TIME_RANGE),
        goodput.number(status.get("started_at"), *goodput.TIME_RANGE), ended, str(state),
        events, damaged)


_TERMINAL = frozenset(s.value for s in JobState if s.is_terminal())


def _reconciled(root: str, job_id: str, st: dict[str, t.Any]) -> dict[str, t.Any]:
    """A live job's status with the state /proc confirms (a dead job is no running run)."""
    if st.get("state") in _TERMINAL:
        return st
    try:
        return jobs.load(root, job_id).status
    except (AgentFailure, ValueError, OSError):
        return st


def document(root: str, chosen: Run, now: float | None = None) -> GoodputDoc:
    now = time.time() if now is None else now
    ids = chosen.job_ids[-MAX_RUN_JOBS:]
    statuses = chosen.statuses[-MAX_RUN_JOBS:]
    facts = [job_facts(root, jid, _reconciled(root, jid, st))
             for jid, st in zip(ids, statuses, strict=True)]
    expect = goodput.number((chosen.specs[-1] or {}).get("expect_tok_s"), 0.0, 1e15)
    doc = goodput.ledger(facts, now, expect or None)
    doc["unknown"][:0] = chosen.notes
    if len(chosen.job_ids) > MAX_RUN_JOBS:
        doc["unknown"].insert(0, f"only the newest {MAX_RUN_JOBS} of the run's "
                                 f"{len(chosen.job_ids)} jobs are read")
    return t.cast("GoodputDoc", {
        "run_id": chosen.run_id, "trainer_run_id": chosen.trainer_run_id,
        "out_dir": chosen.out_dir, "jobs": list(chosen.job_ids), "state": facts[-1].state,
        **doc})


#: the run's ledger in brief, kept in each live job's dir: derived, never read as a record of
#: state. ``status`` reuses it, and the job's wrapper refreshes it (:func:`refresh_summary`)
#: for the trainer's ``--report-to`` scalars (``wire.ENV_GOODPUT_FILE`` names it to the job)
SUMMARY_CACHE = "goodput-summary.json"
#: a live run's summary is computed again at most this often by ``status`` (a ledger reads
#: every event of the run: ~0.4 s for 20,000 step events, too much for every status poll)
SUMMARY_MAX_AGE_S = 30.0
#: the wrapper refreshes the summary this often at most (its first refresh after
#: :data:`REFRESH_FIRST_S`, when the first steps have been logged) ...
REFRESH_EVERY_S = 60.0
REFRESH_FIRST_S = 15.0
#: ... and never spends more than this share of one core's time on it: a run whose ledger
#: costs 2 s of CPU is refreshed every 200 s
REFRESH_MAX_SHARE = 0.01


def refresh_pause(spent_s: float, every_s: float = REFRESH_EVERY_S,
                  share: float = REFRESH_MAX_SHARE) -> float:
    """Seconds to wait after a refresh that cost ``spent_s`` of CPU: at least ``every_s``, and
    long enough that the refreshes take at most ``share`` of one core."""
    return max(every_s, max(spent_s, 0.0) / share)


def status_summary(root: str, job_id: str, moment: t.Sequence[t.Any] = ()) -> GoodputSummaryDoc | None:
    """The compact ledger a ``status`` reply carries for its job's run; None when it cannot
    be computed (a status never fails over it). Kept in :data:`SUMMARY_CACHE` while the
    run's records are unchanged, or for :data:`SUMMARY_MAX_AGE_S` while the job's
    ``moment`` (its state and attempt, as status read them) stays the same."""
    try:
        cache_path = os.path.join(jobs.job_dir(root, job_id), SUMMARY_CACHE)
        try:  # the job can write its own dir: a link or a FIFO there is no cache
            cached = jobrecord.decode(jobrecord.read_bounded(cache_path, 1 << 20))
        except (OSError, ValueError):
            cached = None
        now = time.time()
        # a summary with no goodput yet (a run too young to have a wall time) is cheap to make
        # again, and reusing it would hide the run's ratio for SUMMARY_MAX_AGE_S
        fresh = isinstance(cached, dict) and isinstance(cached.get("summary"), dict) and \
            cached["summary"].get("goodput") is not None
        if fresh and isinstance(cached.get("at"), float) and cached.get("moment") == list(
                moment) and 0 <= now - cached["at"] < SUMMARY_MAX_AGE_S:
            return t.cast("GoodputSummaryDoc", cached["summary"])
        chosen = next(r for r in group_runs(root) if job_id in r.job_ids)
        key = [[jid, *_stamp(root, jid)] for jid in chosen.job_ids]
        if fresh and cached.get("key") == key:
            return t.cast("GoodputSummaryDoc", cached["summary"])
        return _compute(root, chosen, key, cache_path, moment, now)
    except Exception:
        return None


def refresh_summary(root: str, job_id: str, moment: t.Sequence[t.Any] = ()) -> GoodputSummaryDoc:
    """Compute the job's run's summary now and write it to :data:`SUMMARY_CACHE` (the
    wrapper's refresh; the same document ``status`` reuses).

    Raises:
        AgentFailure: the job id is invalid, or its dir is gone.
        OSError: the summary could not be written (a full disk, a link planted there).
    """
    cache_path = os.path.join(jobs.job_dir(root, job_id), SUMMARY_CACHE)
    chosen = next((r for r in group_runs(root) if job_id in r.job_ids), None)
    if chosen is None:
        raise AgentFailure(ErrorType.NoSuchJob, f"no job {job_id} under {root}", job_id=job_id)
    key = [[jid, *_stamp(root, jid)] for jid in chosen.job_ids]
    return _compute(root, chosen, key, cache_path, moment, time.time(), strict=True)


def _compute(root: str, chosen: Run, key: list[list[t.Any]], cache_path: str,
             moment: t.Sequence[t.Any], now: float, strict: bool = False) -> GoodputSummaryDoc:
    """The run's summary, written to ``cache_path`` (a write failure raises only when
    ``strict``: a full disk costs ``status`` the cache, never the status)."""
    from remote_payload.agent.common import write_json_atomic

    doc = document(root, chosen, now)
    brief = t.cast("GoodputSummaryDoc", {"run_id": doc["run_id"], **goodput.summary(doc)})
    try:
        write_json_atomic(cache_path, {"key": key, "at": now, "moment": list(moment),
                                       "run_id": chosen.run_id, "summary": brief},
                          durable=False)
    except OSError:
        if strict:
            raise
    return brief


def _stamp(root: str, job_id: str) -> list[int]:
    """The job's events file and status record as they stand: size and mtime of each."""
    out: list[int] = []
    for name in (jobs.EVENTS, jobs.STATUS):
        try:
            st = os.stat(os.path.join(jobs.job_dir(root, job_id), name))
            out += [st.st_size, st.st_mtime_ns]
        except OSError:
            out += [-1, -1]
    return out


def job_goodput(root: str, job_id: str, status: t.Mapping[str, t.Any]) -> float | None:
    """The goodput of one job's own attempts (its ``jobs`` row), or None."""
    try:
        facts = job_facts(root, job_id, status)
        return t.cast("float | None", goodput.ledger([facts], time.time())["goodput"])
    except Exception:
        return None
