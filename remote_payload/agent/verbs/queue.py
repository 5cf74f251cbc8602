"""Queue verbs: ``queue``, ``queue-add``, ``queue-rm``, ``queue-move``, ``queue-advance``
(the boot hook's, :mod:`remote_payload.agent.boothook`).

The rules live in :mod:`remote_payload.agent.jobqueue` (pure functions, and the queue derived
from the job dirs); this module turns them into verbs and starts a queued job through
``launch``'s own path (:func:`remote_payload.agent.launching.start_queued`), so notify,
restart policy, time limit and preflight apply unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import typing as t

from remote_payload import wire
from remote_payload.agent import jobqueue as queue
from remote_payload.agent import jobrecord, launching
from remote_payload.agent import jobstore as jobs
from remote_payload.agent.common import AgentFailure
from remote_payload.wire import ErrorType, JobState

if t.TYPE_CHECKING:
    import argparse

    from remote_payload.wire_shapes import (
        DamagedRecordDoc,
        QueueAddDoc,
        QueueDoc,
        QueueHolderDoc,
        QueueRowDoc,
    )


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--slots", type=int, default=None,
                   help="the container's GPU count (the inventory's gpus), kept for the queue")
    if verb == "queue-add":
        p.add_argument("--specs-stdin", action="store_true", required=True,
                       help='read {"specs": [...], "secrets": {NAME: value} | null} on stdin')
    if verb in ("queue-rm", "queue-move"):
        p.add_argument("--job", required=True, help="the queued job (id or unique prefix)")
    if verb == "queue-move":
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--before", default=None, help="move it just before this queued job")
        where.add_argument("--after", default=None, help="move it just after this queued job")


def run(verb: str, args: argparse.Namespace) -> t.Any:
    from remote_payload.agent import tmux

    root = args.root
    socket = tmux.socket_name(getattr(args, "tmux_socket", None))
    slots = _slots(args.slots)
    if verb == "queue":
        launching.advance_queue(root, socket, slots=slots, blocking=False)
        return listing(root)
    if verb == "queue-add":
        return add(root, _read_stdin(), socket=socket, slots=slots)
    for opt in ("job", "before", "after"):  # "" would mean the current job: never here
        if getattr(args, opt, None) == "":
            raise AgentFailure(ErrorType.UsageError, f"{verb}: --{opt} names no job (an empty "
                               "id)", option=opt)
    if verb == "queue-rm":
        job_id = jobs.resolve_job(root, args.job)
        queue.remove(root, job_id)
        moved_on = launching.advance_queue(root, socket, slots=slots)
        return {"job_id": job_id, "state": JobState.CANCELLED.value,
                "end_reason": wire.END_REASON_REMOVED, "cancelled": moved_on["cancelled"],
                "queue": listing(root)}
    if verb == "queue-advance":  # the boot hook's: the same advance, under the queue lock
        moved = launching.advance_queue(root, socket, slots=slots)
        return {"started": moved["started"], "cancelled": moved["cancelled"]}
    if verb == "queue-move":
        job_id = jobs.resolve_job(root, args.job)
        anchor = jobs.resolve_job(root, args.before or args.after)
        move(root, job_id, anchor, before=args.before is not None)
        launching.advance_queue(root, socket, slots=slots)
        return listing(root)
    raise AgentFailure(ErrorType.UnknownVerb, f"verbs.queue does not handle {verb}")


def _slots(value: int | None) -> int | None:
    if value is None:
        return None
    if not 0 <= value <= wire.MAX_GPU_SLOTS:
        raise AgentFailure(ErrorType.UsageError, f"--slots {value}: 0-{wire.MAX_GPU_SLOTS}")
    return value or None


def _read_stdin() -> t.Any:
    data = sys.stdin.buffer.read(wire.MAX_QUEUE_ADD_BYTES + 1)
    if len(data) > wire.MAX_QUEUE_ADD_BYTES:
        raise AgentFailure(ErrorType.BadSpec, f"queue-add: more than {wire.MAX_QUEUE_ADD_BYTES} "
                           "bytes on stdin", field="")
    try:
        return json.loads(data or b"null")
    except ValueError:  # never echo it: it may hold secret values
        raise AgentFailure(ErrorType.BadSpec, "queue-add: stdin is not JSON", field="") from None


def _refused(message: str, why: str, **fields: t.Any) -> AgentFailure:
    return AgentFailure(ErrorType.QueueRefused, message, why=why, **fields)


# --- verbs ----------------------------------------------------------------------------------


def add(root: str, doc: t.Any, *, socket: str, slots: int | None) -> QueueAddDoc:
    """Queue every spec of ``doc["specs"]`` at once (a pipeline's steps), in order.

    Each spec is a launch spec plus ``after`` (a job id: an existing job, or a spec earlier in
    the same document). Nothing is queued unless all are valid.

    Raises:
        AgentFailure: ``BadSpec`` (a spec, the secrets), ``QueueRefused`` (a dependency that
            cannot be met, a full queue), ``JobExists``.
    """
    from remote_payload.agent import boothook, jobsecrets

    try:  # refused before anything is queued: a hook could not name this root
        boothook.check_root(root)
    except ValueError as exc:
        raise _refused(f"queue-add: {exc}; choose another root (the inventory's root:)",
                       "root", root=root) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("specs"), list) or not doc["specs"]:
        raise AgentFailure(ErrorType.BadSpec, 'queue-add: stdin must be {"specs": [spec, ...]}',
                           field="specs")
    raw_specs = doc["specs"]
    if len(raw_specs) > wire.MAX_PIPELINE_STEPS:
        raise _refused(f"{len(raw_specs)} jobs at once; at most {wire.MAX_PIPELINE_STEPS}",
                       "too many", count=len(raw_specs))
    payload = launching.payload_dir()
    specs = []
    for i, raw in enumerate(raw_specs):
        try:
            spec = jobs.validate_spec(raw, payload)
        except AgentFailure as exc:
            raise AgentFailure(exc.type, f"job {i + 1}: {exc.message}", **exc.fields) from None
        spec["workdir"] = launching.bind_to_payload(root, spec["workdir"])
        build = spec.get("torch_build")
        if build is not None and not queue.wire_build_ok(build):
            raise AgentFailure(ErrorType.BadSpec, f"job {i + 1}: torch_build must be a build "
                               "name (torch-<version>-<variant>)", field="torch_build")
        after = spec.get("after")
        if after is not None and not isinstance(after, str):
            raise AgentFailure(ErrorType.BadSpec, f"job {i + 1}: after must be a job id",
                               field="after")
        specs.append(spec)
    secrets = doc.get("secrets")
    names = sorted({n for s in specs for n in s["secrets"]})
    if names or secrets:
        try:
            secrets = jobsecrets.check(secrets or {}, names)
        except ValueError as exc:
            raise AgentFailure(ErrorType.BadSpec, str(exc), field="secrets") from None
    ids = [spec["job_id"] for spec in specs]
    twice = sorted({j for j in ids if ids.count(j) > 1})
    if twice:
        raise AgentFailure(ErrorType.JobExists, f"job {twice[0]} is named twice in this batch; "
                           "every job needs its own id", job_id=twice[0])
    os.makedirs(jobs.jobs_root(root), exist_ok=True)
    # a client that goes away (Ctrl-C, a dropped connection: SIGINT/SIGHUP/SIGTERM) must not
    # leave half a pipeline queued: from here the add runs to its end
    import signal

    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    with queue.locked(root):
        if slots:
            queue.write_slots(root, slots)
        total = queue.read_slots(root) or 0
        snap = queue.scan(root)
        if len(snap.order) + len(specs) > wire.MAX_QUEUE_JOBS:
            raise _refused(f"the queue holds {len(snap.order)} jobs; at most "
                           f"{wire.MAX_QUEUE_JOBS}", "queue full", queued=len(snap.order))
        batch: dict[str, str] = {}
        for i, spec in enumerate(specs):
            if spec.get("after") is not None:
                if spec["after"] == spec["job_id"]:
                    raise _refused(f"job {spec['job_id']} cannot wait for itself", "dependency",
                                   job_id=spec["job_id"])
                spec["after"] = _resolve_after(root, spec["after"], batch)
            request = launching.gpu_request(spec, total)
            unfit = wire.gpu_request_unfit(request, total)
            if unfit is not None:  # it could never start: refused, nothing queued
                raise AgentFailure(ErrorType.BadSpec, f"job {i + 1}: {unfit}", field="gpus")
            try:
                queue.check_after(spec["job_id"], spec.get("after"),
                                  {**_known_states(root, spec.get("after")), **batch})
            except ValueError as exc:
                raise _refused(str(exc), "dependency", job_id=spec["job_id"],
                               after=spec.get("after")) from None
            if os.path.lexists(jobs.job_dir(root, spec["job_id"])):
                raise AgentFailure(ErrorType.JobExists, f"job {spec['job_id']} already exists",
                                   job_id=spec["job_id"])
            batch[spec["job_id"]] = JobState.QUEUED.value
        added = _stage_and_publish(root, specs, secrets, socket=socket, payload=payload,
                                   rank=queue.next_rank(snap))
    hook = boothook.ensure(root)  # after a restart the queue moves on with no client
    moved_on = launching.advance_queue(root, socket)
    return {"added": added, "started": moved_on["started"], "cancelled": moved_on["cancelled"],
            "queue": listing(root), "boot_hook": hook}


def _stage_and_publish(root: str, specs: list[dict[str, t.Any]], secrets: t.Any, *,
                       socket: str, payload: str, rank: float) -> list[str]:
    """Write every job dir of the batch under ``jobs/.staging/``, then move each into place
    (hold the queue lock): a reader sees a queued job only once its records are whole, and a
    full disk leaves none of the batch behind. The staging dirs are opsctl's own and exist
    only while an add holds the lock: what a killed add left there was finished or removed
    as the lock was taken (:func:`remote_payload.agent.jobqueue.settle_staging`)."""
    import shutil

    staging = os.path.join(jobs.jobs_root(root), queue.STAGING)
    if os.path.islink(staging) or (os.path.lexists(staging) and not os.path.isdir(staging)):
        what = "a symbolic link" if os.path.islink(staging) else "not a directory"
        # not opsctl's: never followed, never removed
        raise _refused(f"queue-add: {staging} is {what}, not opsctl's staging directory; "
                       "move it away", "staging", path=staging)
    stage_root = os.path.join(staging, str(os.getpid()))
    staged: list[tuple[str, str]] = []
    try:
        os.makedirs(stage_root)
        for k, spec in enumerate(specs):
            stage = os.path.join(stage_root, spec["job_id"])
            os.mkdir(stage)
            mine = {n: secrets[n] for n in spec["secrets"]} if secrets else None
            launching.write_launch_files(stage, spec, socket=socket, payload=payload,
                                         replaced=None, secrets=mine, check=None,
                                         state=JobState.QUEUED, rank=rank + k)
            staged.append((stage, jobs.job_dir(root, spec["job_id"])))
        open(os.path.join(stage_root, queue.STAGED_WHOLE), "x").close()  # killed from here
        queue.set_hint(root)  # on, the next lock holder moves the rest in (settle_staging)
        for stage, final in staged:  # the ids were checked free under this lock
            os.rename(stage, final)
    finally:
        shutil.rmtree(stage_root, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(stage_root))
    return [spec["job_id"] for spec in specs]


def _resolve_after(root: str, after: str, batch: t.Mapping[str, str]) -> str:
    """``--after``: a job of this batch, an existing job, or the one job an id prefix names.

    Raises:
        AgentFailure: ``QueueRefused`` (no such job; a prefix several jobs share, listed),
            ``BadJobId``.
    """
    if not after:  # never "the current job": a dependency is named, or there is none
        raise _refused("--after names no job (an empty id); give a job id or leave it out",
                       "dependency", after=after)
    if after in batch:
        return after
    try:
        return jobs.resolve_job(root, after)
    except AgentFailure as exc:
        if exc.type == ErrorType.BadJobId:
            raise
        matches = exc.fields.get("matches")
        if matches:
            raise _refused(f"--after {after} is ambiguous: {', '.join(matches)}; give more of "
                           "the id", "dependency", after=after, matches=matches) from None
        raise _refused(f"--after {after}: no such job in this container (`opsctl jobs` lists "
                       "them)", "dependency", after=after) from None


def _known_states(root: str, job_id: str | None) -> dict[str, str]:
    if job_id is None or not os.path.isdir(jobs.job_dir(root, job_id)):
        return {}
    return {job_id: jobs.load(root, job_id).state.value}


def move(root: str, job_id: str, anchor: str, *, before: bool) -> None:
    """``queue move``: reorder (refused when a job would come before its own dependency).

    Raises:
        AgentFailure: ``QueueRefused``.
    """
    with queue.locked(root):
        snap = queue.scan(root)
        afters = {j: queue.job_request(root, j)[1] for j in snap.order}
        try:
            order = queue.moved(snap.order, job_id, anchor, before, afters)
        except ValueError as exc:
            raise _refused(str(exc), "order", job_id=job_id, anchor=anchor) from None
        queue.reorder(root, snap, order, job_id)


def listing(root: str) -> QueueDoc:
    """The queue in order, each job with what it waits for, who holds which GPU slots, and
    the job dirs whose records do not parse (``damaged``: path and reason)."""
    snap = queue.scan(root)
    total = queue.read_slots(root)
    reqs = {j: queue.job_request(root, j) for j in snap.order}
    states = queue.dep_states(root, {j: r[1] for j, r in reqs.items()})
    current = queue.current_build(root)
    rows: list[QueueRowDoc] = []
    for i, jid in enumerate(snap.order):
        request, after = reqs[jid]
        try:
            st = jobrecord.read_status(jobs.job_dir(root, jid), {}) or {}
        except jobrecord.DamagedRecord:
            st = {}
        unfit = wire.gpu_request_unfit(request, total or 0)
        if unfit is not None:
            waits = f"nothing: it cannot run here ({unfit})"
        elif after is not None and states.get(after) != JobState.SUCCEEDED.value:
            waits = f"job {after} ({states.get(after, 'gone')})"
        elif (need := queue.job_build(root, jid)) is not None and need != current \
                and snap.holders:
            waits = (f"torch build {need}: job {next(iter(snap.holders))} runs on "
                     f"{current or 'no build'}")
        else:
            waits = "GPUs" if not queue.assign(request, total or 0, snap.holders)[0] \
                else "its turn"
        rows.append({"job_id": jid, "name": st.get("name"), "position": i + 1, "after": after,
                     "gpus": request, "created_at": st.get("created_at"), "waiting_for": waits})
    held: list[QueueHolderDoc] = []
    for jid, got in snap.holders.items():
        try:
            state: t.Any = jobs.load(root, jid).state.value  # a JobStateName
        except (AgentFailure, ValueError, OSError):
            state = None
        held.append({"job_id": jid, "gpu_slots": got, "state": state})
    return {"jobs": rows, "slots": total, "holders": held,
            "damaged": t.cast("list[DamagedRecordDoc]", snap.damaged)}
