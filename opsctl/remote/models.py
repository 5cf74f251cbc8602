"""Typed views of the agent's JSON replies (docs/contracts.md); parsed once, here."""

from __future__ import annotations

import typing as t

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from remote_payload.wire import JobState


class _Wire(BaseModel):
    # The agent may grow fields before the CLI knows them: ignore, never fail.
    model_config = ConfigDict(extra="ignore", frozen=True)


class GpuRow(_Wire):
    index: int
    name: str = ""
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None


class DiagnosisItem(_Wire):
    cause: str
    severity: t.Literal["error", "warning", "info"] = "error"
    summary: str
    evidence: list[str] = Field(default_factory=list)
    hint: str = ""


class ProcessWhere(_Wire):
    """Where one process of the job waits (from its own stack dump)."""

    pid: int | None = None
    rank: int | None = None
    role: str | None = None
    gpu: str | None = None
    threads: int = 0
    where: str = ""
    collective: str | None = None
    caller: str | None = None
    label: str = ""


class HangReport(_Wire):
    """The stacks the agent took when the job went quiet past its budget (``hang.json``)."""

    at: float
    quiet_since: float
    idle_s: float
    threshold_s: float
    threshold_why: str = ""
    phase: str | None = None
    summary: str = ""
    processes: list[ProcessWhere] = Field(default_factory=list)
    saved_to: str | None = None


class GpuBusy(_Wire):
    """A GPU that was in use by something outside the job when it was launched."""

    index: int
    mem_used_mib: float | None = None
    processes: list[dict[str, t.Any]] = Field(default_factory=list)
    why: str = ""


class Preflight(_Wire):
    needed: list[int] | None = None  # None: every GPU the container has
    busy: list[GpuBusy] = Field(default_factory=list)
    forced: bool = False
    error: str | None = None


class HistoryMark(_Wire):
    t: float
    kind: str  # compile | restart | error | hang | end | diagnosis
    label: str = ""


class History(_Wire):
    """Bounded, downsampled plot data: columns aligned with ``t``; None = no sample."""

    bucket_s: float = 0.0
    t: list[float] = Field(default_factory=list)
    loss: list[float | None] = Field(default_factory=list)
    tok_s: list[float | None] = Field(default_factory=list)
    mfu: list[float | None] = Field(default_factory=list)
    mem_gib: list[float | None] = Field(default_factory=list)
    feature_wait_pct: list[float | None] = Field(default_factory=list)
    gpu_util: list[float | None] = Field(default_factory=list)
    gpu_mem_gib: list[float | None] = Field(default_factory=list)
    marks: list[HistoryMark] = Field(default_factory=list)


class RestartRecord(_Wire):
    """One decision of the playbook's restart policy (recorded by the agent)."""

    attempt: int | None = None
    at: float | None = None
    reason: str = ""
    decision: str = ""
    why: str | None = None


class TmuxRef(_Wire):
    socket: str | None = None
    session: str | None = None
    error: str | None = None


class RunMembership(_Wire):
    """A job's place in a multi-node run (``wire.RUN_FIELD``): the run id every node's job
    carries, this job's node index and the run's node count."""

    id: str
    node: int
    nodes: int


class RestartFields(_Wire):
    """The restart policy's fields of ``status``/``jobs`` (absent from older agents)."""

    attempt: int | None = None
    max_restarts: int | None = None
    restarts: list[RestartRecord] = Field(default_factory=list)
    end_reason: str | None = None
    max_duration_s: float | None = None
    run: RunMembership | None = None  # deploy --nodes: the run this job is one node of


class JobStatus(RestartFields):
    job_id: str
    gpu_slots: list[int] | None = None  # the GPU slots it holds (None: the whole container)
    after: str | None = None  # a queued job's dependency
    gpu_holders: list[QueueHolder] = Field(default_factory=list)  # which job holds which GPU
    name: str = ""
    state: JobState
    healthy: bool = False
    phase: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    elapsed_s: float | None = None
    pid: int | None = None
    pgid: int | None = None
    alive: bool = False
    exit_code: int | None = None
    signal: str | None = None
    pane_tail: list[str] = Field(default_factory=list)
    output_tail: list[str] = Field(default_factory=list)
    output_log: str | None = None
    output_size: int = 0
    last_output_at: float | None = None
    last_step: dict[str, t.Any] | None = None
    events_tail: list[dict[str, t.Any]] = Field(default_factory=list)
    gpus: list[GpuRow] = Field(default_factory=list)
    gpu_error: str | None = None
    diagnosis: list[DiagnosisItem] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    hang_threshold_s: float | None = None
    hang: HangReport | None = None
    errors: list[dict[str, t.Any]] = Field(default_factory=list)
    preflight: Preflight | None = None
    history: History | None = None
    tmux: TmuxRef | None = None

    @field_validator("history", mode="wrap")
    @classmethod
    def _history_or_none(cls, v: t.Any, handler: t.Callable[[t.Any], t.Any]) -> t.Any:
        try:
            return handler(v)
        except ValidationError:  # damaged plot data costs the sparklines, never the status
            return None

    @property
    def terminal(self) -> bool:
        return self.state.is_terminal()


class LogsChunk(_Wire):
    job_id: str
    offset: int
    next_offset: int
    data_b64: str = ""
    eof: bool = True
    state: JobState
    terminal: bool = False
    exit_code: int | None = None
    signal: str | None = None
    since_indexed: bool | None = None  # --since: False when the job has no time index


class JobHeadline(_Wire):
    cause: str | None = None
    severity: str | None = None
    summary: str = ""


class JobRow(RestartFields):
    """One line of ``opsctl jobs`` (the agent's ``jobs`` verb)."""

    job_id: str
    gpu_slots: list[int] | None = None
    after: str | None = None
    name: str | None = None
    state: JobState | None = None  # None: the job dir could not be read (``error`` says why)
    error: str | None = None
    current: bool = False
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    elapsed_s: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    last_step: dict[str, t.Any] | None = None
    headline: JobHeadline | None = None


class DamagedRecord(_Wire):
    """A job dir's record that does not parse (the agent leaves it on disk untouched)."""

    path: str
    reason: str


class JobList(_Wire):
    current: str | None = None
    jobs: list[JobRow] = Field(default_factory=list)
    total: int = 0
    limit: int = 0
    damaged: list[DamagedRecord] = Field(default_factory=list)


class QueueRow(_Wire):
    """One queued job of ``opsctl queue`` (the agent's ``queue`` verb), first to start first."""

    job_id: str
    name: str | None = None
    position: int
    after: str | None = None
    gpus: int | list[int] | None = None
    created_at: float | None = None
    waiting_for: str = ""


class QueueHolder(_Wire):
    job_id: str
    gpu_slots: list[int] | None = None
    state: JobState | None = None


class QueueList(_Wire):
    jobs: list[QueueRow] = Field(default_factory=list)
    slots: int | None = None
    holders: list[QueueHolder] = Field(default_factory=list)
    damaged: list[DamagedRecord] = Field(default_factory=list)


class BootHook(_Wire):
    kind: t.Literal["systemd", "cron", "none"]
    path: str | None = None
    warning: str | None = None


class QueueAdd(_Wire):
    added: list[str]
    started: list[str] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list)
    queue: QueueList
    boot_hook: BootHook | None = None  # None: an agent from before the hook


class StopResult(_Wire):
    job_id: str
    state: JobState
    signals_sent: list[str] = Field(default_factory=list)
    remaining_pids: list[int] = Field(default_factory=list)


class AgentReply(_Wire):
    ok: bool
    verb: str
    agent_version: int = 1
    data: t.Any = None
    error: dict[str, t.Any] | None = None


JobStatus.model_rebuild()
