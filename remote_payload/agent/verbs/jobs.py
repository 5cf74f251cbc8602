"""Job verbs: ``launch``, ``status``, ``logs``, ``stop``, ``stacks``, ``jobs``, ``abort``.

Each reads or changes ``<root>/jobs/<id>/`` (see :mod:`remote_payload.agent.jobstore`)
and returns JSON-able data; ``__main__`` wraps it in the reply envelope.
``status`` is on the hot path of every ``opsctl status``/watch poll, so it
imports nothing heavy (no libtmux) and overlaps its subprocesses.
"""

from __future__ import annotations

import json
import os
import sys
import time
import typing as t

from remote_payload import boundedread, wire
from remote_payload.agent import history, launching
from remote_payload.agent import jobqueue as queue
from remote_payload.agent import jobstore as jobs
from remote_payload.agent.common import AgentFailure, read_json, write_json_atomic
from remote_payload.wire import ErrorType

if t.TYPE_CHECKING:
    import argparse

    # the reply shapes (remote_payload/wire_shapes.py): checked by mypy, never imported at run
    # time (defining them costs ~10 ms of every status poll)
    from remote_payload.wire_shapes import (
        BabysittingDoc,
        DamagedRecordDoc,
        DiagnosisDoc,
        GpuRowDoc,
        HistoryDoc,
        JobListDoc,
        JobRowDoc,
        LogsChunkDoc,
        QueueHolderDoc,
        StacksDoc,
        StatusDoc,
        StopDoc,
    )

JobState = jobs.JobState

DEFAULT_LINES = 20
DIAGNOSIS_LINES = 200  # diagnosis sees more of the log than the user asked to display
EVENTS_TAIL = 5
DEFAULT_GRACE_S = jobs.STOP_GRACE_S
DEFAULT_KILL_AFTER_S = jobs.STOP_KILL_AFTER_S
LOGS_MAX_BYTES = 256 * 1024


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    if verb == "launch":
        p.add_argument("--spec-json", required=True, help="job spec (docs/contracts.md)")
        p.add_argument("--replace", action="store_true", help="stop a running job first")
        p.add_argument("--grace", type=float, default=DEFAULT_GRACE_S,
                       help="with --replace: seconds between SIGINT and SIGTERM")
        p.add_argument("--force-gpus", action="store_true",
                       help="launch although GPUs it needs are in use by something else")
        p.add_argument("--secrets-stdin", action="store_true",
                       help="read the spec's secrets as a JSON object {NAME: value} on stdin "
                            "(never on the command line)")
        p.add_argument("--slots", type=int, default=None,
                       help="the container's GPU count (the inventory's gpus): slots for gpus: N")
        p.add_argument("--payload-digest", default=None,
                       help="launch only if the installed payload has this digest (deploy's "
                            "unchanged-payload fast path: one round trip instead of two)")
    if verb in ("status", "logs", "stop", "stacks"):
        p.add_argument("--job", default=None, help="job id (default: the current job)")
    if verb == "abort":
        p.add_argument("--job", required=True, help="the job id an interrupted deploy was launching")
    if verb == "status":
        p.add_argument("--lines", type=int, default=DEFAULT_LINES)
    if verb == "logs":
        p.add_argument("--offset", type=int, default=0)
        p.add_argument("--max-bytes", type=int, default=LOGS_MAX_BYTES)
        p.add_argument("--tail", type=int, default=None,
                       help="start at the last N lines (the later start wins with --since-s)")
        p.add_argument("--since-s", type=float, default=None,
                       help="start at the first output written in the last S seconds (the "
                            "container's clock: a laptop's skew does not matter)")
    if verb == "jobs":
        p.add_argument("--limit", type=_row_limit, default=0, metavar="N",
                       help="the newest N jobs, plus every job still live (0: all); "
                       f"never more than {wire.JOB_ROWS_MAX} rows")
    if verb == "stop":
        p.add_argument("--grace", type=float, default=DEFAULT_GRACE_S,
                       help="seconds between SIGINT and SIGTERM (the trainer checkpoints on SIGINT)")
        p.add_argument("--kill-after", type=float, default=DEFAULT_KILL_AFTER_S,
                       help="seconds between SIGTERM and SIGKILL")
    if verb == "stacks":
        p.add_argument("--timeout", type=float, default=10.0)


def _row_limit(text: str) -> int:
    """``--limit``: a whole number from 0 to :data:`wire.JOB_ROWS_MAX`."""
    import argparse

    if not (text.isascii() and text.isdigit()) or int(text) > wire.JOB_ROWS_MAX:
        raise argparse.ArgumentTypeError(f"not a whole number from 0 to {wire.JOB_ROWS_MAX}")
    return int(text)


def run(verb: str, args: argparse.Namespace) -> t.Any:
    root = args.root
    if verb == "launch":
        if args.payload_digest is not None:
            # a refusal comes first: the client must not ship a payload (a job with gpus: may
            # run beside the current one; launch decides that under the queue lock)
            if not args.replace and not _asks_for_gpus(args.spec_json):
                _refuse_if_running(root)
            _check_payload_digest(args.payload_digest)
        secrets = _read_secrets() if args.secrets_stdin else None
        return launch(root, args.spec_json, replace=args.replace, grace=args.grace,
                      socket=_socket(args), force_gpus=args.force_gpus, secrets=secrets,
                      slots=args.slots or None)
    if verb in ("status", "jobs"):
        _advance_if_queued(root, args)
    if verb == "status":
        return status_document(root, jobs.resolve_job(root, args.job), lines=args.lines)
    if verb == "logs":
        return logs(root, jobs.resolve_job(root, args.job), args.offset, args.max_bytes,
                    tail=args.tail,
                    since=None if args.since_s is None else time.time() - args.since_s)
    if verb == "stop":
        return stop(root, jobs.resolve_job(root, args.job), grace=args.grace,
                    kill_after=args.kill_after)
    if verb == "stacks":
        return stacks(root, jobs.resolve_job(root, args.job), timeout=args.timeout)
    if verb == "jobs":
        return list_jobs(root, limit=args.limit)
    if verb == "abort":
        return abort(root, args.job)
    raise AgentFailure(ErrorType.UnknownVerb, f"verbs.jobs does not handle {verb}")


def _asks_for_gpus(spec_json: str) -> bool:
    try:
        spec = json.loads(spec_json)
    except ValueError:
        return False
    return isinstance(spec, dict) and spec.get("gpus") is not None


def _advance_if_queued(root: str, args: argparse.Namespace) -> None:
    """After a container restart no wrapper is left to move the queue on: the next ``status``
    or ``jobs`` does (never waiting for the lock; a queue that is empty costs one stat)."""
    if not queue.may_have_queued(root):
        return
    launching.advance_queue(root, _socket(args), blocking=False)


def _read_secrets() -> t.Any:
    try:
        return json.loads(sys.stdin.buffer.read() or b"{}")
    except ValueError:
        # never echo what came in: it holds secret values
        raise AgentFailure(ErrorType.BadSpec, "secrets on stdin are not a JSON object",
                           field="secrets") from None


def _socket(args: argparse.Namespace) -> str:
    from remote_payload.agent import tmux

    return tmux.socket_name(getattr(args, "tmux_socket", None))


# --- status -------------------------------------------------------------------


def status_document(root: str, job_id: str, lines: int = DEFAULT_LINES, *,
                    live: bool = True) -> StatusDoc:
    """The status document of docs/contracts.md, reconciled against /proc.

    ``live=False`` (the ``jobs`` list) skips what costs a subprocess per job: the pane
    capture and the GPU query (``gpus`` stays empty, ``pane_tail`` too) and the history.
    """
    from remote_payload.agent import gpus
    from remote_payload.agent.tmux import PaneCapture

    now = time.time()
    # the wrapper samples GPUs while the job runs; otherwise nvidia-smi runs while we read files
    sample = gpus.read_sample(os.path.join(jobs.job_dir(root, job_id), gpus.SAMPLE_FILE), now)
    gpu_query = None if sample is not None or not live else gpus.GpuQuery()
    rec = jobs.load(root, job_id)
    pane = None
    if rec.launch.get("tmux_session") and live:
        pane = PaneCapture(rec.launch["tmux_socket"], rec.launch["tmux_session"], lines)
    output_log = os.path.join(rec.path, jobs.OUTPUT)
    diag_tail, size = jobs.tail_lines(output_log, max(lines, DIAGNOSIS_LINES))
    events_tail = jobs.tail_events(os.path.join(rec.path, jobs.EVENTS), EVENTS_TAIL)
    st = rec.status
    exit_rec = rec.exit or {}
    started = st.get("started_at") or rec.pid.get("started_at")
    ended = st.get("ended_at") or exit_rec.get("ended_at")
    if rec.state.is_terminal() and ended is None:
        ended = now
    created = st.get("created_at") or rec.launch.get("created_at") or now
    babysitting = _babysitting(rec)
    doc: StatusDoc = {
        "job_id": job_id,
        "name": rec.spec.get("name") or st.get("name") or job_id,
        "state": rec.state.value,
        "healthy": bool(st.get("healthy")) or rec.state == JobState.SUCCEEDED,
        "phase": st.get("phase"),
        "created_at": created,
        "started_at": started,
        "ended_at": ended,
        "elapsed_s": round((ended or now) - (started or created), 3),
        "pid": rec.pid.get("pid"),
        "pgid": rec.pid.get("pgid"),
        "alive": rec.alive,
        "exit_code": exit_rec.get("exit_code", st.get("exit_code")),
        "signal": exit_rec.get("signal", st.get("signal")),
        "pane_tail": [],
        "output_tail": diag_tail[-lines:] if lines > 0 else [],
        "output_log": output_log,
        "output_size": size,
        "last_output_at": st.get("last_output_at"),
        "last_step": st.get("last_step"),
        "events_tail": events_tail,
        "gpus": [],
        "gpu_error": None,
        "gpus_at": now,
        "diagnosis": [],
        "evidence": rec.evidence,
        "tmux": {"socket": rec.launch.get("tmux_socket"), "session": rec.launch.get("tmux_session"),
                 "error": None},
        "healthy_when": rec.spec.get("healthy_when"),
        "timeout_s": rec.spec.get("timeout_s"),
        "expect_tok_s": rec.spec.get("expect_tok_s"),  # diagnosis warns on throughput regressions
        "hang_after_s": rec.spec.get("hang_after_s"),
        "phase_budgets_s": rec.spec.get("phase_budgets_s") or {},
        "budget_s": st.get("budget_s"),  # the job's own announcement for its current phase
        "hang_threshold_s": None,
        "hang": read_json(os.path.join(rec.path, jobs.HANG), None),
        "errors": st.get("errors") or [],
        "preflight": read_json(os.path.join(rec.path, gpus.PREFLIGHT_FILE), None),
        "transitions": st.get("transitions") or [],
        "now": now,
        "attempt": babysitting["attempt"], "max_restarts": babysitting["max_restarts"],
        "restarts": babysitting["restarts"], "end_reason": babysitting["end_reason"],
        "max_duration_s": babysitting["max_duration_s"], "run": babysitting["run"],
    }
    doc["gpu_slots"] = rec.spec.get("gpu_slots")
    doc["after"] = rec.spec.get("after")
    if live:
        doc["gpu_holders"] = _gpu_holders(root)
    # gpus.py, diagnosis.py and history.py build plain dicts of these shapes
    if gpu_query is not None:
        gpu_rows, doc["gpu_error"] = gpu_query.result()
        doc["gpus"] = t.cast("list[GpuRowDoc]", gpu_rows)
    elif sample is not None:
        gpu_rows, doc["gpu_error"], doc["gpus_at"] = sample
        doc["gpus"] = t.cast("list[GpuRowDoc]", gpu_rows)
    # while tmux captures the pane (a process start, the slowest part of a status): diagnosis
    # and history, which do not read the pane
    plain = t.cast("dict[str, t.Any]", doc)
    doc["hang_threshold_s"] = _hang_threshold(plain)
    doc["diagnosis"] = t.cast("list[DiagnosisDoc]", _diagnose(diag_tail, events_tail, plain, now))
    if live:
        doc["history"] = t.cast("HistoryDoc | None", history.for_status(
            rec.path, plain["diagnosis"], ended or now))
        from remote_payload.agent.verbs import goodput

        doc["goodput"] = goodput.status_summary(root, job_id, (rec.state.value, doc["attempt"]))
    if pane is not None:
        doc["pane_tail"] = pane.result()
        doc["tmux"]["error"] = pane.error
    return doc


def _gpu_holders(root: str) -> list[QueueHolderDoc]:
    """Which live job holds which GPU slots, as the job dirs say (the states are not
    reconciled here: the status path stays cheap)."""
    try:
        holders = queue.scan(root, reconcile=False).holders
    except OSError:
        return []
    return [{"job_id": j, "gpu_slots": s, "state": None} for j, s in holders.items()]


def _babysitting(rec: jobs.JobRecord) -> BabysittingDoc:
    """Restart attempts, the wall-clock limit and why the job ended (``status`` and ``jobs``)."""
    st = rec.status
    end_reason = st.get("end_reason")
    if end_reason is None and rec.state == JobState.CANCELLED:  # ended by the agent's reconcile
        end_reason = jobs.cancel_reason(rec.path) or "cancelled"
    return {"attempt": st.get("attempt") or 1,
            "max_restarts": (rec.spec.get("restart") or {}).get("max_restarts"),
            "restarts": st.get("restarts") or [], "end_reason": end_reason,
            "max_duration_s": rec.spec.get("max_duration_s"),
            "run": rec.spec.get(wire.RUN_FIELD)}  # wire.RUN_FIELD: a multi-node run's membership


def _hang_threshold(doc: dict[str, t.Any]) -> float | None:
    try:
        from remote_payload.agent import diagnosis

        return diagnosis.hang_threshold(doc)[0]
    except Exception:  # diagnosis not shipped or broken: _diagnose reports it
        return None


def _diagnose(tail: list[str], events: list[dict[str, t.Any]], doc: dict[str, t.Any],
              now: float) -> list[dict[str, t.Any]]:
    """Run the diagnosis module if it is shipped; its failure is a finding, never an outage."""
    import importlib

    try:
        diagnosis = importlib.import_module("remote_payload.agent.diagnosis")
    except ModuleNotFoundError as exc:
        if exc.name == "remote_payload.agent.diagnosis":  # not shipped (yet): nothing to say
            return []
        return [_diag_failure(exc)]
    except Exception as exc:
        return [_diag_failure(exc)]
    try:
        found = diagnosis.diagnose(output_tail=tail, events=events, status=doc, now=now)
        return [dict(d) for d in found]
    except Exception as exc:
        return [_diag_failure(exc)]


def _diag_failure(exc: BaseException) -> dict[str, t.Any]:
    return {"cause": "diagnosis_failed", "severity": "info",
            "summary": f"diagnosis raised {type(exc).__name__}: {exc}",
            "evidence": [], "hint": "report this as an opsctl bug; the status above is still valid"}


# --- launch -------------------------------------------------------------------


def launch(root: str, spec_json: str, *, replace: bool, grace: float,
           socket: str, force_gpus: bool = False, secrets: t.Any = None,
           slots: int | None = None) -> StatusDoc:
    """Create ``jobs/<id>/`` and start the wrapper in tmux; return the first status document.

    Raises
    ------
    AgentFailure
        ``BadSpec``, ``JobAlreadyRunning`` (without ``--replace``), ``GpusBusy`` (without
        ``--force-gpus``; checked before the running job is touched), ``JobExists``,
        ``LaunchAborted`` (the deploy was interrupted: ``abort``), ``TmuxFailed`` or
        ``LaunchFailed`` (the wrapper never recorded a start).

    A job with ``gpus`` (a count or a list of slots) runs beside the live jobs whose slots it
    does not share; without, it takes the whole container (every live job is in its way).
    ``slots``: the container's GPU count (the inventory's ``gpus``), kept for the queue.
    """
    from remote_payload.agent import gpus

    try:
        raw = json.loads(spec_json)
    except ValueError as exc:
        raise AgentFailure(ErrorType.BadSpec, f"--spec-json is not JSON: {exc}", field="") from None
    payload = launching.payload_dir()
    spec = jobs.validate_spec(raw, payload)
    if spec["secrets"] or secrets is not None:
        from remote_payload.agent import jobsecrets

        try:
            secrets = jobsecrets.check(secrets if secrets is not None else {}, spec["secrets"])
        except ValueError as exc:
            raise AgentFailure(ErrorType.BadSpec, str(exc), field="secrets") from None
    spec["workdir"] = launching.bind_to_payload(root, spec["workdir"])
    job_id = spec["job_id"]
    build_env, build_python = launching.torch_build(root)
    spec["env"] = {**build_env, **spec["env"]}  # the spec's own values win
    if build_python and not spec.get("python"):
        spec["python"] = build_python

    with queue.locked(root):  # one start at a time: two jobs never pick the same GPU slot
        if slots:
            queue.write_slots(root, slots)
        total = queue.read_slots(root) or 0
        request = launching.gpu_request(spec, total)
        holders = queue.live_holders(root)
        fits, got, in_the_way = launching.slot_conflicts(request, total, holders)
        if in_the_way and not replace:
            first = in_the_way[0]
            raise AgentFailure(ErrorType.JobAlreadyRunning,
                               launching.in_the_way_message(root, first, request),
                               job_id=first, state=launching.holder_state(root, first))
        launching.set_slots(spec, got if fits else None, request)
        running = [jobs.load(root, j) for j in in_the_way]
        # GPUs held by anything but opsctl's jobs: visible foreign processes refuse before a
        # running job is touched; memory (which inside a container has no visible owner) is
        # judged once the jobs being replaced have stopped and freed their own
        needed = gpus.needed_gpus(spec)
        check = gpus.preflight(needed, launching.opsctl_job_pids(root, holders), memory=not running)
        launching.refuse_busy_gpus(check, force_gpus)
        check["rows"] = launching.refuse_failing_rows(root, needed, force_gpus)

        path = jobs.job_dir(root, job_id)
        os.makedirs(jobs.jobs_root(root), exist_ok=True)
        # An interrupted deploy (``abort``) and this launch serialize on the launch lock: the
        # abort either lands before the old job is touched / the new one is created, or it
        # sees exactly what was done.
        with jobs.launch_lock(root):
            _refuse_if_aborted(root, job_id)
            for rec in running:
                jobs.request_cancel(root, rec.job_id, reason=f"replaced by job {job_id}")
        current = running[0].job_id if running else None
        if running:
            for rec in running:
                stop(root, rec.job_id, grace=grace, kill_after=DEFAULT_KILL_AFTER_S,
                     reason=f"replaced by job {job_id}")
            holders = {k: v for k, v in holders.items() if k not in in_the_way}
            fits, got, _ = launching.slot_conflicts(request, total, holders)
            launching.set_slots(spec, got if fits else None, request)
            rows = check["rows"]
            check = gpus.preflight(gpus.needed_gpus(spec), launching.opsctl_job_pids(root, holders))
            launching.refuse_busy_gpus(check, force_gpus)
            check["rows"] = rows
        check["forced"] = force_gpus and (bool(check["busy"]) or any(
            r["status"] == "fail" for r in check["rows"]))
        with jobs.launch_lock(root):
            _refuse_if_aborted(root, job_id)
            try:
                os.mkdir(path)
            except FileExistsError:
                raise AgentFailure(ErrorType.JobExists, f"job {job_id} already exists",
                                   job_id=job_id) from None
        launching.write_launch_files(path, spec, socket=socket, payload=payload,
                                     replaced=current, secrets=secrets, check=check)
        jobs.set_current_job(root, job_id)  # its slots: spec.json's gpu_slots (the record)
        launching.start_wrapper(root, path, spec, socket)
    first_status = status_document(root, job_id)
    # a launch that replaced jobs may have freed GPUs a queued job waits for
    launching.advance_queue(root, socket)
    return first_status


def _refuse_if_running(root: str, replace: bool = False) -> str | None:
    """The current job's id when it is live and ``replace`` allows stopping it; else None.

    Raises
    ------
    AgentFailure
        ``JobAlreadyRunning`` when it is live and ``replace`` is false.
    """
    current = jobs.current_job_id(root)
    if not current or not os.path.isdir(os.path.join(jobs.jobs_root(root), current)):
        return None
    rec = jobs.load(root, current)
    if rec.state.is_terminal():
        return None
    if not replace:
        raise AgentFailure(ErrorType.JobAlreadyRunning,
                           f"job {current} is {rec.state.value}; stop it or launch with --replace",
                           job_id=current, state=rec.state.value)
    return current


def _refuse_if_aborted(root: str, job_id: str) -> None:
    if os.path.exists(jobs.abort_marker(root, job_id)):
        raise AgentFailure(ErrorType.LaunchAborted, f"job {job_id}: the deploy launching it was interrupted "
                           "(abort recorded); not launched", job_id=job_id)


def _check_payload_digest(want: str) -> None:
    """Refuse (before touching any job) when the installed payload is not ``want``."""
    try:
        have = (read_json(os.path.join(launching.payload_dir(), "MANIFEST.json"), {}) or {}).get("digest")
    except (OSError, ValueError, AttributeError):  # unreadable manifest: ship the payload again
        have = None
    if have != want:
        raise AgentFailure(ErrorType.PayloadMismatch, f"installed payload is {str(have)[:12]}, "
                           f"deploy sends {want[:12]}", have=have, want=want)


# --- logs ---------------------------------------------------------------------


def logs(root: str, job_id: str, offset: int, max_bytes: int, *, tail: int | None = None,
         since: float | None = None) -> LogsChunkDoc:
    """Raw bytes of ``output.log`` from ``offset`` (or from the last ``tail`` lines, or from
    the first output written at or after ``since``: :mod:`remote_payload.agent.outindex`).

    The state is read *before* the bytes: a terminal state plus ``eof`` means
    the follower has everything.
    """
    from base64 import b64encode  # here: `status` (every poll) never needs it

    from remote_payload.agent import outindex

    if offset < 0 or max_bytes <= 0 or (tail is not None and tail < 0):
        raise AgentFailure(ErrorType.BadOffset, "offset and tail must be >= 0 and max-bytes > 0",
                           offset=offset, max_bytes=max_bytes, tail=tail)
    rec = jobs.load(root, job_id)
    path = os.path.join(rec.path, jobs.OUTPUT)
    since_indexed = None
    try:
        with boundedread.open_binary(path) as f:
            size = f.seek(0, os.SEEK_END)
            if tail is not None or since is not None:
                starts = []
                if tail is not None:
                    starts.append(outindex.offset_of_last_lines(path, tail, size))
                if since is not None:
                    found = outindex.offset_since(rec.path, since, size)
                    since_indexed = found is not None
                    starts.append(0 if found is None else found)
                offset = max(starts)
            if offset > size:
                raise AgentFailure(ErrorType.BadOffset, f"offset {offset} is past the end ({size})",
                                   offset=offset, size=size)
            f.seek(offset)
            data = f.read(max_bytes)
    except FileNotFoundError:
        data, size = b"", 0
    except boundedread.Refused as exc:  # a link, FIFO or device where the job's log belongs
        from remote_payload.agent.jobrecord import DamagedRecord

        raise DamagedRecord(path, exc.reason) from None
    next_offset = offset + len(data)
    return {"job_id": job_id, "offset": offset, "next_offset": next_offset,
            "data_b64": b64encode(data).decode("ascii"), "eof": next_offset >= size,
            "size": size, "state": rec.state.value, "terminal": rec.state.is_terminal(),
            "exit_code": (rec.exit or {}).get("exit_code", rec.status.get("exit_code")),
            "signal": (rec.exit or {}).get("signal", rec.status.get("signal")),
            "since_indexed": since_indexed}


# --- stop ---------------------------------------------------------------------


def stop(root: str, job_id: str, *, grace: float = DEFAULT_GRACE_S,
         kill_after: float = DEFAULT_KILL_AFTER_S, reason: str = "opsctl stop") -> StopDoc:
    """SIGINT the job's processes, then SIGTERM after ``grace``, then SIGKILL.

    The job's processes are its process group *and* every process carrying its
    ``OPSCTL_JOB_ID`` marker (detached children: ``setsid``, double forks). Returns the
    signals sent and the pids still left after SIGKILL (a process stuck in the kernel),
    which the CLI reports; a finished job's leftover detached processes are ended too.
    """
    from remote_payload.agent import jobrecord

    try:
        rec = jobs.load(root, job_id)
    except jobrecord.DamagedRecord as exc:
        return _stop_damaged(root, job_id, exc, grace=grace, kill_after=kill_after,
                             reason=reason)
    pgid: int | None = rec.pid.get("pgid")
    ticks: int | None = rec.pid.get("start_ticks")
    cgroup: str | None = rec.pid.get("cgroup")
    if rec.state == JobState.QUEUED:  # it never started: taken out of the queue (`queue rm`)
        queue.remove(root, job_id)
        return {"job_id": job_id, "state": JobState.CANCELLED.value, "signals_sent": [],
                "remaining_pids": [], "already_terminal": False}
    if rec.state.is_terminal():
        sent, remaining = jobs.escalate(job_id, None, ticks, cgroup, jobs.LEFTOVERS_PLAN)
        return {"job_id": job_id, "state": rec.state.value, "signals_sent": sent,
                "remaining_pids": remaining, "already_terminal": True}
    jobs.request_cancel(root, job_id, reason=reason)
    t0 = time.monotonic()
    sent, remaining = jobs.escalate(job_id, pgid, ticks, cgroup, jobs.stop_plan(grace, kill_after))
    # the wrapper records the exit (and so CANCELLED); give it a moment
    jobs.wait_until(lambda: jobs.load(root, job_id).state.is_terminal(), 3.0, 0.02)
    rec = jobs.load(root, job_id)
    return {"job_id": job_id, "state": rec.state.value, "signals_sent": sent,
            "remaining_pids": remaining, "waited_s": round(time.monotonic() - t0, 3),
            "exit_code": (rec.exit or {}).get("exit_code"), "signal": (rec.exit or {}).get("signal")}


def _stop_damaged(root: str, job_id: str, damage: ValueError, *, grace: float,
                  kill_after: float, reason: str) -> StopDoc:
    """``stop`` of a job whose records do not parse: its processes are still ended (found by
    :func:`jobs.damaged_job_processes`: marker, cgroup, the ``pid`` record where it parses),
    with the same escalation, and the cancel marker is written so a live wrapper records
    CANCELLED (it rewrites ``status.json`` whole). The damaged record itself is left as it is.

    Raises:
        AgentFailure: ``DamagedRecord`` when the record still does not parse afterwards: the
            message says which signals went out and which pids survived (never a state the
            record cannot back).
    """
    from remote_payload.agent import jobrecord

    path = getattr(damage, "path", jobs.job_dir(root, job_id))
    why = getattr(damage, "reason", str(damage))
    pgid, ticks, cgroup = jobs.damaged_pid_facts(root, job_id)
    found = jobs.damaged_job_processes(root, [job_id])[job_id]
    sent: list[str] = []
    remaining: list[int] = []
    t0 = time.monotonic()
    if found:
        jobs.request_cancel(root, job_id, reason=reason)
        sent, remaining = jobs.escalate(job_id, pgid, ticks, cgroup,
                                        jobs.stop_plan(grace, kill_after))
        remaining = sorted(set(remaining) | set(jobs.damaged_job_processes(root, [job_id])[job_id]))

        def readable_end() -> bool:
            try:
                return jobs.load(root, job_id).state.is_terminal()
            except (jobrecord.DamagedRecord, AgentFailure):
                return False

        if not remaining and jobs.wait_until(readable_end, 3.0, 0.02):
            rec = jobs.load(root, job_id)  # the wrapper wrote its record again
            return {"job_id": job_id, "state": rec.state.value, "signals_sent": sent,
                    "remaining_pids": [], "waited_s": round(time.monotonic() - t0, 3),
                    "exit_code": (rec.exit or {}).get("exit_code"),
                    "signal": (rec.exit or {}).get("signal")}
    if not found:
        ended = "no process of the job was running"
    elif remaining:
        ended = (f"sent {', '.join(sent)} to its processes {found}; pids {remaining} still "
                 "run (stuck in the kernel?)")
    else:
        ended = f"sent {', '.join(sent)} to its processes {found}; none is left"
    raise AgentFailure(ErrorType.DamagedRecord, f"damaged job record {path}: {why}; {ended}; "
                       "the record is left as it is", path=path, reason=why, job_id=job_id,
                       signals_sent=sent, remaining_pids=remaining, found_pids=found)


# --- stacks -------------------------------------------------------------------


def stacks(root: str, job_id: str, *, timeout: float) -> StacksDoc:
    """Every python process of the job dumps all its threads' stacks into its own file.

    Raises
    ------
    AgentFailure
        ``JobNotRunning`` or ``NoStacks`` (no python process, no handler, no dump).
    """
    from remote_payload.agent import stacks as stacks_mod

    rec = jobs.load(root, job_id)
    if rec.state.is_terminal() or not rec.alive:
        raise AgentFailure(ErrorType.JobNotRunning, f"job {job_id} is {rec.state.value}; no stacks",
                           job_id=job_id, state=rec.state.value)
    armed, unarmed = stacks_mod.armed_pythons(rec.pid.get("pgid"), rec.pid.get("start_ticks"))
    if not armed:
        members = jobs.group_members(rec.pid.get("pgid"), rec.pid.get("start_ticks"))
        why = (f"python pids {unarmed} have no stack-dump handler (sitecustomize not loaded, e.g. "
               "python -I/-S); not signalled because the signal would kill them" if unarmed
               else f"job {job_id} has no python process (pids {members})")
        raise AgentFailure(ErrorType.NoStacks, why, job_id=job_id, pids=unarmed or members)
    procs = stacks_mod.capture(rec.path, armed, timeout=timeout)
    if not procs:
        raise AgentFailure(ErrorType.NoStacks, f"signalled {armed} but no stack dump appeared within "
                           f"{timeout:g}s", job_id=job_id, pids=armed)
    saved = stacks_mod.save(rec.path, procs, time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    return {"job_id": job_id, "pids": armed, "unarmed_pids": unarmed,
            "processes": [p.to_dict() for p in procs],
            "summary": stacks_mod.summary(procs),
            "threads": sum(p.threads for p in procs),
            "dump": "\n\n".join(p.dump for p in procs), "saved_to": saved}


# --- abort --------------------------------------------------------------------


def abort(root: str, job_id: str) -> dict[str, t.Any]:
    """An interrupted deploy: make sure ``job_id`` is never launched late, and report exactly
    what its launch already did (under the launch lock, so the answer cannot go stale)."""
    jobs.job_dir(root, job_id)  # validates the id
    os.makedirs(jobs.jobs_root(root), exist_ok=True)
    with jobs.launch_lock(root):
        launched = os.path.isdir(jobs.job_dir(root, job_id))
        if not launched:
            marker = jobs.abort_marker(root, job_id)
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            write_json_atomic(marker, {"at": time.time()})
        old = None
        if launched:
            old = (read_json(os.path.join(jobs.job_dir(root, job_id), jobs.LAUNCH), {}) or {}).get(
                "replaced")
        else:
            old = jobs.current_job_id(root)
    doc: dict[str, t.Any] = {"job_id": job_id, "launched": launched, "state": None,
                             "old_job": old, "old_state": None, "old_cancel_requested": False}
    if launched:
        doc["state"] = jobs.load(root, job_id).state.value
    if old and os.path.isdir(jobs.job_dir(root, old)):
        rec = jobs.load(root, old)
        doc["old_state"] = rec.state.value
        try:  # sent by this deploy's launch (not by an earlier, unrelated stop)
            cancel = read_json(os.path.join(rec.path, jobs.CANCEL), {}) or {}
        except ValueError:  # the empty marker of a full disk
            cancel = {"reason": f"replaced by job {job_id}"}
        doc["old_cancel_requested"] = cancel.get("reason") == f"replaced by job {job_id}"
    jobs.prune_abort_markers(root)
    return doc


# --- jobs ---------------------------------------------------------------------

#: The restart policy's fields of a ``status`` document (:func:`_babysitting` fills them),
#: copied into each ``jobs`` row so the list shows attempts and restart decisions.
RESTART_KEYS = ("attempt", "max_restarts", "restarts", "end_reason", "max_duration_s", "run")
SUMMARY = "summary.json"  # a terminal job's row of the jobs list, cached (it never changes)


def list_jobs(root: str, limit: int = 0) -> JobListDoc:
    """Every job (or the newest ``limit`` plus every live one) with its reconciled state,
    times, exit, last step and diagnosis headline, newest first; a job dir whose records do
    not parse is listed under ``damaged`` (path and reason) and left on disk untouched."""
    from remote_payload.agent import jobrecord

    damaged: list[DamagedRecordDoc] = [{"path": p, "reason": jobs.LINKED_JOB_DIR}
                                       for p in jobs.linked_job_dirs(root)]
    try:
        current = jobs.current_job_id(root)
    except jobrecord.DamagedRecord as exc:  # listed with the rest; the jobs still are
        current = None
        damaged.append({"path": exc.path, "reason": exc.reason})
    dated = []
    for jid in jobs.list_job_ids(root):
        try:
            st = jobrecord.read_status(jobs.job_dir(root, jid), {}) or {}
            if st.get("state") == JobState.QUEUED.value:  # damaged for the queue: here too
                jobrecord.read_queued_spec(jobs.job_dir(root, jid))
        except jobrecord.DamagedRecord as exc:
            damaged.append({"path": exc.path, "reason": exc.reason})
            continue
        dated.append((float(st.get("created_at") or 0.0), jid, st.get("state")))
    dated.sort(reverse=True)
    rows: list[JobRowDoc] = []
    for i, (created, jid, recorded) in enumerate(dated):
        if len(rows) >= wire.JOB_ROWS_MAX:
            break  # the newest JOB_ROWS_MAX: a reply the CLI takes (``total`` counts them all)
        if limit and i >= limit and recorded in _TERMINAL_NAMES:
            continue  # older and over (states only move forward): outside the window
        try:
            row = _job_row(root, jid)
        except jobrecord.DamagedRecord as exc:
            damaged.append({"path": exc.path, "reason": exc.reason})
            continue
        except (AgentFailure, ValueError, OSError) as exc:
            row = {"job_id": jid, "state": None, "error": str(exc), "created_at": created}
        row["current"] = jid == current
        rows.append(row)
    return {"current": current, "jobs": rows, "total": len(dated), "limit": limit,
            "damaged": sorted(damaged, key=lambda d: d["path"])[:wire.JOB_ROWS_MAX]}


_TERMINAL_NAMES = frozenset(s.value for s in JobState if s.is_terminal())


def _job_row(root: str, job_id: str) -> JobRowDoc:
    """One job's row; a terminal job's is computed once and kept in ``summary.json``."""
    path = jobs.job_dir(root, job_id)
    summary_path = os.path.join(path, SUMMARY)
    try:
        stamp = os.stat(os.path.join(path, jobs.STATUS)).st_mtime_ns
    except FileNotFoundError:
        stamp = 0
    try:
        cached = read_json(summary_path, None)
    except (ValueError, OSError):  # a damaged cache is computed again (and rewritten)
        cached = None
    if isinstance(cached, dict) and cached.get("status_mtime_ns") == stamp and stamp:
        return t.cast("JobRowDoc", {k: v for k, v in cached.items() if k != "status_mtime_ns"})
    from remote_payload.agent.verbs import goodput

    doc = status_document(root, job_id, lines=0, live=False)
    diag = doc.get("diagnosis") or []
    step = doc.get("last_step") or {}
    row: JobRowDoc = {
        "job_id": job_id, "name": doc.get("name"), "state": doc["state"],
        "created_at": doc.get("created_at"), "started_at": doc.get("started_at"),
        "ended_at": doc.get("ended_at"), "elapsed_s": doc.get("elapsed_s"),
        "exit_code": doc.get("exit_code"), "signal": doc.get("signal"),
        "last_step": {k: step.get(k) for k in ("step", "loss", "tok_s") if k in step} or None,
        "headline": ({"cause": diag[0]["cause"], "severity": diag[0]["severity"],
                      "summary": diag[0]["summary"]} if diag else None),
        "attempt": doc["attempt"], "max_restarts": doc["max_restarts"], "restarts": doc["restarts"],
        "end_reason": doc["end_reason"], "max_duration_s": doc["max_duration_s"], "run": doc["run"],
        "gpu_slots": doc.get("gpu_slots"), "after": doc.get("after"),
        "goodput": goodput.job_goodput(root, job_id, doc),
    }
    if doc["state"] in _TERMINAL_NAMES and stamp:
        try:
            write_json_atomic(summary_path, {**row, "status_mtime_ns": stamp}, durable=False)
        except OSError:  # a full disk costs the cache, never the list
            pass
    return row
