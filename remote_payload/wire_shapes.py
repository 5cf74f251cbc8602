"""The shapes that cross the wire, defined once: the agent's replies and the trainer's events.

Part of the contract in :mod:`remote_payload.wire`, kept in a module of its own because
defining these classes costs ~10 ms and the agent starts on every ``status`` poll: the agent
imports this module only for type checking (``if t.TYPE_CHECKING``), so mypy checks that its
builders produce exactly these keys and types, at no cost at run time.

Used directly, never written again by hand:

- the CLI validates every reply against its shape (``opsctl/remote/shapes.py``: a pydantic
  ``TypeAdapter`` over the shape) and reads it as that TypedDict (mypy checks every key);
- ``opsctl schema`` (the JSON Schema of every ``--json`` document) and ``opsctl schema event``
  build on the same shapes and on :data:`EVENT_SHAPES`;
- the docs' contract page lists them (``docs/hooks/generated.py``).

Stdlib only, and valid on Python 3.10 (the container's python): optional keys are declared
in a ``total=False`` subclass rather than with ``NotRequired`` (3.11).
"""

from __future__ import annotations

import typing as t

JobStateName = t.Literal["QUEUED", "PENDING", "SETTING_UP", "COMPILING", "RUNNING", "SUCCEEDED", "FAILED",
                         "CANCELLED", "LOST"]
Severity = t.Literal["error", "warning", "info"]


# --- pieces of the status document ----------------------------------------------------


class GpuRowDoc(t.TypedDict):
    """One GPU as ``nvidia-smi`` reports it (``remote_payload/agent/gpus.py``)."""

    index: int
    name: str
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    temp_c: float | None
    power_w: float | None


class DiagnosisDoc(t.TypedDict):
    """One finding of ``remote_payload/agent/diagnosis.py`` (``cause`` is a diagnosis id)."""

    cause: str
    severity: Severity
    summary: str
    evidence: list[str]
    hint: str


class TmuxDoc(t.TypedDict):
    """The tmux session the job runs in (what ``opsctl attach`` attaches to)."""

    socket: str | None
    session: str | None
    error: str | None


class RestartRecordDoc(t.TypedDict, total=False):
    """One decision of the playbook's restart policy."""

    attempt: int | None
    at: float | None
    reason: str
    decision: str
    why: str | None


class HistoryMarkDoc(t.TypedDict):
    t: float
    kind: str  # compile | restart | error | hang | end | diagnosis
    label: str


class HistoryDoc(t.TypedDict, total=False):
    """Bounded plot data (``remote_payload/agent/history.py``): columns aligned with ``t``,
    only the columns that have values; None where a row had no sample."""

    format: int
    bucket_s: float
    t: list[float]
    loss: list[float | None]
    tok_s: list[float | None]
    mfu: list[float | None]
    mem_gib: list[float | None]
    feature_wait_pct: list[float | None]
    gpu_util: list[float | None]
    gpu_mem_gib: list[float | None]
    marks: list[HistoryMarkDoc]


class ProcessWhereDoc(t.TypedDict, total=False):
    """Where one process of the job waits, from its own stack dump."""

    pid: int | None
    rank: int | None
    role: str | None
    gpu: str | None
    threads: int
    where: str
    collective: str | None
    caller: str | None
    label: str


class HangDoc(t.TypedDict, total=False):
    """The stacks the wrapper took when the job went quiet past its budget (``hang.json``)."""

    at: float
    quiet_since: float
    idle_s: float
    threshold_s: float
    threshold_why: str
    phase: str | None
    summary: str
    processes: list[ProcessWhereDoc]
    saved_to: str | None


class GpuBusyDoc(t.TypedDict, total=False):
    """A GPU held by something outside the job when it was launched."""

    index: int
    mem_used_mib: float | None
    processes: list[dict[str, t.Any]]
    why: str


class PreflightDoc(t.TypedDict, total=False):
    """``preflight.json``: what the launch found on the GPUs it needs."""

    needed: list[int] | None
    busy: list[GpuBusyDoc]
    forced: bool
    error: str | None


class RunDoc(t.TypedDict):
    """A job's membership in a multi-node run (``wire.RUN_FIELD``, checked by
    ``wire.validate_run``): every node's job of one run carries the same ``id``."""

    id: str
    node: int
    nodes: int


class BabysittingDoc(t.TypedDict):
    """The restart policy's fields, in ``status`` and in every ``jobs`` row (and the job's
    multi-node run, from its spec)."""

    attempt: int
    max_restarts: int | None
    restarts: list[RestartRecordDoc]
    end_reason: str | None
    max_duration_s: float | None
    run: RunDoc | None


# --- the envelope of every reply (``wire.ok_reply`` / ``wire.error_reply``) -----------------


class _AgentErrorRequired(t.TypedDict):
    type: str  # a :class:`~remote_payload.wire.ErrorType` name (or a newer agent's)
    message: str


class AgentErrorDoc(_AgentErrorRequired, total=False):
    """An error document's ``error``, with the fields its type carries."""

    fields: dict[str, t.Any]


class _ReplyRequired(t.TypedDict):
    ok: bool
    verb: str


class AgentReplyDoc(_ReplyRequired, total=False):
    """The one JSON document every agent verb prints: ``data`` when ``ok``, else ``error``."""

    agent_version: int
    data: t.Any
    error: AgentErrorDoc


# --- agent replies (the ``data`` of ``{"ok": true, "verb", "data"}``) -----------------------


class _StatusRequired(BabysittingDoc):
    job_id: str
    name: str
    state: JobStateName
    healthy: bool
    phase: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    elapsed_s: float
    pid: int | None
    pgid: int | None
    alive: bool
    exit_code: int | None
    signal: str | None
    pane_tail: list[str]
    output_tail: list[str]
    output_log: str
    output_size: int
    last_output_at: float | None
    last_step: dict[str, t.Any] | None
    events_tail: list[dict[str, t.Any]]
    gpus: list[GpuRowDoc]
    gpu_error: str | None
    gpus_at: float
    diagnosis: list[DiagnosisDoc]
    evidence: list[str]
    tmux: TmuxDoc
    healthy_when: dict[str, t.Any] | None
    timeout_s: float | None
    expect_tok_s: float | None
    hang_after_s: float | None
    phase_budgets_s: dict[str, float]
    budget_s: float | None
    hang_threshold_s: float | None
    hang: HangDoc | None
    errors: list[dict[str, t.Any]]
    preflight: PreflightDoc | None
    transitions: list[list[t.Any]]
    now: float


class StatusDoc(_StatusRequired, total=False):
    """``status`` (and ``launch``): one job, reconciled against ``/proc``; ``history`` only
    for a live status (not in the ``jobs`` list's internal use)."""

    history: HistoryDoc | None
    gpu_slots: list[int] | None  # the GPU slots the job holds (None: the whole container)
    after: str | None  # a queued job's dependency
    gpu_holders: list[QueueHolderDoc]  # which live job holds which GPU slots (the queue's record)


class JobHeadlineDoc(t.TypedDict):
    """The first (most severe) diagnosis finding of a job, for its ``jobs`` row."""

    cause: str
    severity: Severity
    summary: str


class _JobRowRequired(t.TypedDict):
    job_id: str


class JobRowDoc(_JobRowRequired, total=False):
    """One row of ``jobs``; a terminal job's is cached in ``jobs/<id>/summary.json``."""

    name: str | None
    state: JobStateName | None  # None: the job dir could not be read (``error`` says why)
    error: str | None
    current: bool
    created_at: float | None
    started_at: float | None
    ended_at: float | None
    elapsed_s: float | None
    exit_code: int | None
    signal: str | None
    last_step: dict[str, t.Any] | None
    headline: JobHeadlineDoc | None
    attempt: int
    max_restarts: int | None
    restarts: list[RestartRecordDoc]
    end_reason: str | None
    max_duration_s: float | None
    run: RunDoc | None
    gpu_slots: list[int] | None
    after: str | None


class DamagedRecordDoc(t.TypedDict):
    """A job dir's record that does not parse (``agent/jobrecord.py``): set aside, left on
    disk untouched, and never in the way of the other jobs."""

    path: str  # the file (``jobs/<id>/status.json`` or ``spec.json``)
    reason: str  # why it does not parse, one line


class JobListDoc(t.TypedDict):
    """``jobs``: newest first; ``damaged``: the job dirs whose records do not parse."""

    current: str | None
    jobs: list[JobRowDoc]
    total: int
    limit: int
    damaged: list[DamagedRecordDoc]


class QueueRowDoc(t.TypedDict):
    """One queued job (``remote_payload/agent/verbs/queue.py``), first to start first."""

    job_id: str
    name: str | None
    position: int  # 1 = next
    after: str | None  # the job it waits for (to succeed)
    gpus: int | list[int] | None  # what it asks for: a count, slots, or None (the whole container)
    created_at: float | None
    waiting_for: str  # "job <id> (<STATE>)", "GPUs" or "its turn"


class QueueHolderDoc(t.TypedDict):
    """A live job and the GPU slots it holds (None: the whole container)."""

    job_id: str
    gpu_slots: list[int] | None
    state: JobStateName | None


class QueueDoc(t.TypedDict):
    """``queue`` (and the ``queue`` of ``queue-add``/``queue-rm``): the container's queue."""

    jobs: list[QueueRowDoc]
    slots: int | None  # the container's GPU slot count (the inventory's gpus), if known
    holders: list[QueueHolderDoc]
    damaged: list[DamagedRecordDoc]  # job dirs whose records do not parse: neither queued nor held


class QueueAddDoc(t.TypedDict):
    """``queue-add``: the jobs queued (in order), those that started at once, and the queue."""

    added: list[str]
    started: list[str]
    cancelled: list[str]
    queue: QueueDoc
    boot_hook: BootHookDoc


class BootHookDoc(t.TypedDict):
    """The queue's boot hook in the container (``agent/boothook.py``): a systemd unit, a
    crontab line, or none (``warning`` says why, and that a restart then waits for a call)."""

    kind: t.Literal["systemd", "cron", "none"]
    path: str | None  # the unit file, or which crontab
    warning: str | None


class QueueAdvanceDoc(t.TypedDict):
    """``queue-advance`` (the boot hook's verb): what it started and cancelled."""

    started: list[str]
    cancelled: list[str]


class _StopRequired(t.TypedDict):
    job_id: str
    state: JobStateName
    signals_sent: list[str]
    remaining_pids: list[int]


class StopDoc(_StopRequired, total=False):
    """``stop``: the signals sent and the pids that survived SIGKILL."""

    already_terminal: bool
    waited_s: float
    exit_code: int | None
    signal: str | None


class LogsChunkDoc(t.TypedDict):
    """``logs``: raw bytes of ``output.log`` from ``offset`` (base64)."""

    job_id: str
    offset: int
    next_offset: int
    data_b64: str
    eof: bool
    size: int
    state: JobStateName
    terminal: bool
    exit_code: int | None
    signal: str | None
    since_indexed: bool | None


class TorchBuildDoc(t.TypedDict):
    """One installed torch build (``envs/<name>``), from the marker written at install time."""

    name: str
    version: str | None
    variant: str | None
    pin: str | None
    path: str
    python: str
    size_bytes: int | None
    installed_at: float | None
    index_url: str | None
    wheelhouse: str | None  # the directory of streamed wheels it was installed from
    current: bool


class EnvsDoc(t.TypedDict):
    """``envs``: the container's torch builds, the current one, the last swaps."""

    root: str
    current: str | None
    builds: list[TorchBuildDoc]
    history: list[dict[str, t.Any]]  # envs/history.jsonl records, newest last
    in_progress_or_leftover: list[str]


class DoctorRowDoc(t.TypedDict):
    """One check of ``opsctl doctor`` (``wire.doctor_row``): host side or the agent's verb."""

    name: str
    status: t.Literal["ok", "warn", "fail", "skip"]
    reason: str
    evidence: str  # the exact line read
    fix: str  # the exact command or config line


class QueueRmDoc(t.TypedDict):
    """``queue-rm``: the removed job (never run), its dependants cancelled with it, the queue."""

    job_id: str
    state: JobStateName  # always CANCELLED
    end_reason: str
    cancelled: list[str]
    queue: QueueDoc


class StackProcessDoc(t.TypedDict):
    """One process's dump (``remote_payload/agent/stacks.py``), with its place in the job."""

    pid: int | None  # None: a dump found in output.log that no file claimed
    rank: int | None
    role: str | None
    gpu: str | None
    cmd: str
    dump: str
    threads: int
    where: str  # the main thread's innermost frame, "file.py:123 func"
    collective: str | None  # the torch.distributed call it waits in, if any
    caller: str | None  # the job's own frame that made that call
    label: str


class StacksDoc(t.TypedDict):
    """``stacks``: every thread's Python stack of every process of the job."""

    job_id: str
    pids: list[int]  # the processes asked to dump
    unarmed_pids: list[int]  # python processes without the sitehook's handler
    processes: list[StackProcessDoc]
    summary: str
    threads: int
    dump: str
    saved_to: str | None


class HistoryReplyDoc(t.TypedDict):
    """``history``: a job's full bounded plot data (``opsctl plot``)."""

    job_id: str
    name: str | None
    state: JobStateName
    phase: str | None
    created_at: float | None
    started_at: float | None
    ended_at: float | None
    now: float
    source: t.Literal["history.json", "events.jsonl"]
    diagnosis: list[DiagnosisDoc]
    history: HistoryDoc


class CacheRowDoc(t.TypedDict):
    """One compile cache (``cache/<fingerprint>/``) of ``cache-info``."""

    fingerprint: str
    path: str
    size_bytes: int
    files: int
    created_at: float | None
    created_by: str | None
    build: str | None
    last_used_at: float | None
    current: bool
    status: t.Literal["current", "stale"]
    mega_cache: str | None  # the mega-cache artifact, when there is one
    seed: dict[str, t.Any] | None  # what cache-seed recorded


class OutsideCacheDoc(t.TypedDict):
    """A compile cache outside opsctl's (torch's defaults): a risk across builds."""

    path: str
    size_bytes: int
    files: int
    why: str


class CacheInfoDoc(t.TypedDict):
    """``cache-info``: the compile caches, the current build's, and the ones outside."""

    root: str
    current_fingerprint: str | None
    current_build: str | None
    caches: list[CacheRowDoc]
    outside: list[OutsideCacheDoc]
    warnings: list[str]


class RemovedCacheDoc(t.TypedDict):
    fingerprint: str
    path: str
    size_bytes: int
    files: int


class CacheClearDoc(t.TypedDict):
    """``cache-clear``: what was removed and the bytes it freed."""

    removed: list[RemovedCacheDoc]
    freed_bytes: int


class SeedRunDoc(t.TypedDict):
    """One warm-up run of ``cache-seed`` (cold or seeded)."""

    wall_seconds: float
    compile_seconds: float | None
    compile_seconds_source: t.Literal["events", "wall"]
    counters: dict[str, float]  # the compile events' *hit*/*miss* counters
    hits: float
    events: int


class CacheSeedDoc(t.TypedDict):
    """``cache-seed``: the artifact installed and the proof that the seeded run reused it."""

    build: str
    fingerprint: str
    artifact: str
    artifact_bytes: int
    cold: SeedRunDoc
    seeded: SeedRunDoc
    speedup: float | None
    reuse_proven: bool
    log_path: str | None


class VerificationDoc(t.TypedDict):
    """The new build's checks (``inspect_torch.py --verify``) and the facts it read."""

    checks: list[dict[str, t.Any]]  # {"name", "ok", "detail", "skipped"?}
    facts: dict[str, t.Any]


class _SwapRequired(t.TypedDict):
    action: str  # noop | switch | install | install-only | present
    build: str
    previous: str | None
    dry_run: bool
    path: str
    log_path: str | None
    verification: VerificationDoc | None
    install_seconds: float | None
    switch_seconds: float | None
    current: str | None
    seconds: float


class SwapDoc(_SwapRequired, total=False):
    """``swap``: what the swap did (or, with ``--dry-run``, would do and what it checked)."""

    python: str  # the new current build's python (after a switch)
    fingerprint: str  # the new build's compile cache fingerprint (after an install)
    checked: list[str]  # --dry-run: what it could check without writing anything


class _ProbeRequired(t.TypedDict):
    probe: str  # "compile-race"
    status: t.Literal["ok", "affected", "crashed"]
    affected: bool | None  # None: the probe learned nothing (crashed)
    verdict: str
    modes: dict[str, dict[str, t.Any]]  # per mode: status, timings, errors, hang stacks
    env: dict[str, t.Any]  # torch, cuda, triton, python, device, hostname, ...


class ProbeReportDoc(_ProbeRequired, total=False):
    """``probe``: the compile-race probe's report (``remote_payload/probes/compile_race.py``);
    a probe that died is ``status: "crashed"`` with what it left (never an error document)."""

    version: int
    config: dict[str, t.Any]
    raw_output: str | None
    started_at: float
    wall_s: float
    error: str
    detail: str
    deadline_hit: bool
    probe_rc: int | None
    probe_output: str
    rc: int | None
    signal: str | None
    stderr_tail: list[str]
    stdout_tail: list[str]
    argv: list[str]


#: The replies the CLI parses or passes through, by verb.
REPLY_SHAPES: dict[str, type] = {
    "status": StatusDoc, "launch": StatusDoc, "jobs": JobListDoc, "stop": StopDoc,
    "logs": LogsChunkDoc, "envs": EnvsDoc, "queue": QueueDoc, "queue-move": QueueDoc,
    "queue-add": QueueAddDoc, "queue-advance": QueueAdvanceDoc, "queue-rm": QueueRmDoc,
    "stacks": StacksDoc, "history": HistoryReplyDoc, "cache-info": CacheInfoDoc,
    "cache-clear": CacheClearDoc, "cache-seed": CacheSeedDoc, "swap": SwapDoc,
    "probe": ProbeReportDoc,
}


# --- trainer events (one JSON object per line; ``remote_payload.wire.parse_event``) ----------
#
# Events are open: any object with a string ``event`` is one, and any event may carry more
# keys (``budget_s`` on any of them, ``_at`` once the wrapper read it). These are the ones
# opsctl's own code writes, with the keys opsctl reads. A step is an integer >= 0, and so is
# every count; durations and rates are numbers >= 0 (:class:`AtLeast`, checked by
# :func:`event_problem` and shown as ``minimum`` in ``opsctl schema event``).


class AtLeast:
    """A number's lower bound in a shape (``t.Annotated[int, AtLeast(0)]``).

    :func:`event_problem` checks it; pydantic (on the CLI side) reads it through the hook
    below, so the JSON Schema says ``minimum``. A class of ours: this module is stdlib only.
    """

    def __init__(self, low: float):
        self.low = low

    def __repr__(self) -> str:
        return f"AtLeast({self.low})"

    def __get_pydantic_core_schema__(self, source: t.Any, handler: t.Callable[[t.Any], t.Any]) -> t.Any:
        schema = handler(source)
        schema["ge"] = self.low
        return schema


#: a step, an attempt, a count: an integer, never negative
Count = t.Annotated[int, AtLeast(0)]
#: a duration, a rate, a time since the start: a number, never negative
Amount = t.Annotated[float, AtLeast(0)]


class _Event(t.TypedDict, total=False):
    budget_s: Amount  # how long the job may stay silent after this event (hang watch)
    _at: Amount  # when the wrapper read it (added in events.jsonl and status)


class PhaseEvent(_Event, total=False):
    event: t.Literal["phase"]
    phase: str  # loading | compiling | training | checkpointing | done
    detail: str
    step: Count


class _StepKeys(t.TypedDict):
    event: t.Literal["step"]
    step: Count


class StepEvent(_StepKeys, _Event, total=False):
    loss: float | None
    acc: Amount | None
    tok_s: Amount | None
    eta_s: Amount | None
    lr: float | None
    mfu: Amount | None
    mem_gib: Amount | None
    feature_wait_pct: Amount | None
    role: str


class CompileEvent(_Event, total=False):
    event: t.Literal["compile"]
    name: str
    shape: list[int]
    seconds: Amount
    recompiles: Count


class _CheckpointKeys(t.TypedDict):
    event: t.Literal["checkpoint"]
    step: Count


class CheckpointEvent(_CheckpointKeys, _Event, total=False):
    path: str
    seconds: Amount  # the final checkpoint: its write time (written while the run winds down)


class ErrorEvent(_Event, total=False):
    event: t.Literal["error"]
    type: str
    message: str
    rank: int | None
    gpu: str | None


class _DoneKeys(t.TypedDict):
    event: t.Literal["done"]
    step: Count


class DoneEvent(_DoneKeys, _Event, total=False):
    reason: str  # finished | SIGINT | SIGTERM | stop-at-step
    warmup_only: bool
    ckpt_s: Amount  # rank 0: writing the final checkpoint (durable before this event)
    shutdown_s: Amount  # from the last step to this event


class StartupEvent(_Event, total=False):
    """Once, after the first optimizer step (rank 0): when each start-up phase ended, in
    seconds since the process started (``*_at``), and what the first compiles and the
    checkpoint read took (``*_s``). Keys of phases a run does not have are left out."""

    event: t.Literal["startup"]
    pg_ready_at: float  # process groups ready (or none needed)
    target_built_at: float  # the target on the device, weights included
    drafter_built_at: float  # the drafter and its optimizer on the device
    resumed_at: float  # --resume: the checkpoint loaded (weights and optimizer state)
    first_step_at: float  # the first optimizer step finished
    target_compile_s: float  # the target graph's first call (compile or cache load)
    drafter_compile_s: float  # the drafter step's first call (compile or cache load)
    load_s: float  # --target-path: reading the checkpoint onto the device
    load_gb: float
    load_gb_per_s: float


class _ResumeKeys(t.TypedDict):
    event: t.Literal["resume"]
    step: Count


class ResumeEvent(_ResumeKeys, _Event, total=False):
    path: str
    from_run: str | None


class RestartEvent(_Event, total=False):
    """Written by the wrapper itself: attempt N starts."""

    event: t.Literal["restart"]
    attempt: Count
    reason: str


class TimeLimitEvent(_Event, total=False):
    """Written by the wrapper itself: the playbook's ``max_duration_s`` ran out."""

    event: t.Literal["time_limit"]
    max_duration_s: Amount
    attempt: Count


class AcceptanceEvent(_Event, total=False):
    """``trainer eval``: speculative decoding of the drafter against the target."""

    event: t.Literal["acceptance"]
    step: int  # the checkpoint's optimizer step
    tau: float
    tau_untrained: float | None
    per_position: list[float]


class RegenerateEvent(_Event, total=False):
    event: t.Literal["regenerate"]
    records: Count
    tokens: Count
    tok_s: Amount


class TrackersEvent(_Event, total=False):
    """Where the run's experiment trackers write (``--report-to``; rank 0, once at the start):
    a key per backend that started, a directory or a tracking URI without credentials."""

    event: t.Literal["trackers"]
    report_to: list[str]
    run: str  # the trainer's run id: TensorBoard's run directory, W&B's and MLflow's run name
    tensorboard: str  # the logdir (each run in <logdir>/<run>)
    wandb: str
    mlflow: str


class WarningEvent(_Event, total=False):
    """Something failed that the run goes on without (a tracker that cannot start or write
    is switched off; metrics the trackers fell behind on are dropped and counted)."""

    event: t.Literal["warning"]
    source: str  # what failed: "tracker"
    tracker: str  # tensorboard | wandb | mlflow | all
    message: str
    dropped: int


#: Every event opsctl's own code writes, by its ``event`` value.
EVENT_SHAPES: dict[str, type] = {
    "phase": PhaseEvent, "step": StepEvent, "compile": CompileEvent, "checkpoint": CheckpointEvent,
    "error": ErrorEvent, "done": DoneEvent, "resume": ResumeEvent, "restart": RestartEvent,
    "time_limit": TimeLimitEvent, "acceptance": AcceptanceEvent, "regenerate": RegenerateEvent,
    "startup": StartupEvent, "trackers": TrackersEvent, "warning": WarningEvent,
}


def _value_problem(value: t.Any, tp: t.Any) -> str | None:
    """Why ``value`` is not of type ``tp`` (numbers, bounds, strings, lists, unions), or None;
    types it does not know pass."""
    origin, args = t.get_origin(tp), t.get_args(tp)
    if origin is t.Annotated:
        problem = _value_problem(value, args[0])
        if problem is None:
            low = next((m.low for m in args[1:] if isinstance(m, AtLeast)), None)
            if low is not None and not value >= low:  # NaN is below every bound
                return f"{value!r} is below {low}"
        return problem
    if origin is t.Union or type(tp).__name__ == "UnionType":
        problems = [_value_problem(value, a) for a in args]
        return None if None in problems else " and ".join(p for p in problems if p)
    if tp is type(None):
        return None if value is None else f"{value!r} is not null"
    if tp is int:
        return None if isinstance(value, int) and not isinstance(value, bool) \
            else f"{value!r} is not an integer"
    if tp is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) \
            else f"{value!r} is not a number"
    if tp is str:
        return None if isinstance(value, str) else f"{value!r} is not a string"
    if tp is bool:
        return None if isinstance(value, bool) else f"{value!r} is not true or false"
    if origin is list:
        return None if isinstance(value, list) else f"{value!r} is not a list"
    return None


def event_problem(doc: t.Mapping[str, t.Any]) -> str | None:
    """Why an event opsctl's code writes breaks its shape (a missing or negative step…),
    or None; an event of another name passes (events are open)."""
    name = doc.get("event")
    shape = EVENT_SHAPES.get(name) if isinstance(name, str) else None
    if shape is None:
        return None
    missing = sorted(k for k in shape.__required_keys__ if k not in doc)  # type: ignore[attr-defined]
    if missing:
        return f"{doc['event']} event without {', '.join(missing)}"
    for key, tp in t.get_type_hints(shape, include_extras=True).items():
        if key in doc:
            problem = _value_problem(doc[key], tp)
            if problem is not None:
                return f"{doc['event']} event: {key} {problem}"
    return None
