"""The container's job queue: order, dependencies, GPU slots, and ``advance``.

One record of job state: the job dirs. A queued job is a job dir like any other
(``jobs/<id>/``: spec, launch facts, ``status.json`` in state QUEUED), and everything the
queue knows is derived from the job dirs when it is needed (:func:`scan`):

- the queue is every job whose status is QUEUED, in the order of the ``queue_rank`` its
  status.json carries (then ``created_at``, then the id); ``queue add`` gives a new job the
  next rank, ``queue move`` gives the moved job a rank between its new neighbours;
- the GPU slots held are those of every live job (not QUEUED, not terminal, reconciled
  against ``/proc``): its spec's ``gpu_slots``, ``None`` (the whole container) when absent;
  a job dir whose records do not parse holds them too while a process of the job lives
  (:func:`damaged_holders`).

So no second list can disagree with the job dirs: a job that started, ended or was removed
leaves the queue by the very write that changes its state (one atomic rename of its
status.json), and a finished job can never be started again because an order still names
it. This is the smallest design that makes double bookkeeping impossible: no new store, no
database; the one file beside the job dirs, ``jobs/gpu-slots.json``, holds a fact about the
container (the inventory's GPU count, kept for the calls that come with no client), never
about a job. ``jobs/.queued`` is only a hint that lets ``status`` skip the queue when nothing
was ever queued; a stale hint costs one advance, never a wrong start.

Every change (add, move, remove, each start) holds ``jobs/.queue.lock``, and a job starts
only from QUEUED, checked under that lock at the one place a queued job is started
(:func:`remote_payload.agent.launching.start_queued`). A ``jobs/queue.json`` left by an
older agent (which kept the order there) is read once under the lock: its order becomes the
ranks of the jobs it names that are still QUEUED, its slot count the container's, and the
file is renamed ``queue.json.migrated-<time>`` (kept, never read again). A job dir whose
records do not parse (:mod:`remote_payload.agent.jobrecord`) is set aside: it is listed
under ``damaged`` and never queued, and it holds GPU slots only while its processes live.

The rules are pure functions (:func:`assign`, :func:`plan`, :func:`check_after`,
:func:`moved`), one definition for every caller, tested with hypothesis. :func:`advance`
applies them: it starts every queued job whose dependency succeeded and whose GPUs are free,
fails a job whose GPU request no longer fits the container (the inventory's count dropped),
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
from remote_payload.agent import jobrecord
from remote_payload.agent.common import AgentFailure, write_json_atomic
from remote_payload.wire import ErrorType, JobState

LEGACY_QUEUE_FILE = "queue.json"  # an older agent's order; migrated once (:func:`migrate_legacy`)
SLOTS_FILE = "gpu-slots.json"  # {"slots": N}: the container's GPU count (a container fact)
QUEUED_HINT = ".queued"  # exists while jobs may be queued (status skips the queue otherwise)
QUEUE_LOCK = ".queue.lock"
STAGING = ".staging"  # in jobs/: job dirs of a batch being written (no job id starts with ".")
STAGED_WHOLE = ".whole"  # in a batch's staging dir: every job dir of the batch is written
SLOTS_FILE_BYTES = 4096  # {"slots": N} is a dozen bytes
RANK = "queue_rank"  # in a queued job's status.json: its place in the queue
LEGACY_VERSION = 1
#: the failure states that cancel a job's dependants
FAILED_STATES = frozenset({JobState.FAILED.value, JobState.CANCELLED.value, JobState.LOST.value})
#: ``dep_states``' word for a dependency whose record does not parse: its dependants wait
DAMAGED = "DAMAGED"

Slots = t.Optional[list[int]]  # noqa: UP045 (the 3.10 agent evaluates it at run time)


# --- the rules (pure) -----------------------------------------------------------------------


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
    fail: list[tuple[str, str]]  # job id, end_reason: its GPU request cannot fit here


def plan(order: t.Sequence[str], requests: t.Mapping[str, wire.GpuRequest],
         afters: t.Mapping[str, str | None], states: t.Mapping[str, str], total: int,
         holders: t.Mapping[str, Slots], builds: t.Mapping[str, str | None] | None = None,
         current: str | None = None) -> Plan:
    """What :func:`advance` does now: the queued jobs to start (in order), fail and cancel.

    ``states``: the state of every job a queued job depends on (a missing one is gone).
    A job whose GPU request cannot fit ``total`` slots
    (:func:`remote_payload.wire.gpu_request_unfit`) fails with that reason. A job whose
    dependency ended FAILED, CANCELLED or LOST, or was failed or cancelled by this very plan,
    is cancelled with ``dependency <id> <STATE>``; a job whose dependency succeeded (or that
    has none) starts when its GPUs are free, unless a job ahead of it waits for GPUs (first
    in, first out).

    ``builds``: the torch build a job needs (its playbook's ``torch:``), ``current`` the
    container's. A job that needs another build than the current one starts only when no
    job holds anything (it switches ``current``, and every live job runs on the current
    build); until then it waits, as for GPUs, and holds back the jobs behind it.
    """
    held = dict(holders)
    cur = current
    start: list[tuple[str, Slots]] = []
    cancel: list[tuple[str, str]] = []
    fail: list[tuple[str, str]] = []
    ended: dict[str, str] = {}
    waiting_for_gpus = False
    for jid in order:
        unfit = wire.gpu_request_unfit(requests.get(jid), total)
        if unfit is not None:
            fail.append((jid, unfit))
            ended[jid] = JobState.FAILED.value
            continue
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
    return Plan(start, cancel, fail)


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


# --- the legacy file --------------------------------------------------------------------------


class LegacyQueue(t.NamedTuple):
    """An older agent's ``jobs/queue.json``: only what :func:`migrate_legacy` takes from it."""

    order: list[str]
    slots: int | None


def parse_legacy(raw: t.Any) -> LegacyQueue:
    """``queue.json`` as an older agent wrote it (read back from disk: never trusted).

    Raises:
        ValueError: not that shape.
    """
    if not isinstance(raw, dict):
        raise ValueError("the queue file is not a JSON object")
    if raw.get("version") != LEGACY_VERSION:
        raise ValueError(f"the queue file has version {raw.get('version')!r}, not {LEGACY_VERSION}")
    order = raw.get("order")
    if not (isinstance(order, list) and all(_is_job_id(j) for j in order)):
        raise ValueError("the queue file's order is not a list of job ids")
    slots = raw.get("slots")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int)
                              or not 0 <= slots <= wire.MAX_GPU_SLOTS):
        raise ValueError(f"the queue file's slots {slots!r} is not 0-{wire.MAX_GPU_SLOTS}")
    return LegacyQueue(list(dict.fromkeys(order)), slots)


def migrate_legacy(root: str) -> str | None:
    """Read an older agent's ``jobs/queue.json`` once (hold :func:`locked`): its order becomes
    the ranks of the jobs it names that are still QUEUED (a job that started or ended is never
    started again because of it), its slot count the container's unless one is known; then it
    is renamed ``queue.json.migrated-<time>`` (``.damaged-<time>`` when it does not parse),
    kept for a human and never read again. Returns the new name (None: no legacy file)."""
    path = os.path.join(jobs_dir(root), LEGACY_QUEUE_FILE)
    try:
        legacy: LegacyQueue | None = parse_legacy(jobrecord.decode(jobrecord.read_bounded(path)))
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        legacy = None
    if legacy is not None:
        from remote_payload.agent import jobstore

        for rank, jid in enumerate(legacy.order, 1):
            try:
                status = jobrecord.read_status(jobstore.job_dir(root, jid))
            except (jobrecord.DamagedRecord, AgentFailure):
                continue
            if status is not None and status["state"] == JobState.QUEUED.value \
                    and status.get(RANK) is None:
                status[RANK] = float(rank)
                write_json_atomic(os.path.join(jobstore.job_dir(root, jid), "status.json"),
                                  status)
        if legacy.slots and read_slots(root) is None:
            write_slots(root, legacy.slots)
    kept = f"{path}.{'migrated' if legacy is not None else 'damaged'}-{int(time.time())}"
    os.replace(path, kept)
    return kept


# --- the container's facts and the lock -------------------------------------------------------


def jobs_dir(root: str) -> str:
    return os.path.join(root, "jobs")


def read_slots(root: str) -> int | None:
    """The container's GPU count as the last client sent it (None: never sent, or damaged)."""
    try:
        raw = jobrecord.decode(jobrecord.read_bounded(os.path.join(jobs_dir(root), SLOTS_FILE),
                                                      SLOTS_FILE_BYTES))
    except (ValueError, OSError):  # none, damaged, a link, a device, a FIFO: not known
        return None
    slots = raw.get("slots") if isinstance(raw, dict) else None
    if isinstance(slots, bool) or not isinstance(slots, int) or not 0 < slots <= wire.MAX_GPU_SLOTS:
        return None
    return slots


def write_slots(root: str, slots: int) -> None:
    """Keep the container's GPU count (hold :func:`locked`); unchanged: no write."""
    if read_slots(root) != slots:
        write_json_atomic(os.path.join(jobs_dir(root), SLOTS_FILE), {"slots": slots})


def settle_staging(root: str) -> None:
    """Finish or clear what a killed ``queue add`` left under ``jobs/.staging/`` (hold
    :func:`locked`; an add stages only while it holds the lock, so nothing found there is
    being written). A batch marked whole (:data:`STAGED_WHOLE`: every job dir written, its
    ids checked free) was being moved into place: the rest of it is moved too, so a pipeline
    is queued whole or not at all; an unmarked one (it may hold secrets) is removed. A link
    or a file at ``.staging`` is not opsctl's: never followed, never removed."""
    import shutil

    from remote_payload.agent import jobstore

    staging = os.path.join(jobs_dir(root), STAGING)
    if os.path.islink(staging) or not os.path.isdir(staging):
        return
    for batch in sorted(os.listdir(staging)):
        where = os.path.join(staging, batch)
        if os.path.islink(where) or not os.path.isfile(os.path.join(where, STAGED_WHOLE)):
            continue
        for name in sorted(n for n in os.listdir(where) if _is_job_id(n)):
            src, final = os.path.join(where, name), jobstore.job_dir(root, name)
            if os.path.isdir(src) and not os.path.islink(src) and not os.path.lexists(final):
                set_hint(root)
                with contextlib.suppress(OSError):
                    os.rename(src, final)
    shutil.rmtree(staging, ignore_errors=True)


def set_hint(root: str) -> None:
    """Say that jobs may be queued (a directory made there by hand says so too)."""
    with contextlib.suppress(IsADirectoryError):
        open(os.path.join(jobs_dir(root), QUEUED_HINT), "a").close()


def clear_hint(root: str) -> None:
    """Nothing is queued: ``status`` may skip the queue (only opsctl's hint file is removed;
    a directory made there by hand stays, and costs each ``status`` one scan)."""
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(os.path.join(jobs_dir(root), QUEUED_HINT))


def may_have_queued(root: str) -> bool:
    """Whether an advance could have anything to do (two stats; ``status`` asks every poll)."""
    d = jobs_dir(root)
    return os.path.exists(os.path.join(d, QUEUED_HINT)) or os.path.exists(
        os.path.join(d, LEGACY_QUEUE_FILE))


@contextlib.contextmanager
def locked(root: str, blocking: bool = True) -> t.Iterator[None]:
    """The queue's lock: every change of the queue (add, move, remove) and every start of a job
    (by ``launch`` or :func:`advance`) holds it, so two never pick the same GPU and a job is
    started once. An older agent's ``queue.json`` is migrated as the lock is taken.

    Raises:
        BlockingIOError: ``blocking`` is False and another process holds it.
    """
    import fcntl

    os.makedirs(jobs_dir(root), exist_ok=True)
    with open(os.path.join(jobs_dir(root), QUEUE_LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        try:
            migrate_legacy(root)
            settle_staging(root)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- the queue, derived from the job dirs ----------------------------------------------------


class Snapshot(t.NamedTuple):
    """What the job dirs say about the queue at one moment (:func:`scan`)."""

    order: list[str]  # the QUEUED jobs, first to start first
    holders: dict[str, Slots]  # live job id -> the slots it holds (None: all of them)
    damaged: list[dict[str, str]]  # {"path", "reason"} per record that does not parse
    ranks: dict[str, float | None]  # a queued job's queue_rank (None: an older agent's job)


def scan(root: str, *, reconcile: bool = True) -> Snapshot:
    """The queue and the GPU holders, from every job dir's records.

    ``reconcile``: check each live-looking job against ``/proc`` (:func:`jobstore.load`, which
    may record LOST); False (``status``'s cheap ``gpu_holders``) believes status.json.
    """
    from remote_payload.agent import jobstore

    queued: list[tuple[float, float, str]] = []
    ranks: dict[str, float | None] = {}
    holders: dict[str, Slots] = {}
    unreadable: list[str] = []  # job dirs whose records do not parse: live ones still hold
    damaged = [{"path": p, "reason": jobstore.LINKED_JOB_DIR}
               for p in jobstore.linked_job_dirs(root)]
    for jid in sorted(jobstore.list_job_ids(root)):
        path = jobstore.job_dir(root, jid)
        try:
            status = jobrecord.read_status(path)
            if status is None:  # a launch is writing the dir: it holds the lock, skip it
                continue
            state = JobState(status["state"])
            if state == JobState.QUEUED:
                jobrecord.read_queued_spec(path)  # a damaged or partial spec never starts
                rank = status.get(RANK)
                ranks[jid] = float(rank) if rank is not None else None
                queued.append((float("inf") if rank is None else float(rank),
                               float(status.get("created_at") or 0.0), jid))
                continue
            if state.is_terminal():
                continue
            if reconcile:
                rec = jobstore.load(root, jid)
                if rec.state.is_terminal():
                    continue
                spec = rec.spec
            else:
                spec = jobrecord.read_spec(path)
        except jobrecord.DamagedRecord as exc:
            damaged.append(exc.to_doc())
            unreadable.append(jid)
            continue
        slots = spec.get("gpu_slots")
        holders[jid] = list(slots) if isinstance(slots, list) else None
    holders.update(damaged_holders(root, unreadable))
    queued.sort()
    return Snapshot([jid for _, _, jid in queued], holders, damaged, ranks)


def damaged_holders(root: str, job_ids: t.Sequence[str]) -> dict[str, Slots]:
    """The job dirs whose records do not parse but whose processes still live
    (:func:`remote_payload.agent.jobstore.damaged_job_processes`): each holds the slots its
    spec names, or the whole container when the spec does not parse either, until its last
    process is gone. A damaged record never frees a GPU that a live process uses."""
    from remote_payload.agent import jobstore

    if not job_ids:
        return {}
    held: dict[str, Slots] = {}
    for jid, pids in jobstore.damaged_job_processes(root, job_ids).items():
        if not pids:
            continue
        try:
            slots = jobrecord.read_spec(jobstore.job_dir(root, jid)).get("gpu_slots")
        except jobrecord.DamagedRecord:
            slots = None
        held[jid] = list(slots) if isinstance(slots, list) else None
    return held


def next_rank(snap: Snapshot) -> float:
    """The rank of a job added at the end of the queue."""
    known = [r for r in snap.ranks.values() if r is not None]
    return max(known, default=0.0) + 1.0


def set_rank(root: str, job_id: str, rank: float) -> None:
    """Give a queued job its place (hold :func:`locked`); one atomic write of its status.json."""
    from remote_payload.agent import jobstore

    path = jobstore.job_dir(root, job_id)
    status = jobrecord.read_status(path)
    if status is None or status["state"] != JobState.QUEUED.value:
        return
    status[RANK] = rank
    write_json_atomic(os.path.join(path, jobstore.STATUS), status)


def reorder(root: str, snap: Snapshot, order: t.Sequence[str], job_id: str) -> None:
    """Make the queue ``order`` after ``job_id`` moved (hold :func:`locked`): the moved job gets
    a rank between its new neighbours (one write); where there is no room between them (or a
    neighbour has no rank) every queued job is renumbered in the new order."""
    ranks = snap.ranks
    i = list(order).index(job_id)
    prev = ranks.get(order[i - 1]) if i > 0 else None
    nxt = ranks.get(order[i + 1]) if i + 1 < len(order) else None
    lo = prev if i > 0 else (nxt - 1.0 if nxt is not None else None)
    hi = nxt if i + 1 < len(order) else (prev + 1.0 if prev is not None else None)
    if lo is not None and hi is not None and lo < (lo + hi) / 2 < hi:
        set_rank(root, job_id, (lo + hi) / 2)
        return
    for k, jid in enumerate(order, 1):
        if ranks.get(jid) != float(k):
            set_rank(root, jid, float(k))


# --- advance --------------------------------------------------------------------------------

Starter = t.Callable[[str, Slots], None]  # (job id, slots): start a queued job, raise on failure
#: an advance does at most this many rounds (each start or cancel can unblock the next)
MAX_ROUNDS = wire.MAX_QUEUE_JOBS + 1


def live_holders(root: str) -> dict[str, Slots]:
    """Every live job and the GPU slots it holds, reconciled (a job launched by an agent from
    before the queue has no ``gpu_slots``: it holds the whole container)."""
    return scan(root).holders


def job_request(root: str, job_id: str) -> tuple[wire.GpuRequest, str | None]:
    """A queued job's GPU request and dependency, from its spec (checked by :func:`scan`)."""
    from remote_payload.agent import jobstore

    try:
        spec = jobrecord.read_spec(jobstore.job_dir(root, job_id))
    except jobrecord.DamagedRecord:
        spec = {}
    return spec.get("gpus"), spec.get("after")


def job_build(root: str, job_id: str) -> str | None:
    """The torch build a queued job needs (``torch_build`` in its spec, checked when queued)."""
    from remote_payload.agent import jobstore

    try:
        spec = jobrecord.read_spec(jobstore.job_dir(root, job_id))
    except jobrecord.DamagedRecord:
        return None
    build = spec.get("torch_build")
    return build if isinstance(build, str) and wire_build_ok(build) else None


def wire_build_ok(build: t.Any) -> bool:
    """A torch build name (``torch-<version>-<variant>``): one path component, never ``..``."""
    import re

    return isinstance(build, str) and len(build) <= wire.BUILD_NAME_MAX \
        and re.fullmatch(wire.BUILD_NAME_PATTERN, build) is not None


def current_build(root: str) -> str | None:
    """The container's current torch build (None: none, or no torch module shipped)."""
    try:
        from remote_payload.agent.torchenv import layout
    except ModuleNotFoundError:
        return None
    return layout.current_build(layout.Layout(root))


def dep_states(root: str, afters: t.Mapping[str, str | None]) -> dict[str, str]:
    """The state of every job a queued job waits for (absent: gone; :data:`DAMAGED`: its
    record does not parse, and its dependants wait rather than be cancelled)."""
    from remote_payload.agent import jobstore

    states: dict[str, str] = {}
    for dep in {d for d in afters.values() if d is not None}:
        try:
            if os.path.isdir(jobstore.job_dir(root, dep)):
                states[dep] = jobstore.load(root, dep).state.value
        except jobrecord.DamagedRecord:
            states[dep] = DAMAGED
        except (AgentFailure, ValueError, OSError):
            continue
    return states


def advance(root: str, start: Starter, *, slots: int | None = None,
            blocking: bool = True) -> dict[str, t.Any]:
    """Start what can start, fail what can never fit, cancel what can never run; returns
    ``{"started", "cancelled", "failed"}``.

    Takes the queue lock. ``slots``: the inventory's GPU count when a client sent it (kept in
    ``jobs/gpu-slots.json`` for the calls that come with no client). A job whose start fails (a
    busy GPU, a broken payload) ends FAILED with the reason, and its dependants are cancelled.
    ``blocking=False``: return at once (``"busy": True``) when another process holds the lock.
    """
    try:
        with locked(root, blocking):
            return _advance_locked(root, start, slots)
    except BlockingIOError:
        return {"started": [], "cancelled": [], "failed": [], "busy": True}


def _advance_locked(root: str, start: Starter, slots: int | None) -> dict[str, t.Any]:
    started: list[str] = []
    cancelled: list[str] = []
    failed: list[str] = []
    if slots:
        write_slots(root, slots)
    total = read_slots(root) or 0
    for _ in range(MAX_ROUNDS):
        snap = scan(root)
        if not snap.order:
            clear_hint(root)
            break
        reqs = {j: job_request(root, j) for j in snap.order}
        afters = {j: r[1] for j, r in reqs.items()}
        p = plan(snap.order, {j: r[0] for j, r in reqs.items()}, afters,
                 dep_states(root, afters), total, snap.holders,
                 {j: job_build(root, j) for j in snap.order}, current_build(root))
        if not p.start and not p.cancel and not p.fail:
            break
        for jid, reason in p.fail:
            if end_queued(root, jid, JobState.FAILED, reason):
                failed.append(jid)
        for jid, reason in p.cancel:
            if end_queued(root, jid, JobState.CANCELLED, reason):
                cancelled.append(jid)
        for jid, got in p.start:
            try:
                start(jid, got)
                started.append(jid)
            except AgentFailure as exc:
                end_queued(root, jid, JobState.FAILED, f"could not start: {exc.message}")
    return {"started": started, "cancelled": cancelled, "failed": failed}


def end_queued(root: str, job_id: str, state: JobState, reason: str) -> bool:
    """A queued job that never ran ends: ``state`` (CANCELLED or FAILED) with ``end_reason``;
    False (nothing written) when it is not QUEUED or its status does not parse."""
    from remote_payload.agent import jobsecrets, jobstore

    path = jobstore.job_dir(root, job_id)
    now = time.time()
    try:
        status = jobrecord.read_status(path)
    except jobrecord.DamagedRecord:
        return False
    if status is None or status["state"] != JobState.QUEUED.value \
            or not wire.can_transition(JobState.QUEUED, state):
        return False
    status.update(state=state.value, ended_at=now, end_reason=reason, healthy=False,
                  evidence=[*(status.get("evidence") or []), f"never started: {reason}"])
    status["transitions"] = [*(status.get("transitions") or []), [state.value, now, reason]]
    status.pop(RANK, None)
    write_json_atomic(os.path.join(path, jobstore.STATUS), status)
    jobsecrets.remove(path)
    return True


def remove(root: str, job_id: str) -> None:
    """``queue rm``: the queued job never runs (CANCELLED, ``end_reason: "removed"``).

    Raises:
        AgentFailure: ``QueueRefused`` when the job is not queued (a running job: ``stop``).
    """
    from remote_payload.agent import jobstore

    with locked(root):
        rec = jobstore.load(root, job_id)
        if rec.state != JobState.QUEUED:
            hint = ("; use `opsctl stop` for a running job" if not rec.state.is_terminal()
                    else "")
            raise AgentFailure(ErrorType.QueueRefused, f"job {job_id} is {rec.state.value}, not "
                               f"queued{hint}", job_id=job_id, state=rec.state.value,
                               why="not queued")
        end_queued(root, job_id, JobState.CANCELLED, wire.END_REASON_REMOVED)
