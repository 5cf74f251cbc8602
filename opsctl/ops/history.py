"""Fetch a job's plot data: the agent's ``history`` verb, parsed once.

The operation behind ``opsctl plot``; no click, no rich.
"""

from __future__ import annotations

from pydantic import Field

from opsctl.remote.agent_client import Agent
from opsctl.remote.models import DiagnosisItem, History, _Wire
from remote_payload.wire import JobState


class HistoryReport(_Wire):
    """The ``history`` verb's reply (docs/contracts.md)."""

    job_id: str
    name: str | None = None
    state: JobState
    phase: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    now: float | None = None
    source: str = ""  # history.json, or events.jsonl for a job whose wrapper predates it
    diagnosis: list[DiagnosisItem] = Field(default_factory=list)
    history: History


def fetch(agent: Agent, job_id: str | None, since_s: float | None = None,
          points: int | None = None) -> HistoryReport:
    """The job's bounded history (the current job without ``job_id``), from ``since_s`` ago.

    Raises:
        AgentError: e.g. ``NoSuchJob``; an agent without the verb answers ``UsageError``.
    """
    args: list[str] = []
    if job_id:
        args += ["--job", job_id]
    if since_s is not None:
        args += ["--since", f"{since_s:g}"]
    if points is not None:
        args += ["--points", str(points)]
    return HistoryReport.model_validate(agent.call("history", *args, timeout=60))
