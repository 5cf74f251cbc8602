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

from remote_payload import limits, wire
from remote_payload.wire import JobStateName

__all__ = ["JobStateName"]  # defined with the JobState enum it names (remote_payload/wire.py)

Severity = t.Literal["error", "warning", "info"]


# --- value constraints -------------------------------------------------------------------
#
# A reply comes from a container, which runs third-party code: its values are untrusted input.
# A shape says what each value may be, not only its type, with the small markers below
# (``t.Annotated[str, Matches(wire.JOB_ID_PATTERN), MaxLen(128)]``). They are classes of ours,
# since this module is stdlib only; pydantic (the CLI's validator, ``opsctl/remote/shapes.py``)
# reads each through its ``__get_pydantic_core_schema__`` hook, so the JSON Schemas of
# ``opsctl schema`` show them too (``pattern``, ``maxLength``, ``maxItems``, ``minimum``,
# ``maximum``).
#
# What a reply shape leaves without a bound of its own gets the default bound of its type
# (applied by ``opsctl/remote/shapes.py`` to every shape of this module, and checked over
# every reply shape by ``tests/unit/test_wire_shapes_bounds.py``): a string at most
# :data:`TEXT_MAX` characters, a list or an object at most :data:`ITEMS_MAX` entries, an
# integer within 64 bits; a number is finite (never NaN or Infinity).


class _Marker:
    """One constraint on a value: sets ``key`` in the pydantic core schema of its type."""

    key: t.ClassVar[str]

    def __init__(self, value: t.Any):
        self.value = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"

    def __get_pydantic_core_schema__(self, source: t.Any, handler: t.Callable[[t.Any], t.Any]) -> t.Any:
        schema = handler(source)
        if schema.get("type") not in _SCHEMA_TYPES[self.key]:
            raise TypeError(f"{self!r} does not apply to {source!r}")
        schema[self.key] = self.value
        return schema


class AtLeast(_Marker):
    """A number's lower bound (``t.Annotated[int, AtLeast(0)]``); :func:`event_problem`
    checks it on the trainer's events too."""

    key = "ge"

    @property
    def low(self) -> float:
        return t.cast(float, self.value)


class AtMost(_Marker):
    """A number's upper bound."""

    key = "le"


class Matches(_Marker):
    """The pattern a string matches, whole (anchor it ``^...$``; no lookaround: pydantic's
    regex engine has none)."""

    key = "pattern"


class MaxLen(_Marker):
    """The most characters a string may have."""

    key = "max_length"


class MaxItems(_Marker):
    """The most entries a list (or an object) may have."""

    key = "max_length"


_SCHEMA_TYPES: dict[str, frozenset[str]] = {
    "ge": frozenset({"int", "float"}), "le": frozenset({"int", "float"}),
    "pattern": frozenset({"str"}), "max_length": frozenset({"str", "list", "dict"}),
}

#: the characters of a reply string without a bound of its own
TEXT_MAX = 1 << 16
#: the entries of a reply list or object without a bound of its own (``--lines``' maximum)
ITEMS_MAX = 1_000_000
#: an integer of a reply without a bound of its own: within a signed 64-bit integer
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: seconds (a time since the epoch, a duration) within about 3,000 years either way: a value
#: past it is damage, never a time to print (``1e308`` would print 300 digits)
SECONDS_MAX = 1e11

#: a job id (:data:`~remote_payload.wire.JOB_ID_PATTERN`): one file name under ``jobs/``,
#: no ``/``, no leading dot (so never ``.`` or ``..``) or dash
JobId = t.Annotated[str, Matches(wire.JOB_ID_PATTERN), MaxLen(128)]
#: a torch build's name (``envs/<name>``)
BuildName = t.Annotated[str, Matches(wire.BUILD_NAME_PATTERN), MaxLen(wire.BUILD_NAME_MAX)]
#: a compile cache's directory name (``cache/<fingerprint>``)
Fingerprint = t.Annotated[str, Matches(wire.FINGERPRINT_PATTERN), MaxLen(wire.FINGERPRINT_MAX)]
#: a short label: a job's name, a phase, a signal, a kind, a state of a sub-part
Name = t.Annotated[str, MaxLen(1024)]
#: another program's output carried as it is (a log line, a stack dump, base64 bytes): up to
#: the size of a whole reply
Output = t.Annotated[str, MaxLen(limits.REPLY_BYTES)]
#: a time since the epoch or a duration, in seconds
Seconds = t.Annotated[float, AtLeast(-SECONDS_MAX), AtMost(SECONDS_MAX)]
#: a byte count, a size
Bytes = t.Annotated[int, AtLeast(0), AtMost(INT_MAX)]
#: a count that is never negative (steps, attempts, crashes)
Tally = t.Annotated[int, AtLeast(0), AtMost(INT_MAX)]
#: a share of a whole (goodput: productive / wall)
Ratio = t.Annotated[float, AtLeast(0), AtMost(1)]
#: a duration or a rate that is never negative, and never past :data:`SECONDS_MAX`
Span = t.Annotated[float, AtLeast(0), AtMost(SECONDS_MAX)]


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

    socket: Name | None
    session: Name | None
    error: str | None


class RestartRecordDoc(t.TypedDict, total=False):
    """One decision of the playbook's restart policy."""

    attempt: int | None
    at: Seconds | None
    reason: str
    decision: str
    why: str | None


class HistoryMarkDoc(t.TypedDict):
    t: Seconds
    kind: str  # compile | restart | error | hang | end | diagnosis
    label: str


#: the rows of one history table (``remote_payload/agent/history.py``'s ``CAP``; a test
#: holds the two equal)
HISTORY_ROWS_MAX = 512
#: a step the history's step table holds (``history.STEP_MAX``)
HistoryStep = t.Annotated[int, AtLeast(0), AtMost(2**53)]
#: one history column: a mean per row, None where the row had no sample
HistoryColumn = t.Annotated[list[float | None], MaxItems(HISTORY_ROWS_MAX)]


class _HistoryPointRequired(t.TypedDict):
    t: Seconds
    v: float


class HistoryPointDoc(_HistoryPointRequired, total=False):
    """The newest sample of one field as it came (no mean, no rounding): where a curve ends;
    ``step`` for a step event's field."""

    step: HistoryStep


class HistoryLastDoc(t.TypedDict, total=False):
    """The newest sample of each field the history holds."""

    loss: HistoryPointDoc
    tok_s: HistoryPointDoc
    mfu: HistoryPointDoc
    mem_gib: HistoryPointDoc
    feature_wait_pct: HistoryPointDoc
    gpu_util: HistoryPointDoc
    gpu_mem_gib: HistoryPointDoc


class _HistoryStepsRequired(t.TypedDict):
    width: t.Annotated[int, AtLeast(1), AtMost(INT_MAX)]  # steps per row: 1 while each event is one
    step: t.Annotated[list[HistoryStep], MaxItems(HISTORY_ROWS_MAX)]  # each row's first step
    t: t.Annotated[list[Seconds], MaxItems(HISTORY_ROWS_MAX)]  # each row's mean time


class HistoryStepsDoc(_HistoryStepsRequired, total=False):
    """The step events by step: columns aligned with ``step``, in step order."""

    loss: HistoryColumn
    tok_s: HistoryColumn
    mfu: HistoryColumn
    mem_gib: HistoryColumn
    feature_wait_pct: HistoryColumn


class HistoryDoc(t.TypedDict, total=False):
    """Bounded plot data (``remote_payload/agent/history.py``): columns aligned with ``t``,
    only the columns that have values; None where a row had no sample. ``steps`` holds the
    step events by step, ``last`` each field's newest sample."""

    format: int
    bucket_s: Seconds
    t: t.Annotated[list[Seconds], MaxItems(HISTORY_ROWS_MAX)]
    loss: HistoryColumn
    tok_s: HistoryColumn
    mfu: HistoryColumn
    mem_gib: HistoryColumn
    feature_wait_pct: HistoryColumn
    gpu_util: HistoryColumn
    gpu_mem_gib: HistoryColumn
    marks: list[HistoryMarkDoc]
    last: HistoryLastDoc
    steps: HistoryStepsDoc


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

    at: Seconds
    quiet_since: Seconds
    idle_s: Seconds
    threshold_s: Seconds
    threshold_why: str
    phase: Name | None
    summary: Output
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

    id: JobId
    node: t.Annotated[int, AtLeast(0), AtMost(wire.MAX_RUN_NODES)]
    nodes: t.Annotated[int, AtLeast(1), AtMost(wire.MAX_RUN_NODES)]


class BabysittingDoc(t.TypedDict):
    """The restart policy's fields, in ``status`` and in every ``jobs`` row (and the job's
    multi-node run, from its spec)."""

    attempt: int
    max_restarts: int | None
    restarts: list[RestartRecordDoc]
    end_reason: Name | None
    max_duration_s: Seconds | None
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
    job_id: JobId
    name: Name
    state: JobStateName
    healthy: bool
    phase: Name | None
    created_at: Seconds
    started_at: Seconds | None
    ended_at: Seconds | None
    elapsed_s: Seconds
    pid: int | None
    pgid: int | None
    alive: bool
    exit_code: int | None
    signal: Name | None
    pane_tail: list[Output]
    output_tail: list[Output]
    output_log: str
    output_size: Bytes
    last_output_at: Seconds | None
    last_step: dict[str, t.Any] | None
    events_tail: list[dict[str, t.Any]]
    gpus: list[GpuRowDoc]
    gpu_error: str | None
    gpus_at: Seconds
    diagnosis: list[DiagnosisDoc]
    evidence: list[str]
    tmux: TmuxDoc
    healthy_when: dict[str, t.Any] | None
    timeout_s: Seconds | None
    expect_tok_s: float | None
    hang_after_s: Seconds | None
    phase_budgets_s: dict[Name, Seconds]
    budget_s: Seconds | None
    hang_threshold_s: Seconds | None
    hang: HangDoc | None
    errors: list[dict[str, t.Any]]
    preflight: PreflightDoc | None
    transitions: list[list[t.Any]]
    now: Seconds


class StatusDoc(_StatusRequired, total=False):
    """``status`` (and ``launch``): one job, reconciled against ``/proc``; ``history`` only
    for a live status (not in the ``jobs`` list's internal use)."""

    history: HistoryDoc | None
    gpu_slots: list[int] | None  # the GPU slots the job holds (None: the whole container)
    after: JobId | None  # a queued job's dependency
    gpu_holders: list[QueueHolderDoc]  # which live job holds which GPU slots (the queue's record)
    goodput: GoodputSummaryDoc | None  # its run's ledger in brief (live status only)


class JobHeadlineDoc(t.TypedDict):
    """The first (most severe) diagnosis finding of a job, for its ``jobs`` row."""

    cause: str
    severity: Severity
    summary: str


class _JobRowRequired(t.TypedDict):
    job_id: JobId


class JobRowDoc(_JobRowRequired, total=False):
    """One row of ``jobs``; a terminal job's is cached in ``jobs/<id>/summary.json``."""

    name: Name | None
    state: JobStateName | None  # None: the job dir could not be read (``error`` says why)
    error: str | None
    current: bool
    created_at: Seconds | None
    started_at: Seconds | None
    ended_at: Seconds | None
    elapsed_s: Seconds | None
    exit_code: int | None
    signal: Name | None
    last_step: dict[str, t.Any] | None
    headline: JobHeadlineDoc | None
    attempt: int
    max_restarts: int | None
    restarts: list[RestartRecordDoc]
    end_reason: Name | None
    max_duration_s: Seconds | None
    run: RunDoc | None
    gpu_slots: list[int] | None
    after: JobId | None
    goodput: Ratio | None  # productive / wall of this job's own attempts


class DamagedRecordDoc(t.TypedDict):
    """A job dir's record that does not parse (``agent/jobrecord.py``): set aside, left on
    disk untouched, and never in the way of the other jobs."""

    path: str  # the file (``jobs/<id>/status.json`` or ``spec.json``)
    reason: str  # why it does not parse, one line


class JobListDoc(t.TypedDict):
    """``jobs``: newest first; ``damaged``: the job dirs whose records do not parse."""

    current: JobId | None
    jobs: t.Annotated[list[JobRowDoc], MaxItems(wire.JOB_ROWS_MAX)]  # the newest, at most
    total: Bytes  # every job the container has
    limit: t.Annotated[int, AtLeast(0), AtMost(wire.JOB_ROWS_MAX)]  # as asked (0: all)
    damaged: t.Annotated[list[DamagedRecordDoc], MaxItems(wire.JOB_ROWS_MAX)]


class QueueRowDoc(t.TypedDict):
    """One queued job (``remote_payload/agent/verbs/queue.py``), first to start first."""

    job_id: JobId
    name: Name | None
    position: int  # 1 = next
    after: JobId | None  # the job it waits for (to succeed)
    gpus: int | list[int] | None  # what it asks for: a count, slots, or None (the whole container)
    created_at: Seconds | None
    waiting_for: str  # "job <id> (<STATE>)", "GPUs" or "its turn"


class QueueHolderDoc(t.TypedDict):
    """A live job and the GPU slots it holds (None: the whole container)."""

    job_id: JobId
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

    added: list[JobId]
    started: list[JobId]
    cancelled: list[JobId]
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

    started: list[JobId]
    cancelled: list[JobId]


class _StopRequired(t.TypedDict):
    job_id: JobId
    state: JobStateName
    signals_sent: list[Name]
    remaining_pids: list[int]


class StopDoc(_StopRequired, total=False):
    """``stop``: the signals sent and the pids that survived SIGKILL."""

    already_terminal: bool
    waited_s: Seconds
    exit_code: int | None
    signal: Name | None


class LogsChunkDoc(t.TypedDict):
    """``logs``: raw bytes of ``output.log`` from ``offset`` (base64)."""

    job_id: JobId
    offset: Bytes
    next_offset: Bytes
    data_b64: Output
    eof: bool
    size: Bytes
    state: JobStateName
    terminal: bool
    exit_code: int | None
    signal: Name | None
    since_indexed: bool | None


class TorchBuildDoc(t.TypedDict):
    """One installed torch build (``envs/<name>``), from the marker written at install time."""

    name: BuildName
    version: str | None
    variant: str | None
    pin: str | None
    path: str
    python: str
    size_bytes: Bytes | None
    installed_at: Seconds | None
    index_url: str | None
    wheelhouse: str | None  # the directory of streamed wheels it was installed from
    current: bool


class EnvsDoc(t.TypedDict):
    """``envs``: the container's torch builds, the current one, the last swaps."""

    root: str
    current: BuildName | None
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

    job_id: JobId
    state: JobStateName  # always CANCELLED
    end_reason: Name
    cancelled: list[JobId]
    queue: QueueDoc


class StackProcessDoc(t.TypedDict):
    """One process's dump (``remote_payload/agent/stacks.py``), with its place in the job."""

    pid: int | None  # None: a dump found in output.log that no file claimed
    rank: int | None
    role: str | None
    gpu: str | None
    cmd: Output
    dump: Output
    threads: int
    where: str  # the main thread's innermost frame, "file.py:123 func"
    collective: str | None  # the torch.distributed call it waits in, if any
    caller: str | None  # the job's own frame that made that call
    label: str


class StacksDoc(t.TypedDict):
    """``stacks``: every thread's Python stack of every process of the job."""

    job_id: JobId
    pids: list[int]  # the processes asked to dump
    unarmed_pids: list[int]  # python processes without the sitehook's handler
    processes: list[StackProcessDoc]
    summary: Output
    threads: int
    dump: Output
    saved_to: str | None


class HistoryReplyDoc(t.TypedDict):
    """``history``: a job's full bounded plot data (``opsctl plot``)."""

    job_id: JobId
    name: Name | None
    state: JobStateName
    phase: Name | None
    created_at: Seconds | None
    started_at: Seconds | None
    ended_at: Seconds | None
    now: Seconds
    source: t.Literal["history.json", "events.jsonl"]
    diagnosis: list[DiagnosisDoc]
    history: HistoryDoc


class CacheRowDoc(t.TypedDict):
    """One compile cache (``cache/<fingerprint>/``) of ``cache-info``."""

    fingerprint: Fingerprint
    path: str
    size_bytes: Bytes
    files: Bytes
    created_at: Seconds | None
    created_by: str | None
    build: str | None
    last_used_at: Seconds | None
    current: bool
    status: t.Literal["current", "stale"]
    mega_cache: str | None  # the mega-cache artifact, when there is one
    seed: dict[str, t.Any] | None  # what cache-seed recorded


class OutsideCacheDoc(t.TypedDict):
    """A compile cache outside opsctl's (torch's defaults): a risk across builds."""

    path: str
    size_bytes: Bytes
    files: Bytes
    why: str


class CacheInfoDoc(t.TypedDict):
    """``cache-info``: the compile caches, the current build's, and the ones outside."""

    root: str
    current_fingerprint: Fingerprint | None
    current_build: BuildName | None
    caches: list[CacheRowDoc]
    outside: list[OutsideCacheDoc]
    warnings: list[str]


class RemovedCacheDoc(t.TypedDict):
    fingerprint: Fingerprint
    path: str
    size_bytes: Bytes
    files: Bytes


class CacheClearDoc(t.TypedDict):
    """``cache-clear``: what was removed and the bytes it freed."""

    removed: list[RemovedCacheDoc]
    freed_bytes: Bytes


class SeedRunDoc(t.TypedDict):
    """One warm-up run of ``cache-seed`` (cold or seeded)."""

    wall_seconds: Seconds
    compile_seconds: Seconds | None
    compile_seconds_source: t.Literal["events", "wall"]
    counters: dict[str, float]  # the compile events' *hit*/*miss* counters
    hits: float
    events: int


class CacheSeedDoc(t.TypedDict):
    """``cache-seed``: the artifact installed and the proof that the seeded run reused it."""

    build: BuildName
    fingerprint: Fingerprint
    artifact: str
    artifact_bytes: Bytes
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
    build: BuildName
    previous: BuildName | None
    dry_run: bool
    path: str
    log_path: str | None
    verification: VerificationDoc | None
    install_seconds: Seconds | None
    switch_seconds: Seconds | None
    current: BuildName | None
    seconds: Seconds


class SwapDoc(_SwapRequired, total=False):
    """``swap``: what the swap did (or, with ``--dry-run``, would do and what it checked)."""

    python: str  # the new current build's python (after a switch)
    fingerprint: Fingerprint  # the new build's compile cache fingerprint (after an install)
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
    raw_output: Output | None
    started_at: Seconds
    wall_s: Seconds
    error: Output
    detail: Output
    deadline_hit: bool
    probe_rc: int | None
    probe_output: Output
    rc: int | None
    signal: str | None
    stderr_tail: list[Output]
    stdout_tail: list[Output]
    argv: list[str]


class AbortDoc(t.TypedDict):
    """``abort`` (an interrupted deploy): whether job ``job_id`` was launched, and the job it
    would replace (``old_cancel_requested``: this deploy's launch already sent it the stop)."""

    job_id: JobId
    launched: bool
    state: JobStateName | None
    old_job: JobId | None
    old_state: JobStateName | None
    old_cancel_requested: bool


class DoctorDoc(t.TypedDict):
    """``doctor``: the container-side rows of ``opsctl doctor`` and the facts they read."""

    rows: list[DoctorRowDoc]
    facts: dict[Name, t.Any]  # driver, libraries, device nodes, nvidia-smi's GPUs, its error


class EnvDoc(t.TypedDict):
    """``env``: what the container offers (python, tmux, GPUs, payload, disk) in one answer."""

    python: str
    python_version: Name
    hostname: Name
    root: str
    gpus: list[GpuRowDoc]
    gpu_error: str | None
    tmux: Name | None  # ``tmux -V``'s line
    tmux_socket: Name
    libtmux: Name | None
    payload_digest: Name | None
    current_job: JobId | None
    disk_free_bytes: Bytes | None


class NetInterfaceDoc(t.TypedDict):
    """One interface with an IPv4 address, in the kernel's order."""

    name: Name
    address: t.Annotated[str, Matches(wire.IPV4_PATTERN), MaxLen(15)]
    up: bool
    loopback: bool


class NetDoc(t.TypedDict):
    """``net``: what a multi-node run needs from a container before torchrun starts."""

    netns: Name | None  # the network namespace (``net:[4026531840]``); None: not readable
    hostname: Name
    interfaces: list[NetInterfaceDoc]
    address: t.Annotated[str, Matches(wire.IPV4_PATTERN), MaxLen(15)] | None  # the one to announce
    free_port: t.Annotated[int, AtLeast(1), AtMost(65535)]


#: The shape of every verb's reply (the ``data`` of an ``ok`` reply), by verb: the agent client
#: validates each reply against it before a caller sees it (``opsctl/remote/agent_client.py``),
#: and ``tests/unit/test_wire_shapes_bounds.py`` fails when a verb the agent answers has none.
REPLY_SHAPES: dict[str, type] = {
    "abort": AbortDoc, "doctor": DoctorDoc, "env": EnvDoc, "net": NetDoc,
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
    """A checkpoint committed (durable, ``latest`` naming it), sent once it is."""

    path: str
    seconds: Amount  # the final checkpoint: its write time (written while the run winds down)
    mode: str  # background | sync | final (--ckpt-write; the last one is always synchronous)
    blocked_s: Amount  # how long the training thread waited for this checkpoint
    write_s: Amount  # staging done to committed (background: on the writer thread)
    deferred_from: Count  # the step it was due at (the writer was still busy then)
    removed: list[str]  # checkpoints --keep-last removed after it
    kept: list[str]  # "<name>: <why>" of those --keep-last would remove but may not


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
    is switched off; metrics the trackers fell behind on are dropped and counted; a periodic
    checkpoint due while the previous one is still being written is deferred)."""

    event: t.Literal["warning"]
    source: str  # what failed: "tracker", or "checkpoint" (one due while one is being written)
    tracker: str  # tensorboard | wandb | mlflow | all
    message: str
    dropped: int
    step: Count  # source checkpoint: the step at which a checkpoint was due and deferred
    writing: Count | None  # source checkpoint: the step being written (None: buffers pinning)
    removed: list[str]  # source checkpoint: other runs' checkpoints --replace-checkpoints removed


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


# --- the goodput ledger (``goodput`` verb; ``remote_payload/agent/goodput.py``) --------------
#
# Every figure is derived from the run's job dirs on each call. ``causes`` always holds every
# cause of ``remote_payload.agent.goodput.CAUSES``, and they sum to ``wall_s``.

GoodputCause = t.Literal["productive", "startup", "compile", "checkpoint", "stall", "lost",
                         "shutdown", "restart_gap", "queue_wait", "unknown"]


class GoodputStartupPhaseDoc(t.TypedDict):
    """One phase of an attempt's start-up, as its ``startup`` event splits it."""

    phase: Name  # pg_ready | target_built | drafter_built | resumed | first_step
    seconds: Span  # since the phase before it ended (the first: since the process start)


class GoodputAttemptDoc(t.TypedDict):
    """One attempt of one job of the run; its ``causes`` cover the time from the previous
    attempt's end (the first: the run's start) to its own end."""

    job_id: JobId
    attempt: Tally
    start: Seconds | None  # the process start (None: not recorded)
    end: Seconds | None  # None: still running
    ended: Name  # running | restarted: <reason> | done: <reason> | failed | cancelled | lost
    crashed: bool  # ended without a ``done`` event
    start_step: Tally  # the step it resumed at (0: from the start)
    resumed: bool
    last_step: Tally
    surviving_steps: Tally  # of its steps, those no later resume undid
    lost_steps: Tally
    startup: list[GoodputStartupPhaseDoc]
    causes: dict[GoodputCause, Span]


class GoodputLedgerDoc(t.TypedDict):
    """A run's wall time by cause, and the rates derived from it."""

    started_at: Seconds
    ended_at: Seconds | None  # None: the run is live
    now: Seconds
    wall_s: Span
    goodput: Ratio | None  # productive / wall (None: no wall time yet)
    causes: dict[GoodputCause, Span]
    expect_tok_s: Span | None
    slow_s: Span  # productive time below expect_tok_s (apart from the causes)
    slow_shortfall_s: Span  # what that time would have been at the expected rate
    surviving_steps: Tally
    last_step: Tally
    target_steps: Tally | None
    surviving_tokens: Tally
    effective_tok_s: Span | None  # surviving tokens / wall
    eta_s: Span | None  # the steps left at the effective rate
    crashes: Tally  # attempts that ended without a ``done`` event, hangs apart
    hangs: Tally  # attempts the hang watch ended (the restart policy's ``hang``)
    restarts: Tally
    redeploys: Tally
    attempts: t.Annotated[list[GoodputAttemptDoc], MaxItems(1024)]  # the newest, in order
    timeline: t.Annotated[list[list[t.Any]], MaxItems(2048)]  # [cause, start, end], in order
    unknown: t.Annotated[list[Name], MaxItems(64)]  # why some time is unknown, or a figure
    # is incomplete
    damaged_lines: Tally


class GoodputDoc(GoodputLedgerDoc):
    """``goodput``: the ledger of one run (every attempt and re-deploy that continues one
    training run: one out-dir, resumed with ``--resume``, even across job ids)."""

    run_id: JobId  # the run's first job id
    trainer_run_id: JobId | None  # the command's --run-id
    out_dir: str | None
    jobs: t.Annotated[list[JobId], MaxItems(10_000)]  # oldest first
    state: Name  # the newest job's state


class GoodputSummaryDoc(t.TypedDict):
    """The few figures of the ledger a ``status`` reply carries (its job's run)."""

    run_id: JobId
    wall_s: Span | None
    goodput: Ratio | None
    causes: dict[GoodputCause, Span] | None
    crashes: Tally | None
    hangs: Tally | None
    restarts: Tally | None
    redeploys: Tally | None
    effective_tok_s: Span | None
    eta_s: Span | None


REPLY_SHAPES["goodput"] = GoodputDoc


# --- container-side helper documents (one JSON document on a helper's stdout) ---------------
#
# What a small program opsctl runs in the container prints (the transfer probe, ``tarsync``'s
# verbs, the payload's manifest). The container is untrusted, so each is read as a reply is:
# ``opsctl.remote.shapes.parse_doc`` (bounded bytes, bounded nesting, these shapes with the
# reply bounds), never ``json.loads`` and indexing.

#: a path in the container (Linux's PATH_MAX)
ContainerPath = t.Annotated[str, MaxLen(4096)]
#: a name relative to a copied tree's root: at most ``limits.TREE_DEPTH`` components of 255
RelName = t.Annotated[str, MaxLen(limits.TREE_DEPTH * 256)]
#: entries of a tree's listing (``opsctl.remote.receiver.LISTING_ENTRIES``)
LISTING_MAX = 1_000_000


class TransferProbeDoc(t.TypedDict):
    """``opsctl.remote.transfer.PROBE``: rsync's path in the container, the kind of PATH, PATH
    with links resolved, and the homes ``--delete`` never touches."""

    rsync: ContainerPath | None
    kind: t.Literal["dir", "file", "other", "missing"]
    real: ContainerPath
    homes: t.Annotated[list[ContainerPath], MaxItems(64)]


#: one row of a listing: [rel, kind, size, mtime, mode, link]; ``receiver.check_listing``
#: checks each field's meaning
ListingRow = t.Annotated[list[RelName | int | None], MaxItems(6)]


class _TarListingRequired(t.TypedDict):
    root: t.Literal["file", "dir", "link", "other", "missing"]
    entries: t.Annotated[list[ListingRow], MaxItems(LISTING_MAX)]


class TarListingDoc(_TarListingRequired, total=False):
    """``tarsync list``: every entry of a tree, each file's sha256, what was skipped."""

    sha256: t.Annotated[dict[RelName, t.Annotated[str, MaxLen(64)] | None], MaxItems(LISTING_MAX)]
    skipped: t.Annotated[list[RelName], MaxItems(LISTING_MAX)]


class TarScanDoc(t.TypedDict):
    """``tarsync scan``: the names the receiving end lacks."""

    send: t.Annotated[list[RelName], MaxItems(LISTING_MAX)]


class TarPlanDoc(TarScanDoc):
    """``tarsync plan``: what a transfer would send, and what ``--delete`` would remove."""

    delete: t.Annotated[list[RelName], MaxItems(LISTING_MAX)]


class TarReceivedDoc(t.TypedDict):
    """``tarsync receive``: what a push wrote in the container."""

    ok: bool
    files: t.Annotated[int, AtLeast(0)]
    bytes: t.Annotated[int, AtLeast(0)]
    deleted: t.Annotated[int, AtLeast(0)]
    torn: t.Annotated[list[RelName], MaxItems(LISTING_MAX)]


#: ``tarsync stat``: {rel: [size, mtime_ns, ctime_ns, ino]} of every file
TarStatDoc = t.Annotated[dict[RelName, t.Annotated[list[t.Annotated[int, AtLeast(0)]],
                                                   MaxItems(4)]], MaxItems(LISTING_MAX)]


class PayloadManifestDoc(t.TypedDict):
    """``<root>/payload/MANIFEST.json``: the digest of the payload the container holds."""

    digest: t.Annotated[str, MaxLen(128)]


class _PayloadUnpackedRequired(t.TypedDict):
    ok: bool


class PayloadUnpackedDoc(_PayloadUnpackedRequired, total=False):
    """``payload.UNPACK_SCRIPT``'s last line: the digest it put in place, or why not."""

    digest: t.Annotated[str, MaxLen(128)]
    files: t.Annotated[int, AtLeast(0)]
    path: ContainerPath
    kept: t.Annotated[list[ContainerPath], MaxItems(10_000)]  # older payloads kept
    error: str


#: ``wheelhouse.LIST_SCRIPT``: {wheel file name: size} of the wheels in the container
WheelListDoc = t.Annotated[dict[t.Annotated[str, MaxLen(255)], t.Annotated[int, AtLeast(0)]],
                           MaxItems(100_000)]


class _WheelsReceivedRequired(t.TypedDict):
    ok: bool


class WheelsReceivedDoc(_WheelsReceivedRequired, total=False):
    """``wheelhouse.RECEIVE_SCRIPT``'s last line: each wheel's sha256 as written, or why not."""

    files: t.Annotated[dict[t.Annotated[str, MaxLen(255)], t.Annotated[str, MaxLen(64)]],
                       MaxItems(100_000)]
    error: str


class LogdirLookDoc(t.TypedDict):
    """``tensorboard.LOOK``: the kind of a job's logdir, its real path, a link inside it."""

    kind: t.Literal["missing", "link", "dir", "other"]
    real: ContainerPath
    inner_link: ContainerPath | None


#: every helper document, by what prints it (``opsctl.remote.shapes.parse_doc`` reads them)
HELPER_SHAPES: dict[str, t.Any] = {
    "transfer probe": TransferProbeDoc, "tarsync list": TarListingDoc,
    "tarsync scan": TarScanDoc, "tarsync plan": TarPlanDoc, "tarsync receive": TarReceivedDoc,
    "tarsync stat": TarStatDoc, "payload manifest": PayloadManifestDoc,
    "payload unpack": PayloadUnpackedDoc, "wheelhouse list": WheelListDoc,
    "wheelhouse receive": WheelsReceivedDoc, "tensorboard look": LogdirLookDoc,
}
