"""Wire formats shared by the local CLI, the container agent and the trainer.

This module is the contract: the agent and the trainer produce these shapes, and
``opsctl`` parses them. It is stdlib-only (it runs on the container's python3)
and never imports torch or libtmux.

Agent replies
    Every agent verb prints exactly one JSON document on stdout::

        {"ok": true,  "verb": "status", "data": {...}, "agent_version": 1}
        {"ok": false, "verb": "launch", "error": {"type": "JobAlreadyRunning",
                                                   "message": "...", "fields": {...}}}

    and exits 0 when ``ok`` is true, :data:`AGENT_ERROR_RC` otherwise. Anything
    else on stdout is a bug; diagnostics go to stderr.

Trainer events
    A job may print machine-readable events, one JSON object per line on stdout,
    mixed with human text. A line is an event iff it parses as a JSON object
    with a string ``"event"`` key. The job wrapper copies them to
    ``jobs/<id>/events.jsonl`` and folds them into ``status.json``.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import typing as t

AGENT_PROTOCOL = 1
AGENT_ERROR_RC = 3

#: A job id: a file name under ``jobs/`` (no ``/``, no leading dot or dash). The agent
#: enforces it and the CLI checks ``--job`` against it before anything is sent.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

# --- job states -------------------------------------------------------------


class JobState(str, enum.Enum):  # noqa: UP042 (StrEnum is 3.11+; the agent runs on 3.10 too)
    """Job lifecycle (SkyPilot style, forward only)."""

    PENDING = "PENDING"  # spec written, wrapper not started yet
    SETTING_UP = "SETTING_UP"  # process started, loading / preparing
    COMPILING = "COMPILING"  # job said it is compiling (torch.compile warm-up)
    RUNNING = "RUNNING"  # healthy: first step event or healthy_when matched
    SUCCEEDED = "SUCCEEDED"  # exited 0
    FAILED = "FAILED"  # exited non-zero or killed by a signal
    CANCELLED = "CANCELLED"  # stopped by `opsctl stop`
    LOST = "LOST"  # no process and no exit code (tmux server / container restarted)

    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})
_TERMINAL = frozenset(TERMINAL_STATES)

ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.SETTING_UP} | _TERMINAL),
    JobState.SETTING_UP: frozenset({JobState.COMPILING, JobState.RUNNING} | _TERMINAL),
    JobState.COMPILING: frozenset({JobState.RUNNING} | _TERMINAL),
    JobState.RUNNING: frozenset(_TERMINAL),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.LOST: frozenset(),
}


def can_transition(old: JobState, new: JobState) -> bool:
    return new == old or new in ALLOWED_TRANSITIONS[old]


# --- trainer events -----------------------------------------------------------

EVENT_PHASE = "phase"  # {"event":"phase","phase":"loading|compiling|training|checkpointing|done"}
# {"event":"step","step":int,"loss":float,"acc":float,"tok_s":float,"eta_s":float,"lr":float}
EVENT_STEP = "step"
EVENT_COMPILE = "compile"  # {"event":"compile","name":str,"seconds":float,"recompiles":int}
EVENT_CHECKPOINT = "checkpoint"  # {"event":"checkpoint","step":int,"path":str}
EVENT_ERROR = "error"  # {"event":"error","type":str,"message":str}
EVENT_DONE = "done"  # {"event":"done","step":int,"reason":"finished|SIGINT|SIGTERM|stop-at-step"}
# The trainer also emits resume, cache, cache_artifacts, cache_artifacts_loaded and replicas
# (docs/trainer.md); the probe emits probe_report. Any object with a string "event" is an event.

# Any event may carry ``budget_s``: how long the job may stay silent after it (no output, no
# event) before opsctl calls it hung. The trainer announces one per phase (loading, each
# bucket's compile, training steps); the agent's hang check uses the latest one.
FIELD_BUDGET = "budget_s"

PHASE_TO_STATE: dict[str, JobState] = {
    "loading": JobState.SETTING_UP,
    "setup": JobState.SETTING_UP,
    "compiling": JobState.COMPILING,
    "warmup": JobState.COMPILING,
    "training": JobState.RUNNING,
}


def parse_event(line: str | bytes) -> dict[str, t.Any] | None:
    """Return the event in ``line`` or None when it is human text."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    s = line.strip()
    if not (s.startswith("{") and s.endswith("}")):
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("event"), str):
        return obj
    return None


def format_event(event: str, **fields: t.Any) -> str:
    """One event line (no newline); used by the trainer and probes."""
    return json.dumps({"event": event, **fields}, separators=(",", ":"), sort_keys=False)


# --- agent envelope -----------------------------------------------------------


def ok_reply(verb: str, data: t.Any) -> dict[str, t.Any]:
    return {"ok": True, "verb": verb, "agent_version": AGENT_PROTOCOL, "data": data}


def error_reply(verb: str, type_: str, message: str, **fields: t.Any) -> dict[str, t.Any]:
    return {
        "ok": False,
        "verb": verb,
        "agent_version": AGENT_PROTOCOL,
        "error": {"type": type_, "message": message, "fields": fields},
    }


# --- per-process files of a job -------------------------------------------------
#
# Every python process of a job has two files in ``<job dir>/procs/``: ``<pid>.stacks``, where
# the sitehook points faulthandler (a dump per process, never interleaved with the job's
# output or another process's dump), and ``<pid>.json``, where a process that knows its place
# (the trainer: rank, role, GPU) says so. The agent reads both for ``stacks`` and hang reports.

#: The signal that makes a job's python process dump every thread's stack (the sitehook arms
#: it). A private real-time signal: native libraries may take SIGUSR1 over (seen on an H200
#: with CUDA torch: SIGUSR1 stayed "caught" but no dump came); nothing else uses this one.
STACKS_SIGNAL = signal.SIGRTMIN + 7
PROCS_DIR = "procs"
ENV_JOB_DIR = "OPSCTL_JOB_DIR"  # exported to every job process by the wrapper


def proc_stacks_path(job_dir: str, pid: int) -> str:
    return os.path.join(job_dir, PROCS_DIR, f"{pid}.stacks")


def proc_info_path(job_dir: str, pid: int) -> str:
    return os.path.join(job_dir, PROCS_DIR, f"{pid}.json")


def announce_process(**info: t.Any) -> None:
    """Record this process's place in the job (rank, role, gpu...) for ``stacks``/hang reports.

    A no-op outside an opsctl job; never raises (it must not break the job)."""
    job_dir = os.environ.get(ENV_JOB_DIR)
    if not job_dir:
        return
    pid = os.getpid()
    path = proc_info_path(job_dir, pid)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"pid": pid, **info}, f)
        os.replace(tmp, path)
    except OSError:
        pass
