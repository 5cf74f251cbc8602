"""The container's job queue (issue 27): order, dependencies, GPU slots, and ``advance``.

A queued job is a job dir like any other (``jobs/<id>/``: spec, launch facts, ``status.json``
in state QUEUED), so ``jobs`` and ``status`` show it with no extra path. ``jobs/queue.json``
holds what no single job dir can: the order of the queued jobs, the container's GPU slot
count, and which live job holds which slots (``holders``; ``None`` is the whole container).
It is written with write-then-rename under ``jobs/.queue.lock``, so two clients adding at
once both succeed, in some order, and a reader never sees half a file. A damaged file is set
aside and rebuilt from the job dirs (they are the record; nothing is lost).

The rules are pure functions (:func:`assign`, :func:`plan`, :func:`check_after`,
:func:`moved`), one definition for every caller, tested with hypothesis. :func:`advance`
applies them: it starts every queued job whose dependency succeeded and whose GPUs are free
and cancels the dependants of a job that failed, was cancelled or was lost. It runs with no
client connected: the agent calls it after every queue change and launch, and each job's
wrapper calls it when its job has reached its terminal state (after the restart policy is
done), so a chain moves on while the laptop is closed. After a container restart (no wrapper
survives) the boot hook (:mod:`remote_payload.agent.boothook`, installed by the first
``queue-add``) runs ``queue-advance``, and the next agent call that reads the queue
(``queue``, ``jobs``, ``status``, ``deploy``) advances it too.

GPU slots: a job's ``gpus`` is a count (the lowest free slots), a list of slot indices, or
absent (the whole container, as ``deploy`` always meant). The queue is first in, first out
for GPUs: a job that waits for GPUs holds back the jobs behind it (no starvation of a large
job by small ones); a job that waits for its dependency holds back nobody.
"""

from __future__ import annotations

import contextlib
import os
import time
import typing as t

from remote_payload import wire
from remote_payload.agent.common import AgentFailure, read_json, write_json_atomic
from remote_payload.wire import ErrorType, JobState

QUEUE_FILE = "queue.json"
QUEUE_LOCK = ".queue.lock"
QUEUE_VERSION = 1
#: the failure states that cancel a job's dependants
FAILED_STATES = frozenset({JobState.FAILED.value, JobState.CANCELLED.value, JobState.LOST.value})

Slots = t.Optional[list[int]]  # noqa: UP045 (the 3.10 agent evaluates it at run time)


class QueueDoc(t.NamedTuple):
    """``jobs/queue.json`` as read back (:func:`parse_doc`)."""

    order: list[str]  # queued job ids, first to start first
    slots: int | None  # the container's GPU slot count (the inventory's ``gpus``), if known
    holders: dict[str, Slots]  # live job id -> the slots it holds (None: all of them)

    def to_json(self) -> dict[str, t.Any]:
        return {"version": QUEUE_VERSION, "order": list(self.order), "slots": self.slots,
                "holders": {k: (list(v) if v is not None else None) for k, v in self.holders.items()}}


EMPTY = QueueDoc([], None, {})


# --- the rules (pure) -----------------------------------------------------------------------


def parse_doc(raw: t.Any) -> QueueDoc:
    """``queue.json``'s content, checked (it is read back from disk: never trusted).

    Raises:
        ValueError: not the shape :meth:`QueueDoc.to_json` writes.
    """
    if not isinstance(raw, dict):
        raise ValueError("the queue file is not a JSON object")
    if raw.get("version") != QUEUE_VERSION:
        raise ValueError(f"the queue file has version {raw.get('version')!r}, not {QUEUE_VERSION}")
    order = raw.get("order")
    if not (isinstance(order, list) and all(_is_job_id(j) for j in order)):
        raise ValueError("the queue file's order is not a list of job ids")
    if len(set(order)) != len(order):
        raise ValueError("the queue file names a job twice")
    slots = raw.get("slots")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int)
                              or not 0 <= slots <= wire.MAX_GPU_SLOTS):
        raise ValueError(f"the queue file's slots {slots!r} is not 0-{wire.MAX_GPU_SLOTS}")
    holders = raw.get("holders")
    if not isinstance(holders, dict):
        raise ValueError("the queue file's holders is not an object")
    checked: dict[str, Slots] = {}
    for jid, held in holders.items():
        if not _is_job_id(jid):
            raise ValueError(f"the queue file's holders name {jid!r}, not a job id")
        if held is not None and not (isinstance(held, list) and all(
                isinstance(g, int) and not isinstance(g, bool) and 0 <= g < wire.MAX_GPU_SLOTS
                for g in held)):
            raise ValueError(f"the queue file's holders give {jid} slots {held!r}")
        checked[jid] = list(held) if held is not None else None
    return QueueDoc(list(order), slots, checked)


def _is_job_id(x: t.Any) -> bool:
    import re

    return isinstance(x, str) and re.fullmatch(wire.JOB_ID_PATTERN, x) is not None


def assign(request: wire.GpuRequest, total: int, holders: t.Mapping[str, Slots]
           ) -> tuple[bool, Slots]:
    """Whether a job asking ``request`` fits now, and the slots it gets.

    ``None`` (the whole container) fits only when nothing holds anything; a count gets the
    lowest free slots; a list fits when none of its slots is held. A holder of the whole
    container blocks everyone.
    """
    if any(h is None for h in holders.values()):
        return False, None
    held = {g for h in holders.values() for g in (h or ())}
    if request is None:
        return (not holders), None
    if isinstance(request, int):
        free = [g for g in range(total) if g not in held]
        return (True, free[:request]) if len(free) >= request else (False, None)
    if held & set(request) or any(g >= total for g in request):
        return False, None
    return True, sorted(request)


def conflicts(a: Slots, b: Slots) -> bool:
    """Two jobs cannot run side by side: either takes the whole container, or they share a slot."""
    return a is None or b is None or bool(set(a) & set(b))


class Plan(t.NamedTuple):
    start: list[tuple[str, Slots]]  # job id, the slots it gets
    cancel: list[tuple[str, str]]  # job id, end_reason


def plan(order: t.Sequence[str], requests: t.Mapping[str, wire.GpuRequest],
         afters: t.Mapping[str, str | None], states: t.Mapping[str, str], total: int,
         holders: t.Mapping[str, Slots], builds: t.Mapping[str, str | None] | None = None,
         current: str | None = None) -> Plan:
    """What :func:`advance` does now: the queued jobs to start (in order) and to cancel.

    ``states``: the state of every job a queued job depends on (a missing one is gone).
    A job whose dependency ended FAILED, CANCELLED or LOST, or was cancelled by this very
    plan, is cancelled with ``dependency <id> <STATE>``; a job whose dependency succeeded
    (or that has none) starts when its GPUs are free, unless a job ahead of it waits for
    GPUs (first in, first out).

    ``builds``: the torch build a job needs (its playbook's ``torch:``), ``current`` the
    container's. A job that needs another build than the current one starts only when no
    job holds anything (it switches ``current``, and every live job runs on the current
    build); until then it waits, as for GPUs, and holds back the jobs behind it.
    """
    held = dict(holders)
    cur = current
    start: list[tuple[str, Slots]] = []
    cancel: list[tuple[str, str]] = []
    ended: dict[str, str] = {}
    waiting_for_gpus = False
    for jid in order:
        dep = afters.get(jid)
        if dep is not None:
            st = ended.get(dep) or states.get(dep)
            if st is None:
                cancel.append((jid, wire.dependency_reason(dep, "is gone")))
                ended[jid] = JobState.CANCELLED.value
                continue
            if st in FAILED_STATES:
                cancel.append((jid, wire.dependency_reason(dep, st)))
                ended[jid] = JobState.CANCELLED.value
                continue
            if st != JobState.SUCCEEDED.value:
                continue
        if waiting_for_gpus:
            continue
        need = (builds or {}).get(jid)
        if need is not None and need != cur and held:
            waiting_for_gpus = True  # waits for the torch build: the live jobs run on cur
            continue
        fits, slots = assign(requests.get(jid), total, held)
        if not fits:
            waiting_for_gpus = True
            continue
        start.append((jid, slots))
        held[jid] = slots
        if need is not None:
            cur = need
    return Plan(start, cancel)


def check_after(job_id: str, after: str | None, states: t.Mapping[str, str]) -> None:
    """Refuse a dependency that cannot be met: the job itself, an unknown job, one that
    already failed. ``states``: every job the container knows (and the batch being added).

    Raises:
        ValueError: naming the dependency and why.
    """
    if after is None:
        return
    if after == job_id:
        raise ValueError(f"job {job_id} cannot wait for itself")
    st = states.get(after)
    if st is None:
        raise ValueError(f"--after {after}: no such job in this container (`opsctl jobs` lists them)")
    if st in FAILED_STATES:
        raise ValueError(f"--after {after}: that job already ended {st}; it will never succeed")


def moved(order: t.Sequence[str], job_id: str, anchor: str, before: bool,
          afters: t.Mapping[str, str | None]) -> list[str]:
    """``order`` with ``job_id`` moved just before (or after) ``anchor``.

    Raises:
        ValueError: either job is not queued, they are the same, or the move would put a job
            ahead of a queued job it depends on (a dependency loop in the order).
    """
    if job_id == anchor:
        raise ValueError(f"job {job_id} cannot move relative to itself")
    for j in (job_id, anchor):
        if j not in order:
            raise ValueError(f"job {j} is not queued (`opsctl queue` lists the queue)")
    rest = [j for j in order if j != job_id]
    i = rest.index(anchor) + (0 if before else 1)
    new = [*rest[:i], job_id, *rest[i:]]
    pos = {j: k for k, j in enumerate(new)}
    for j in new:
        dep = afters.get(j)
        if dep in pos and pos[dep] > pos[j]:
            raise ValueError(f"job {j} waits for {dep}, which would then come after it in the "
                             "queue (a dependency loop); move them in the other order")
    return new


# --- the file -------------------------------------------------------------------------------


def queue_path(root: str) -> str:
    return os.path.join(root, "jobs", QUEUE_FILE)


@contextlib.contextmanager
def locked(root: str, blocking: bool = True) -> t.Iterator[None]:
    """The queue's lock: every read-modify-write of ``queue.json`` and every start of a job
    (by ``launch`` or :func:`advance`) holds it, so two never pick the same GPU.

    Raises:
        BlockingIOError: ``blocking`` is False and another process holds it.
    """
    import fcntl

    os.makedirs(os.path.join(root, "jobs"), exist_ok=True)
    with open(os.path.join(root, "jobs", QUEUE_LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read(root: str) -> QueueDoc:
    """The queue (hold :func:`locked`); a damaged file is set aside and rebuilt from the job
    dirs (every job in state QUEUED, oldest first; every live job as a holder)."""
    path = queue_path(root)
    try:
        raw = read_json(path, None)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        return _rebuild(root, f"unreadable: {exc}")
    if raw is None:
        return EMPTY if not _queued_dirs(root) else _rebuild(root, "missing")
    try:
        return parse_doc(raw)
    except ValueError as exc:
        return _rebuild(root, str(exc))


def write(root: str, doc: QueueDoc) -> None:
    write_json_atomic(queue_path(root), doc.to_json())


def _queued_dirs(root: str) -> list[tuple[float, str, dict[str, t.Any]]]:
    from remote_payload.agent import jobstore

    out = []
    for jid in jobstore.list_job_ids(root):
        try:
            st = read_json(os.path.join(jobstore.job_dir(root, jid), jobstore.STATUS), {}) or {}
        except (ValueError, OSError):
            continue
        if isinstance(st, dict) and st.get("state") == JobState.QUEUED.value:
            out.append((float(st.get("created_at") or 0.0), jid, st))
    return sorted(out)


def _rebuild(root: str, why: str) -> QueueDoc:
    from remote_payload.agent import jobstore

    path = queue_path(root)
    if os.path.exists(path):
        with contextlib.suppress(OSError):
            os.replace(path, f"{path}.damaged-{int(time.time())}")
    order = [jid for _, jid, _ in _queued_dirs(root)]
    holders: dict[str, Slots] = {}
    for jid in jobstore.list_job_ids(root):
        if jid in order:
            continue
        try:
            rec = jobstore.load(root, jid)
        except (AgentFailure, ValueError, OSError):
            continue
        if not rec.state.is_terminal():
            holders[jid] = _spec_slots(rec.spec)
    doc = QueueDoc(order, None, holders)
    with contextlib.suppress(OSError):
        write(root, doc)
        with open(os.path.join(root, "jobs", "queue-rebuilt.log"), "a", encoding="utf-8") as f:
            f.write(f"{time.time():.0f} rebuilt the queue from the job dirs: {why}\n")
    return doc


def _spec_slots(spec: t.Mapping[str, t.Any]) -> Slots:
    slots = spec.get("gpu_slots")
    return list(slots) if isinstance(slots, list) else None


# --- advance --------------------------------------------------------------------------------

Starter = t.Callable[[str, Slots], None]  # (job id, slots): start a queued job, raise on failure
#: an advance does at most this many rounds (each start or cancel can unblock the next)
MAX_ROUNDS = wire.MAX_QUEUE_JOBS + 1


def live_holders(root: str, doc: QueueDoc) -> dict[str, Slots]:
    """``doc.holders`` without the jobs that ended, plus a live current job that is not in it
    (launched by an agent from before the queue: it holds the whole container)."""
    from remote_payload.agent import jobstore

    holders: dict[str, Slots] = {}
    for jid, slots in doc.holders.items():
        try:
            rec = jobstore.load(root, jid)
        except (AgentFailure, ValueError, OSError):
            continue
        if not rec.state.is_terminal() and rec.state != JobState.QUEUED:
            holders[jid] = slots
    current = jobstore.current_job_id(root)
    if current and current not in holders and current not in doc.order:
        try:
            cur = jobstore.load(root, current)
        except (AgentFailure, ValueError, OSError):
            cur = None
        if cur is not None and not cur.state.is_terminal() and cur.state != JobState.QUEUED:
            holders[current] = _spec_slots(cur.spec)
    return holders


def job_request(root: str, job_id: str) -> tuple[wire.GpuRequest, str | None]:
    """A queued job's GPU request and dependency, from its spec (validated when it was queued)."""
    from remote_payload.agent import jobstore

    spec = read_json(os.path.join(jobstore.job_dir(root, job_id), jobstore.SPEC), {}) or {}
    request = spec.get("gpus")
    after = spec.get("after")
    return (request if isinstance(request, int | list) and not isinstance(request, bool) else None,
            after if isinstance(after, str) else None)


def job_build(root: str, job_id: str) -> str | None:
    """The torch build a queued job needs (``torch_build`` in its spec, checked when queued)."""
    from remote_payload.agent import jobstore

    spec = read_json(os.path.join(jobstore.job_dir(root, job_id), jobstore.SPEC), {}) or {}
    build = spec.get("torch_build")
    return build if isinstance(build, str) and wire_build_ok(build) else None


def wire_build_ok(build: t.Any) -> bool:
    """A torch build name (``torch-<version>-<variant>``): one path component, never ``..``."""
    import re

    return isinstance(build, str) and re.fullmatch(r"torch-[0-9A-Za-z_+-][0-9A-Za-z._+-]{0,99}",
                                                   build) is not None and ".." not in build


def current_build(root: str) -> str | None:
    """The container's current torch build (None: none, or no torch module shipped)."""
    try:
        from remote_payload.agent.torchenv import layout
    except ModuleNotFoundError:
        return None
    return layout.current_build(layout.Layout(root))


def dep_states(root: str, afters: t.Mapping[str, str | None]) -> dict[str, str]:
    from remote_payload.agent import jobstore

    states: dict[str, str] = {}
    for dep in {d for d in afters.values() if d is not None}:
        try:
            if os.path.isdir(jobstore.job_dir(root, dep)):
                states[dep] = jobstore.load(root, dep).state.value
        except (AgentFailure, ValueError, OSError):
            continue
    return states


def advance(root: str, start: Starter, *, slots: int | None = None,
            blocking: bool = True) -> dict[str, t.Any]:
    """Start what can start and cancel what can never run; returns ``{"started", "cancelled"}``.

    Takes the queue lock. ``slots``: the inventory's GPU count when a client sent it (kept in
    the file for the calls that come with no client). A job whose start fails (a busy GPU,
    a broken payload) ends FAILED with the reason, and its dependants are cancelled.
    ``blocking=False``: return at once (``"busy": True``) when another process holds the lock.
    """
    try:
        with locked(root, blocking):
            return _advance_locked(root, start, slots)
    except BlockingIOError:
        return {"started": [], "cancelled": [], "busy": True}


def _advance_locked(root: str, start: Starter, slots: int | None) -> dict[str, t.Any]:
    started: list[str] = []
    cancelled: list[str] = []
    doc = read(root)
    if slots is not None:
        doc = doc._replace(slots=slots)
    if not doc.order:
        holders = live_holders(root, doc)
        if holders != doc.holders or slots is not None:
            write(root, doc._replace(holders=holders))
        return {"started": started, "cancelled": cancelled}
    for _ in range(MAX_ROUNDS):
        holders = live_holders(root, doc)
        reqs = {j: job_request(root, j) for j in doc.order}
        afters = {j: r[1] for j, r in reqs.items()}
        p = plan(doc.order, {j: r[0] for j, r in reqs.items()}, afters,
                 dep_states(root, afters), doc.slots or 0, holders,
                 {j: job_build(root, j) for j in doc.order}, current_build(root))
        doc = doc._replace(holders=holders)
        if not p.start and not p.cancel:
            break
        for jid, reason in p.cancel:
            end_queued(root, jid, JobState.CANCELLED, reason)
            doc = doc._replace(order=[j for j in doc.order if j != jid])
            cancelled.append(jid)
        for jid, got in p.start:
            doc = doc._replace(order=[j for j in doc.order if j != jid],
                               holders={**doc.holders, jid: got})
            write(root, doc)  # the slots are taken before the job starts
            try:
                start(jid, got)
                started.append(jid)
            except AgentFailure as exc:
                end_queued(root, jid, JobState.FAILED, f"could not start: {exc.message}")
                doc = doc._replace(holders={k: v for k, v in doc.holders.items() if k != jid})
    write(root, doc)
    return {"started": started, "cancelled": cancelled}


def end_queued(root: str, job_id: str, state: JobState, reason: str) -> None:
    """A queued job that never ran ends: ``state`` (CANCELLED or FAILED) with ``end_reason``."""
    from remote_payload.agent import jobsecrets, jobstore

    path = jobstore.job_dir(root, job_id)
    now = time.time()
    status = read_json(os.path.join(path, jobstore.STATUS), {}) or {}
    if status.get("state") != JobState.QUEUED.value:
        return
    status.update(state=state.value, ended_at=now, end_reason=reason, healthy=False,
                  evidence=[*(status.get("evidence") or []), f"never started: {reason}"])
    status["transitions"] = [*(status.get("transitions") or []), [state.value, now, reason]]
    write_json_atomic(os.path.join(path, jobstore.STATUS), status)
    jobsecrets.remove(path)


def remove(root: str, job_id: str) -> None:
    """``queue rm``: the queued job never runs (CANCELLED, ``end_reason: "removed"``).

    Raises:
        AgentFailure: ``QueueRefused`` when the job is not queued (a running job: ``stop``).
    """
    from remote_payload.agent import jobstore

    with locked(root):
        doc = read(root)
        if job_id not in doc.order:
            rec = jobstore.load(root, job_id)
            hint = ("; use `opsctl stop` for a running job" if not rec.state.is_terminal()
                    else "")
            raise AgentFailure(ErrorType.QueueRefused, f"job {job_id} is {rec.state.value}, not "
                               f"queued{hint}", job_id=job_id, state=rec.state.value,
                               why="not queued")
        end_queued(root, job_id, JobState.CANCELLED, wire.END_REASON_REMOVED)
        write(root, doc._replace(order=[j for j in doc.order if j != job_id]))
