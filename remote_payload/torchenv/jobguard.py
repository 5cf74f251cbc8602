"""Is a job using the current build right now? Swaps and cache changes must refuse if so.

Reads the job directory layout of docs/contracts.md (``jobs/current``, ``status.json``,
``exit_code``, ``pid``) and trusts none of it alone: a job counts as running only when
it has no exit code, a non-terminal state and a live pid.
"""

from __future__ import annotations

import contextlib
import os

from remote_payload import wire
from remote_payload.agent.common import AgentFailure, read_json
from remote_payload.torchenv.layout import Layout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_job(layout: Layout) -> tuple[str, str] | None:
    """(job_id, state) of the running job, or None."""
    try:
        with open(os.path.join(layout.jobs, "current"), encoding="utf-8") as f:
            job_id = f.read().strip()
    except FileNotFoundError:
        return None
    if not job_id:
        return None
    job_dir = os.path.join(layout.jobs, job_id)
    if os.path.exists(os.path.join(job_dir, "exit_code")):
        return None
    status = read_json(os.path.join(job_dir, "status.json"), default={}) or {}
    state = str(status.get("state") or wire.JobState.PENDING.value)
    with contextlib.suppress(ValueError):
        if wire.JobState(state).is_terminal():
            return None
    pid = status.get("pid")
    if not isinstance(pid, int):
        with contextlib.suppress(OSError, ValueError), open(os.path.join(job_dir, "pid")) as f:
            pid = int(f.read().strip())
    if not isinstance(pid, int) or not _pid_alive(pid):
        return None
    return job_id, state


def refuse_if_job_running(layout: Layout, action: str) -> None:
    """Raises ``AgentFailure("JobRunning", job_id=..., state=...)`` when a job runs."""
    job = running_job(layout)
    if job is not None:
        job_id, state = job
        raise AgentFailure("JobRunning",
                           f"refusing to {action}: job {job_id} is {state} on the current build",
                           job_id=job_id, state=state, hint=f"opsctl stop --job {job_id}")
