"""Is a job using the current build right now? Swaps and cache changes must refuse if so.

Asks the agent's job model (``jobs/current`` plus the reconciled record), which trusts
no single file: a job counts as running only with no exit code, a non-terminal state
and a live process whose start time matches the one recorded.
"""

from __future__ import annotations

from remote_payload.agent.common import AgentFailure
from remote_payload.agent.torchenv.layout import Layout
from remote_payload.wire import ErrorType


def running_job(layout: Layout) -> tuple[str, str] | None:
    """(job_id, state) of the running job, or None.

    Uses the agent's own reconciliation (pid *and* start time checked against /proc), so
    "running" here means exactly what `opsctl status` would say.
    """
    from remote_payload.agent import jobstore as jobs

    job_id = jobs.current_job_id(layout.root)
    if not job_id:
        return None
    try:
        rec = jobs.load(layout.root, job_id)
    except AgentFailure:  # the current marker points at a removed job: nothing runs
        return None
    if rec.state.is_terminal() or not rec.alive:
        return None
    return job_id, rec.state.value


def refuse_if_job_running(layout: Layout, action: str) -> None:
    """Raises ``AgentFailure(ErrorType.JobRunning, job_id=..., state=...)`` when a job runs."""
    job = running_job(layout)
    if job is not None:
        job_id, state = job
        raise AgentFailure(ErrorType.JobRunning,
                           f"refusing to {action}: job {job_id} is {state} on the current build",
                           job_id=job_id, state=state, hint=f"opsctl stop --job {job_id}")
