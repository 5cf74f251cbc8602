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
import math
import os
import re
import signal
import typing as t

AGENT_PROTOCOL = 1
AGENT_ERROR_RC = 3

#: opsctl's directory inside a container (payload, jobs, torch builds, caches); an inventory
#: host's ``root:`` overrides it, the agent's ``--root`` / ``$OPSCTL_ROOT`` too.
DEFAULT_ROOT = "/opt/opsctl"
ENV_ROOT = "OPSCTL_ROOT"
#: The tmux server (``tmux -L``) the job sessions live on, and the variable that overrides it.
DEFAULT_TMUX_SOCKET = "opsctl"
ENV_TMUX_SOCKET = "OPSCTL_TMUX_SOCKET"

#: An environment variable name (POSIX shells and ``os.execve``): playbook ``env`` and ``secrets``.
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"

#: A job id: a file name under ``jobs/`` (no ``/``, no leading dot or dash). The agent
#: enforces it and the CLI checks ``--job`` against it before anything is sent.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
#: The most rows one ``jobs`` reply lists (the newest; ``total`` still counts every job): the
#: agent stops there, and the CLI refuses a reply with more. Also the most ``--limit`` asks.
JOB_ROWS_MAX = 1000
#: A torch build's name (``envs/<name>``, :func:`torch_build_name`): one path component that
#: starts ``torch-`` and never holds ``..`` (``agent/jobqueue.py`` checks a spec's build by it).
#: Without a lookahead: the CLI's validator (pydantic's regex engine) has none.
BUILD_NAME_PATTERN = r"^torch-[0-9A-Za-z_+-](?:\.?[0-9A-Za-z_+-])*\.?$"
BUILD_NAME_MAX = 106
#: A compile cache's fingerprint (``cache/<fingerprint>``, ``agent/torchenv/fingerprint.py``
#: keeps only these characters): one path component, never ``.``, ``..`` or a leading dash.
FINGERPRINT_PATTERN = r"^[A-Za-z0-9_+](?:\.?[A-Za-z0-9_+-])*\.?$"
FINGERPRINT_MAX = 255
#: A dotted IPv4 address, as the ``net`` verb reads it from the kernel.
IPV4_PATTERN = r"^[0-9]{1,3}(?:\.[0-9]{1,3}){3}$"
#: random bytes at the end of a new job id, ``<name>-<YYYYmmdd-HHMMSS>-<8 hex>`` (two ids of
#: one name and second collide once in ~4e9; a batch and the existing job dirs are checked too)
JOB_ID_RANDOM_BYTES = 4

# --- job states -------------------------------------------------------------


#: The job states' names as a type (the wire shapes' ``state``). The same names as
#: :class:`JobState`, in the same order: ``tests/unit/test_wire_shapes_bounds.py`` ties the two.
JobStateName = t.Literal["QUEUED", "PENDING", "SETTING_UP", "COMPILING", "RUNNING", "SUCCEEDED",
                         "FAILED", "CANCELLED", "LOST"]


class JobState(str, enum.Enum):  # not StrEnum (3.11+): the agent runs on 3.10 too
    """Job lifecycle (SkyPilot style, forward only)."""

    QUEUED = "QUEUED"  # in the container's queue: waits for its dependency and its GPUs
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
    # a queued job starts (PENDING), is removed or its dependency failed (CANCELLED), or its
    # start failed before any wrapper ran (FAILED: the preflight refused it)
    JobState.QUEUED: frozenset({JobState.PENDING, JobState.CANCELLED, JobState.FAILED}),
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


# --- the queue and GPU slots -----------------------------------------------------------

#: The most GPU slots a container can have (an inventory's ``gpus`` is 0-1024).
MAX_GPU_SLOTS = 1024
#: The most jobs one container's queue holds (queued, not yet started); a pipeline's steps count.
MAX_QUEUE_JOBS = 256
#: The most steps one pipeline playbook may have.
MAX_PIPELINE_STEPS = 64
#: ``end_reason`` of a queued job removed by ``queue rm`` (it never ran).
END_REASON_REMOVED = "removed"
#: The stdin document of the agent's ``queue-add`` may be at most this large.
MAX_QUEUE_ADD_BYTES = 4 * 2**20

GpuRequest = t.Union[int, list[int], None]  # noqa: UP007 (3.10 agent: evaluated at run time)


def dependency_reason(dep: str, state: str) -> str:
    """``end_reason`` of a queued job cancelled because its dependency ended without success."""
    return f"dependency {dep} {state}"


def gpu_request_unfit(request: GpuRequest, total: int) -> str | None:
    """Why a (valid) GPU request can never run on a container of ``total`` slots (0: the count
    is not known), or None when it can: one rule for ``queue add``'s refusal (client and
    agent) and the queue's FAILED for a job whose request no longer fits."""
    if request is None:
        return None
    if not total:
        return (f"gpus {request}: the container's GPU count is not known; set gpus: for this "
                "container in the inventory")
    try:
        validate_gpu_request(request, total)
    except ValueError as exc:
        return str(exc)
    return None


def validate_gpu_request(value: t.Any, slots: int | None = None) -> GpuRequest:
    """A job's ``gpus``: None (the whole container), a count (1..slots) or a list of distinct
    slot indices (each < slots). ``slots`` None: the container's count is not known here
    (the bounds are then 1..MAX_GPU_SLOTS). One rule for the playbook, ``--gpus`` and the agent.

    Raises:
        ValueError: a bool, 0, a negative or too large number, a repeated index, an empty list.
    """
    limit = MAX_GPU_SLOTS if slots is None else slots
    where = f"the container has {slots} GPU slot(s)" if slots is not None else \
        f"at most {MAX_GPU_SLOTS}"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | list):
        raise ValueError("gpus must be a count or a list of GPU indices")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"gpus {value}: a count is at least 1 (leave gpus out for the "
                             "whole container)")
        if value > limit:
            raise ValueError(f"gpus {value}: more GPUs than exist ({where})")
        return value
    if not value:
        raise ValueError("gpus []: name at least one GPU index")
    if len(value) > MAX_GPU_SLOTS:
        raise ValueError(f"gpus: at most {MAX_GPU_SLOTS} indices")
    for g in value:
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise ValueError(f"gpus: {g!r} is not a GPU index (0, 1, ...)")
        if g >= limit:
            raise ValueError(f"gpus: index {g} does not exist ({where})")
    if len(set(value)) != len(value):
        dup = sorted({g for g in value if value.count(g) > 1})
        raise ValueError(f"gpus: index {dup[0]} given twice")
    return list(value)


_GPU_DIGITS = 6  # a count or an index past this many digits is no GPU (and int() refuses
#                  past 4300 digits with Python's own message)


def parse_gpu_request(text: str, slots: int | None = None) -> GpuRequest:
    """``--gpus N`` or ``--gpus 0,1,3`` (a list needs a comma, or a single index written
    ``3,``); surrounding blanks are ignored.

    Raises:
        ValueError: anything else, and what :func:`validate_gpu_request` refuses.
    """
    s = text.strip()
    if len(s) > 8 * MAX_GPU_SLOTS or any(len(p.strip()) > _GPU_DIGITS for p in s.split(",")):
        raise ValueError(f"gpus {text[:20]!r}...: too long for a GPU count or index list")
    if "," in s:
        parts = [p.strip() for p in s.split(",")]
        if parts and parts[-1] == "":
            parts.pop()
        if not parts or not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError(f"gpus {text!r}: a list is GPU indices separated by commas, e.g. 0,1,3")
        return validate_gpu_request([int(p) for p in parts], slots)
    if not (s.isascii() and s.isdigit()):
        raise ValueError(f"gpus {text!r}: a count (e.g. 4) or a list of indices (e.g. 0,1,3)")
    return validate_gpu_request(int(s), slots)


# --- trainer events -----------------------------------------------------------

EVENT_PHASE = "phase"  # {"event":"phase","phase":"loading|compiling|training|checkpointing|done"}
# {"event":"step","step":int,"loss":float,"acc":float,"tok_s":float,"eta_s":float,"lr":float}
EVENT_STEP = "step"
EVENT_COMPILE = "compile"  # {"event":"compile","name":str,"seconds":float,"recompiles":int}
EVENT_CHECKPOINT = "checkpoint"  # {"event":"checkpoint","step":int,"path":str}
EVENT_ERROR = "error"  # {"event":"error","type":str,"message":str}
EVENT_DONE = "done"  # {"event":"done","step":int,"reason":"finished|SIGINT|SIGTERM|stop-at-step"}
EVENT_RESUME = "resume"  # {"event":"resume","step":int,"path":str}: continued from a checkpoint
EVENT_CACHE = "cache"  # compile-cache counters after warm-up (hits, misses per cache)
EVENT_CACHE_ARTIFACTS = "cache_artifacts"  # a mega-cache saved (--save-cache-artifacts)
EVENT_CACHE_ARTIFACTS_LOADED = "cache_artifacts_loaded"  # a mega-cache loaded before compiling
# when each start-up phase ended (seconds since the process started), once after the first step
EVENT_STARTUP = "startup"
EVENT_REPLICAS = "replicas"  # drafter replicas agree on their weights (digests per rank)
EVENT_PROBE_REPORT = "probe_report"  # the compile-race probe's final report
EVENT_PROBE_MODE_RESULT = "probe_mode_result"  # one probe mode's result (child -> probe)
# written by the job's wrapper itself (not printed by the job):
EVENT_RESTART = "restart"  # {"event":"restart","attempt":int,"reason":str}: attempt N starts
EVENT_TIME_LIMIT = "time_limit"  # {"event":"time_limit","max_duration_s":float,"attempt":int}
# {"event":"acceptance","tau":float,"tau_cut":float,"tau_untrained":float|None,"per_position":[float],...}:
# speculative decoding of the drafter against the target (``trainer eval``); tau is counted as
# z-lab/dflash's benchmark counts it (per prompt the mean of accepted drafts + 1 per target
# forward, then the mean over prompts), tau_cut the tokens kept after the EOS/max_new cut per
# target forward, per_position the share of blocks accepting position k
EVENT_ACCEPTANCE = "acceptance"
# {"event":"regenerate","records":int,"tokens":int,"tok_s":float,...}: ``trainer regenerate``
EVENT_REGENERATE = "regenerate"
# {"event":"trackers","report_to":[str],"run":str,"tensorboard":dir,"wandb":dir,"mlflow":uri}:
# where the run's experiment trackers write (``--report-to``), said once at the start
EVENT_TRACKERS = "trackers"
# {"event":"warning","source":str,"message":str,...}: something failed that costs the run
# nothing (a tracker that could not start or write, metrics dropped); never a job state
EVENT_WARNING = "warning"
# Any object with a string "event" is an event; these are the ones opsctl's own code writes.

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
        return finite_doc(obj)  # a NaN loss: null here, named under "nonfinite", from here on
    return None


def format_event(event: str, **fields: t.Any) -> str:
    """One event line (no newline); used by the trainer and probes."""
    return dumps_strict({"event": event, **fields}, separators=(",", ":"), sort_keys=False)


# --- strict JSON: no NaN, no Infinity ----------------------------------------------------
#: The key that lists, as paths (``data.last_step.loss``, ``hosts[0].jobs[1].loss``), the
#: numbers of a document that were NaN or +-Infinity and are ``null`` in it: Python's
#: ``json.dumps`` writes them as the bare words ``NaN``/``Infinity``, which no strict parser
#: (JavaScript's ``JSON.parse``, jq, Go, Rust) accepts. One shape, on both sides.
NONFINITE_KEY = "nonfinite"


def number_in(v: t.Any, low: float, high: float) -> float | None:
    """``v`` as a finite float within ``[low, high]``, else None: what a number read back from
    untrusted JSON may be (a bool is no number, nor an integer too large for a float)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) and low <= f <= high else None


def finite_json(obj: t.Any, path: str = "") -> tuple[t.Any, list[str]]:
    """``obj`` with every non-finite float replaced by ``None``, and the paths replaced.

    Dicts, lists and tuples are walked (tuples come back as lists); anything else is kept as
    it is (a ``default=`` of ``json.dumps`` handles it).
    """
    if isinstance(obj, float):
        return (obj, []) if math.isfinite(obj) else (None, [path or "."])
    if isinstance(obj, dict):
        out: dict[t.Any, t.Any] = {}
        paths: list[str] = []
        for k, v in obj.items():
            out[k], sub = finite_json(v, f"{path}.{k}" if path else str(k))
            paths += sub
        return out, paths
    if isinstance(obj, list | tuple):
        items: list[t.Any] = []
        paths = []
        for i, v in enumerate(obj):
            item, sub = finite_json(v, f"{path}[{i}]")
            items.append(item)
            paths += sub
        return items, paths
    return obj, []


def finite_doc(doc: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """A document (an object) made strict: non-finite numbers ``null``, their paths (and any
    the document already listed) under :data:`NONFINITE_KEY`."""
    clean, paths = finite_json(dict(doc))
    if paths:
        before = clean.get(NONFINITE_KEY)
        earlier = [p for p in before if isinstance(p, str)] if isinstance(before, list) else []
        clean[NONFINITE_KEY] = [*earlier, *(p for p in paths if p not in earlier)]
    return t.cast(dict[str, t.Any], clean)


def dumps_strict(doc: t.Mapping[str, t.Any], **kwargs: t.Any) -> str:
    """``json.dumps`` of :func:`finite_doc` with ``allow_nan=False``: every JSON document
    that leaves opsctl or the agent goes through here, so a regression fails loudly."""
    return json.dumps(finite_doc(doc), allow_nan=False, **kwargs)


# --- doctor rows -------------------------------------------------------------
# One check of ``opsctl doctor`` (the agent's ``doctor`` verb answers a list of them, and a
# launch refused by one carries it in ``fields.row``):
# {"name": str, "status": "ok|warn|fail|skip", "reason": str, "evidence": str, "fix": str}
# ``evidence`` is the exact line the check read; ``fix`` the exact command or config line.
DOCTOR_STATUSES = ("ok", "warn", "fail", "skip")
#: What the reason of a check skipped for want of time says (both sides): ``opsctl doctor``
#: counts such a row as unfinished, so a deadline that left no time is never a clean bill.
DEADLINE_SKIP = "deadline left no time"


def doctor_row(name: str, status: str, reason: str, evidence: str = "",
               fix: str = "") -> dict[str, str]:
    """One doctor row (the shape above)."""
    return {"name": name, "status": status, "reason": reason, "evidence": evidence, "fix": fix}


# --- agent envelope -----------------------------------------------------------


class ErrorType(str, enum.Enum):  # not StrEnum (3.11+): the agent runs on 3.10 too
    """Every ``error.type`` an agent reply can carry; the member name is the wire value.

    The agent raises only these (``AgentFailure(ErrorType.X, ...)``), and ``opsctl`` maps
    each to an exit-code family (``opsctl.remote.agent_client.ERROR_FAMILIES``;
    ``tests/unit/test_error_contract.py`` checks both directions).
    """

    # arguments and specs
    UsageError = "UsageError"  # the verb's arguments do not parse
    UnknownVerb = "UnknownVerb"
    BadSpec = "BadSpec"  # launch spec invalid (field named in ``fields.field``)
    BadJobId = "BadJobId"
    BadOffset = "BadOffset"
    AgentCrashed = "AgentCrashed"  # an unexpected exception in the agent (a bug)
    # jobs
    NoSuchJob = "NoSuchJob"
    JobAlreadyRunning = "JobAlreadyRunning"  # launch without --replace while a job runs
    JobExists = "JobExists"  # launch with a job id that is already taken
    JobNotRunning = "JobNotRunning"
    JobRunning = "JobRunning"  # a swap or cache change refused: a job uses the build
    LaunchFailed = "LaunchFailed"
    TmuxFailed = "TmuxFailed"
    NoStacks = "NoStacks"
    GpusBusy = "GpusBusy"
    PayloadMismatch = "PayloadMismatch"  # launch --payload-digest: the installed payload differs
    LaunchAborted = "LaunchAborted"  # the deploy was interrupted (``abort``) before this launch
    DiskFull = "DiskFull"  # ENOSPC/EDQUOT where the agent writes its records
    DamagedRecord = "DamagedRecord"  # a job dir's record does not parse (``fields.path``, ``reason``)
    # torch builds and compile caches
    TorchInstallFailed = "TorchInstallFailed"  # install or verification of a build failed
    TorchFactsFailed = "TorchFactsFailed"
    TorchEnvError = "TorchEnvError"
    TorchEnvBusy = "TorchEnvBusy"  # another swap or cache change holds the lock
    NoCurrentBuild = "NoCurrentBuild"
    CacheSeedFailed = "CacheSeedFailed"
    # a launch refused by a failing doctor check (``fields.row``: the doctor row)
    PreflightFailed = "PreflightFailed"
    # the queue: a queue operation refused (unknown/own dependency, a cycle, a
    # running job to remove, a full queue, GPUs that do not exist); ``fields.why`` says which
    QueueRefused = "QueueRefused"



def ok_reply(verb: str, data: t.Any) -> dict[str, t.Any]:
    return {"ok": True, "verb": verb, "agent_version": AGENT_PROTOCOL, "data": data}


def error_reply(verb: str, type_: ErrorType, message: str, **fields: t.Any) -> dict[str, t.Any]:
    return {
        "ok": False,
        "verb": verb,
        "agent_version": AGENT_PROTOCOL,
        "error": {"type": type_.value, "message": message, "fields": fields},
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
#: a job's torch build's cache folder and its seeded mega-cache (the agent exports both;
#: the trainer keeps its bytecode under the first and loads the second)
ENV_CACHE_DIR = "OPSCTL_CACHE_DIR"
ENV_ARTIFACTS = "OPSCTL_CACHE_ARTIFACTS"
#: the file where the job's wrapper keeps its run's goodput ledger in brief (exported to the
#: job; ``--report-to``'s trackers log it as scalars)
ENV_GOODPUT_FILE = "OPSCTL_GOODPUT_FILE"
#: which attempt of its job the process is (1, then one more per restart by the policy)
ENV_ATTEMPT = "OPSCTL_ATTEMPT"


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
        from remote_payload import safe_write  # stdlib only, like this module

        os.makedirs(os.path.dirname(path), exist_ok=True)
        safe_write.write_text(path, json.dumps({"pid": pid, **info}), durable=False)
    except OSError:
        pass


# --- torch builds ------------------------------------------------------------------
#
# The same names on both sides: the local builds table picks a build, the agent installs and
# verifies it under ``<root>/envs/<build name>``.

#: ``cpu`` or ``cuNNN`` (the PyTorch wheel index's local tag).
TORCH_VARIANT_RE = re.compile(r"^(cpu|cu\d{3})$")
#: A plain release (``2.11.0``, ``2.12.0rc1``); the variant supplies the ``+local`` tag.
TORCH_RELEASE_RE = re.compile(r"^\d+\.\d+(\.\d+)?([a-z0-9.]*)$")
#: A torch wheel's file name; group 1 is its version (with the local tag).
TORCH_WHEEL_RE = re.compile(r"^torch-([^-]+)-[^-]+-[^-]+-[^-]+\.whl$")
TORCH_BUILD_PREFIX = "torch-"


def torch_build_name(version: str, variant: str) -> str:
    """``torch-2.11.0-cu130``; the local tag is the variant, so it is not repeated."""
    return f"{TORCH_BUILD_PREFIX}{version}-{variant}"


def cuda_for_variant(variant: str) -> str | None:
    """What ``torch.version.cuda`` must say: ``cu128`` -> ``"12.8"``, ``cu130`` -> ``"13.0"``,
    ``cpu`` -> None."""
    if variant == "cpu":
        return None
    digits = variant[2:]
    return f"{int(digits[:-1])}.{digits[-1]}"


# --- babysitting: restart policy, notifications, secrets (playbook keys, checked on both sides) -

#: ``restart.on`` entries with a meaning of their own, besides diagnosis ids and exit codes
#: (``remote_payload/agent/restart.py`` says what each matches).
RESTART_ON_FAILED = "failed"
RESTART_ON_HANG = "hang"
RESTART_DEFAULT_ON: tuple[str, ...] = (RESTART_ON_FAILED,)
#: The diagnosis ids ``restart.on`` may name: the causes of ``remote_payload/agent/diagnosis.py``'s
#: ``SIGNATURES`` (listed here because opsctl validates playbooks without importing the agent;
#: ``tests/unit/test_restart_policy.py`` fails when the two differ).
DIAGNOSIS_IDS: tuple[str, ...] = (
    "fx_tracing_race", "compile_hang_stacks", "hang", "cuda_oom", "nccl_timeout", "nccl_error",
    "flex_attention_uncompiled", "recompile_limit", "cuda_driver_mismatch", "missing_module",
    "rank_failed", "killed_by_signal", "throughput_regression", "drafters_waiting_for_features",
    "gpus_busy_at_launch", "python_exception")
#: A usage error: the command line is wrong, running it again cannot help; never restarted.
USAGE_ERROR_EXIT = 2
MAX_RESTARTS_LIMIT = 1000
#: A secret's value must be at least this long: a shorter one would mask ordinary output.
SECRET_MIN_LEN = 4


def validate_restart(raw: t.Any) -> dict[str, t.Any] | None:
    """A spec's ``restart`` with ``on`` filled in, or None; ``ValueError`` names the problem."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("restart must be an object {max_restarts: N, on: [...]}")
    unknown = sorted(set(raw) - {"max_restarts", "on"})
    if unknown:
        raise ValueError(f"restart has unknown keys: {', '.join(map(str, unknown))}")
    n = raw.get("max_restarts")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_RESTARTS_LIMIT:
        raise ValueError(f"restart.max_restarts must be an integer from 0 to {MAX_RESTARTS_LIMIT}")
    on = raw.get("on")
    on = list(RESTART_DEFAULT_ON) if on is None else on
    if not isinstance(on, list) or not on:
        raise ValueError("restart.on must be a non-empty list of diagnosis ids or exit codes")
    for item in on:
        if isinstance(item, bool) or not isinstance(item, (int, str)) or item == "":
            raise ValueError(f"restart.on: {item!r} is neither a diagnosis id nor an exit code")
        if isinstance(item, int) and not 1 <= item <= 255:
            raise ValueError(f"restart.on: exit code {item} is outside 1-255")
        if item == USAGE_ERROR_EXIT:
            raise ValueError("restart.on: exit 2 is a usage error, which never restarts")
        if isinstance(item, str) and item not in (RESTART_ON_FAILED, *DIAGNOSIS_IDS):
            raise ValueError(f"restart.on: unknown id {item!r}; use {RESTART_ON_FAILED}, an exit "
                             f"code or a diagnosis id: {', '.join(DIAGNOSIS_IDS)}")
    return {"max_restarts": n, "on": list(on)}


def valid_notify_url(url: t.Any) -> bool:
    """An absolute ``http``/``https`` URL with a host, no whitespace or control characters."""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 for c in url):
        return False
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False


def check_notify_urls(urls: list[str]) -> list[str]:
    """``urls`` when every one is valid (:func:`valid_notify_url`); else ``ValueError`` naming them."""
    bad = [u for u in urls if not valid_notify_url(u)]
    if bad:
        raise ValueError(f"not an http(s) URL: {', '.join(repr(u) for u in bad)}")
    return urls


# --- multi-node runs ----------------------------------------------------------

#: A job spec's (and its status's) membership in a multi-node run (``deploy --nodes``):
#: ``{"id": RUN_ID, "node": INDEX, "nodes": COUNT}``. Every node's job of one run carries the
#: same id; ``status``/``stop --nodes`` act only on jobs that carry it, and refuse a node list
#: whose current jobs are not one run. A single-container job has none (null).
RUN_FIELD = "run"
#: The most nodes one run may have (``--nodes``): far above any Proxmox cluster's GPU
#: containers; a typo guard, not a limit.
MAX_RUN_NODES = 64


def validate_run(raw: t.Any) -> dict[str, t.Any] | None:
    """A spec's ``run`` as the agent keeps it, or None; ``ValueError`` names the problem."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"id", "node", "nodes"}:
        raise ValueError("run must be an object {id, node, nodes}")
    run_id, node, nodes = raw["id"], raw["node"], raw["nodes"]
    if not isinstance(run_id, str) or not re.fullmatch(JOB_ID_PATTERN, run_id):
        raise ValueError(f"run.id {run_id!r} is not a job-id-shaped name")
    ints = [x for x in (node, nodes) if isinstance(x, int) and not isinstance(x, bool)]
    if len(ints) != 2 or not 1 <= nodes <= MAX_RUN_NODES or not 0 <= node < nodes:
        raise ValueError(f"run.node must be 0..nodes-1 and run.nodes 1..{MAX_RUN_NODES}")
    return {"id": run_id, "node": node, "nodes": nodes}
