"""Poll a job until it is healthy, finished, or out of time — never a blind sleep.

Connection errors back off and reconnect; a job that crashes is reported within
one poll interval plus one round trip.
"""

from __future__ import annotations

import time
import typing as t
from dataclasses import dataclass

from opsctl.errors import TransportError
from opsctl.remote.agent_client import Agent, check_reply
from remote_payload.wire import JobState
from remote_payload.wire_shapes import StatusDoc

DEFAULT_POLL_S = 2.0
#: Give up after this long without a single successful poll.
MAX_OUTAGE_S = 90.0

Until = t.Literal["healthy", "terminal"]
OnUpdate = t.Callable[[StatusDoc | None, float, str | None], None]


@dataclass(frozen=True)
class WatchOutcome:
    status: StatusDoc
    reason: t.Literal["healthy", "terminal", "timeout"]
    elapsed_s: float
    polls: int


#: The remote deadline of one ``status`` call.
STATUS_TIMEOUT_S = 30.0


def status_args(job_id: str | None, lines: int) -> list[str]:
    """The agent ``status`` verb's arguments."""
    return ["--lines", str(lines), *(["--job", job_id] if job_id else [])]


def parse_status(data: t.Any, *, where: str) -> StatusDoc:
    """A ``status`` (or ``launch``) reply checked against :class:`StatusDoc`. Damaged plot
    data costs the sparklines, never the status: a ``history`` that is not a
    :class:`~remote_payload.wire_shapes.HistoryDoc` becomes None.

    Raises:
        ReplyShapeError: the reply is not a status document.
    """
    return t.cast(StatusDoc, check_reply("status", data, where=where))


def is_terminal(st: StatusDoc) -> bool:
    return JobState(st["state"]).is_terminal()


def fetch_status(agent: Agent, job_id: str | None, lines: int = 20) -> StatusDoc:
    """One ``status`` call."""
    return agent.call("status", *status_args(job_id, lines), timeout=STATUS_TIMEOUT_S)


def wait(agent: Agent, job_id: str | None, *, until: Until, timeout_s: float | None,
         poll_s: float = DEFAULT_POLL_S, on_update: OnUpdate | None = None,
         lines: int = 20) -> WatchOutcome:
    """Poll ``status`` until the condition holds.

    The watch is bound to one job: without ``job_id`` the first answer names the
    current job, and every later poll asks for that job by id, so a
    ``deploy --replace`` elsewhere never makes it switch to the new job (it
    follows the old one to its end, CANCELLED).

    Raises:
        TransportError: no successful poll for :data:`MAX_OUTAGE_S`.
    """
    start = time.monotonic()
    polls = 0
    backoff = 0.5
    last_ok = start
    status: StatusDoc | None = None
    while True:
        loop_start = time.monotonic()
        try:
            status = fetch_status(agent, job_id, lines)
            job_id = status["job_id"]  # bound from now on (see above)
            polls += 1
            backoff = 0.5
            last_ok = time.monotonic()
            problem = None
        except TransportError as exc:
            agent.remote.close()
            if time.monotonic() - last_ok > MAX_OUTAGE_S:
                raise
            problem = f"connection problem, retrying in {backoff:g} s: {exc.message}"
        elapsed = time.monotonic() - start
        if on_update is not None:
            on_update(status, elapsed, problem)
        if status is not None and problem is None:
            if is_terminal(status):
                return WatchOutcome(status, "terminal", elapsed, polls)
            if until == "healthy" and status["healthy"]:
                return WatchOutcome(status, "healthy", elapsed, polls)
            if timeout_s is not None and elapsed >= timeout_s:
                return WatchOutcome(status, "timeout", elapsed, polls)
        if problem is not None:
            time.sleep(backoff)
            backoff = min(backoff * 2, 8.0)
            continue
        time.sleep(max(0.0, poll_s - (time.monotonic() - loop_start)))
