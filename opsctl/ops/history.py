"""Fetch a job's plot data: the agent's ``history`` verb, checked against its wire shape.

The operation behind ``opsctl plot``; no click, no rich.
"""

from __future__ import annotations

from opsctl.remote.agent_client import Agent
from remote_payload.wire_shapes import HistoryReplyDoc


def fetch(agent: Agent, job_id: str | None, since_s: float | None = None,
          points: int | None = None) -> HistoryReplyDoc:
    """The job's bounded history (the current job without ``job_id``), from ``since_s`` ago.

    Raises:
        AgentError: e.g. ``NoSuchJob``; an agent without the verb answers ``UsageError``.
        ReplyShapeError: the reply is not a :class:`HistoryReplyDoc`.
    """
    args: list[str] = []
    if job_id:
        args += ["--job", job_id]
    if since_s is not None:
        args += ["--since", f"{since_s:g}"]
    if points is not None:
        args += ["--points", str(points)]
    return agent.call("history", *args, timeout=60)
