"""The job directory model and the reconcile step that keeps its state honest.

``jobs/<id>/`` is the only record of a job (docs/contracts.md). The wrapper
writes it while it lives; the agent reads it and checks it against ``/proc``
(pid *and* start time, so a reused pid is never mistaken for the job) before
it believes a non-terminal state. No live process and no exit code is LOST.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
import typing as t

from remote_payload import boundedread, limits, procfs, procgroup, safe_write, wire
from remote_payload.agent import jobrecord
from remote_payload.agent.common import AgentFailure, read_json, write_json_atomic
from remote_payload.wire import ErrorType

JobState = wire.JobState

# file names inside jobs/<id>/
SPEC = "spec.json"
#: spec.json and launch.json hold the job's environment and command line: owner-only (the
#: secrets themselves never land there: :mod:`remote_payload.agent.jobsecrets`)
PRIVATE_MODE = 0o600
LAUNCH = "launch.json"  # agent-side facts: created_at, tmux socket/session, argv, base env
STATUS = "status.json"
OUTPUT = "output.log"
EVENTS = "events.jsonl"
EXIT_CODE = "exit_code"
PID = "pid"
CANCEL = "cancel_requested"
HANGUP = "hangup"  # the wrapper got SIGHUP: tmux server or pane went away
WRAPPER_ERROR = "wrapper_error.txt"  # traceback of a wrapper crash (a bug)
LAUNCH_LOCK = ".launch.lock"  # in jobs/: launch and abort serialize on it
ABORTED = ".aborted"  # in jobs/: one marker per job id an interrupted deploy must not launch
ABORT_MARKER_TTL_S = 7 * 86400
DISK_LOW_BYTES = 1 << 20  # below this much free space in the job dir, status says "disk full"
STACK_DUMPS = "stack-dumps"
HANG = "hang.json"  # the wrapper's record of a quiet spell past the job's budget, with stacks

JOB_ID_RE = re.compile(wire.JOB_ID_PATTERN)
HEALTHY_DEFAULT: dict[str, t.Any] = {"started": True}
JOB_ENV_MARKER = "OPSCTL_JOB_ID"  # exported to the job by the wrapper; see marked_processes
JOB_CGROUP_PARENT = "opsctl-jobs"  # <cgroup2 mount>/opsctl-jobs/<job id>; see job_cgroup_create
# how long status waits for the wrapper to record the exit of a child it saw die
EXIT_RECORD_WAIT_S = 1.0
# a launch whose wrapper has not recorded a start after this long is LOST
PENDING_GRACE_S = 30.0
# stop's escalation (``stop_plan``): SIGINT, this long to checkpoint and exit, then SIGTERM,
# then SIGKILL after the second; also the playbook's max_duration_s
STOP_GRACE_S = 30.0
STOP_KILL_AFTER_S = 10.0
#: ``end_reason`` of a job the playbook's ``max_duration_s`` stopped (its cancel reason)
TIME_LIMIT_REASON = "time limit"


# --- paths ------------------------------------------------------------------


def jobs_root(root: str) -> str:
    return os.path.join(root, "jobs")


def job_dir(root: str, job_id: str) -> str:
    if not JOB_ID_RE.fullmatch(job_id):
        raise AgentFailure(ErrorType.BadJobId, f"invalid job id {job_id!r}", job_id=job_id)
    return os.path.join(jobs_root(root), job_id)


def current_job_id(root: str) -> str | None:
    """The job ``jobs/current`` names, or None when there is none.

    The agent writes that file itself (renamed into place, a job id and a newline), so
    anything else there was put by someone else and is refused without being read whole or
    shown: a link (its target is never read), a FIFO (never waited on), a device, more than
    :data:`remote_payload.limits.CURRENT_JOB_BYTES`, or text that is no job id.

    Raises:
        jobrecord.DamagedRecord: the file is there but is not the agent's (``reason`` says
            how; the file is left as it is).
    """
    path = os.path.join(jobs_root(root), "current")
    try:
        data = jobrecord.read_bounded(path, limits.CURRENT_JOB_BYTES)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise jobrecord.DamagedRecord(path, str(exc)) from None
    except OSError as exc:
        raise jobrecord.DamagedRecord(path, f"unreadable: {exc.strerror or exc}") from None
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return None
    if not JOB_ID_RE.fullmatch(text):
        raise jobrecord.DamagedRecord(path, f"does not hold a job id ({len(data)} bytes; "
                                            "not shown)")
    return text


def set_current_job(root: str, job_id: str) -> None:
    safe_write.write_text(os.path.join(jobs_root(root), "current"), job_id + "\n")


@contextlib.contextmanager
def launch_lock(root: str) -> t.Iterator[None]:
    """Serialize ``launch`` (old job's cancel, new job dir) with ``abort`` (one file, kept)."""
    import fcntl

    with open(os.path.join(jobs_root(root), LAUNCH_LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def abort_marker(root: str, job_id: str) -> str:
    job_dir(root, job_id)  # validates the id
    return os.path.join(jobs_root(root), ABORTED, job_id)


def prune_abort_markers(root: str) -> None:
    """Markers outlive any launch that could still be in flight by far; then they go."""
    d = os.path.join(jobs_root(root), ABORTED)
    now = time.time()
    for name in os.listdir(d) if os.path.isdir(d) else []:
        with contextlib.suppress(OSError):
            if now - os.path.getmtime(os.path.join(d, name)) > ABORT_MARKER_TTL_S:
                os.unlink(os.path.join(d, name))


def request_cancel(root: str, job_id: str, reason: str) -> None:
    """Mark the job as cancelled on purpose (its end is then CANCELLED, with ``reason``)."""
    mark_cancelled(job_dir(root, job_id), reason)


def mark_cancelled(path: str, reason: str) -> None:
    """Write the cancel marker into job dir ``path`` (``stop``, ``--replace``, the time limit).

    On a full disk the marker is still created empty (an inode, no data block) so that
    the stop goes ahead and is recorded as a cancel.
    """
    path = os.path.join(path, CANCEL)
    try:
        write_json_atomic(path, {"at": time.time(), "reason": reason})
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        with contextlib.suppress(OSError):
            open(path, "a").close()


def cancel_reason(path: str) -> str | None:
    """The reason in job dir ``path``'s cancel marker (None: none, or the empty marker)."""
    try:
        reason = (read_json(os.path.join(path, CANCEL), {}) or {}).get("reason")
    except (ValueError, AttributeError, OSError):  # the empty marker of a full disk
        return None
    return reason if isinstance(reason, str) else None


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_evidence(path: str) -> str | None:
    """A line for the evidence when the filesystem holding ``path`` is (nearly) full."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= DISK_LOW_BYTES and (st.f_files == 0 or st.f_favail > 16):
        return None
    what = "no free inodes" if st.f_files and st.f_favail <= 16 else f"{free // 1024} KiB free"
    return (f"disk full where the job writes ({path}: {what}): output.log, events and status "
            "may be incomplete; free space in the container")


def resolve_job(root: str, job_id: str | None) -> str:
    """The given job, the one job whose id starts with it, or the current one.

    A unique prefix is enough (``opsctl logs 2026``), as with git revisions; an exact id
    wins over a longer id it is a prefix of.

    Raises ``NoSuchJob``: nothing launched, no job with that id or prefix, or a prefix that
    several jobs share (the error lists them).
    """
    jid = job_id or current_job_id(root)
    if jid is None:
        raise AgentFailure(ErrorType.NoSuchJob, f"no job has been launched under {root}", root=root)
    check_not_linked(root, jid)
    if os.path.isdir(job_dir(root, jid)):
        return jid
    matches = sorted(n for n in list_job_ids(root) if n.startswith(jid))
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(matches[:5]) + (f" and {len(matches) - 5} more" if len(matches) > 5 else "")
        raise AgentFailure(ErrorType.NoSuchJob, f"job prefix {jid} is ambiguous: {shown}",
                           job_id=jid, matches=matches[:20])
    raise AgentFailure(ErrorType.NoSuchJob, f"job {jid} does not exist under {root}", job_id=jid)


def list_job_ids(root: str) -> list[str]:
    """The job dirs' ids (a symbolic link named like a job is no job dir:
    :func:`linked_job_dirs`)."""
    try:  # scandir's file types come with the listing: no stat per job dir (``status`` lists)
        with os.scandir(jobs_root(root)) as it:
            return [e.name for e in it
                    if JOB_ID_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


#: the ``damaged`` reason of a directory with none of a job's records, long after it was made
NOT_A_JOB_DIR = ("none of a job's records (spec.json, launch.json, status.json, pid): not a "
                 "job dir opsctl made (left as it is, never written into)")

#: the ``damaged`` reason of a symbolic link where a job dir belongs
LINKED_JOB_DIR = "a symbolic link, not a job dir (never followed)"


def linked_job_dirs(root: str) -> list[str]:
    """The symbolic links to a directory named like a job under ``jobs/``: opsctl never makes
    one (a job dir
    is made with mkdir), so one is never followed: never started, never written through; the
    ``jobs`` and ``queue`` replies list it under ``damaged``."""
    try:
        names = os.listdir(jobs_root(root))
    except FileNotFoundError:
        return []
    d = jobs_root(root)
    return sorted(os.path.join(d, n) for n in names
                  if JOB_ID_RE.fullmatch(n) and os.path.islink(os.path.join(d, n))
                  and os.path.isdir(os.path.join(d, n)))


def check_not_linked(root: str, job_id: str) -> None:
    """Raises :class:`jobrecord.DamagedRecord` when the job's dir is a symbolic link."""
    path = job_dir(root, job_id)
    if os.path.islink(path):
        raise jobrecord.DamagedRecord(path, LINKED_JOB_DIR)


def new_job_id(name: str) -> str:
    import secrets  # only launch needs it; status must not pay for hashlib

    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "job"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{safe[:80]}-{stamp}-{secrets.token_hex(wire.JOB_ID_RANDOM_BYTES)}"


# --- spec -------------------------------------------------------------------


def _bad(message: str, field: str) -> AgentFailure:
    return AgentFailure(ErrorType.BadSpec, message, field=field)


def validate_spec(raw: t.Any, payload_dir: str) -> dict[str, t.Any]:
    """Check a launch spec and fill defaults; unknown keys are kept (later issues add some).

    Raises
    ------
    AgentFailure
        ``BadSpec`` with the offending ``field``.
    """
    if not isinstance(raw, dict):
        raise _bad("spec must be a JSON object", "")
    spec = dict(raw)
    cmd = spec.get("command")
    if not (isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd)):
        raise _bad("command must be a non-empty list of strings", "command")
    env = spec.get("env") or {}
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in env.items())):
        raise _bad("env must map strings to strings", "env")
    spec["env"] = env
    workdir = spec.get("workdir") or payload_dir
    if not isinstance(workdir, str) or not os.path.isdir(workdir):
        raise _bad(f"workdir {workdir!r} is not a directory in the container", "workdir")
    spec["workdir"] = workdir
    spec["healthy_when"] = _validate_healthy(spec.get("healthy_when") or dict(HEALTHY_DEFAULT))
    timeout = spec.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or timeout <= 0):
        raise _bad("timeout_s must be a positive number or null", "timeout_s")
    hang_after = spec.get("hang_after_s")
    if hang_after is not None and not _positive(hang_after):
        raise _bad("hang_after_s must be a positive number or null", "hang_after_s")
    budgets = spec.get("phase_budgets_s") or {}
    if not (isinstance(budgets, dict) and all(isinstance(k, str) and _positive(v)
                                              for k, v in budgets.items())):
        raise _bad("phase_budgets_s must map phase names to positive seconds", "phase_budgets_s")
    spec["phase_budgets_s"] = budgets
    try:  # a count or a list of slots (the slot count is checked where it is known)
        spec["gpus"] = wire.validate_gpu_request(spec.get("gpus"))
    except ValueError as exc:
        raise _bad(str(exc), "gpus") from None
    python = spec.get("python")
    if python is not None and not (isinstance(python, str) and python):
        raise _bad("python must be a path", "python")
    _validate_babysitting(spec)
    name = spec.get("name") or os.path.basename(cmd[0])
    if not isinstance(name, str):
        raise _bad("name must be a string", "name")
    spec["name"] = name
    job_id = spec.get("job_id") or new_job_id(name)
    if not (isinstance(job_id, str) and JOB_ID_RE.fullmatch(job_id)):
        raise _bad(f"job_id {job_id!r} must match {JOB_ID_RE.pattern}", "job_id")
    spec["job_id"] = job_id
    return spec


def _validate_babysitting(spec: dict[str, t.Any]) -> None:
    """``restart``, ``max_duration_s``, ``notify``, ``secrets`` and ``target`` (the babysitting keys)."""
    from remote_payload.agent import jobsecrets

    try:
        spec["restart"] = wire.validate_restart(spec.get("restart"))
    except ValueError as exc:
        raise _bad(str(exc), "restart") from None
    limit = spec.get("max_duration_s")
    if limit is not None and not _positive(limit):
        raise _bad("max_duration_s must be a positive number of seconds or null", "max_duration_s")
    urls = spec.get("notify") or []
    if not (isinstance(urls, list) and all(wire.valid_notify_url(u) for u in urls)):
        raise _bad("notify must be a list of http(s) URLs", "notify")
    spec["notify"] = urls
    names = spec.get("secrets") or []
    if not (isinstance(names, list) and all(jobsecrets.valid_name(n) for n in names)
            and len(set(names)) == len(names)):
        raise _bad("secrets must be a list of distinct environment variable names", "secrets")
    spec["secrets"] = names
    target = spec.get("target")
    if target is not None and not isinstance(target, dict):
        raise _bad("target must be an object {host, ct}", "target")
    try:
        spec[wire.RUN_FIELD] = wire.validate_run(spec.get(wire.RUN_FIELD))
    except ValueError as exc:
        raise _bad(str(exc), wire.RUN_FIELD) from None


def _positive(x: t.Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and 0 < x < float("inf")


def _validate_healthy(hw: t.Any) -> dict[str, t.Any]:
    if not isinstance(hw, dict):
        raise _bad("healthy_when must be an object", "healthy_when")
    kinds = [k for k in ("event", "regex", "started") if k in hw]
    if len(kinds) != 1:
        raise _bad("healthy_when needs exactly one of event, regex, started", "healthy_when")
    if "regex" in hw:
        try:
            re.compile(hw["regex"])
        except (re.error, TypeError) as exc:
            raise _bad(f"healthy_when.regex does not compile: {exc}", "healthy_when.regex") from None
    if "event" in hw and not isinstance(hw["event"], str):
        raise _bad("healthy_when.event must be an event name", "healthy_when.event")
    if "started" in hw and hw["started"] is not True:
        raise _bad("healthy_when.started must be true", "healthy_when.started")
    return dict(hw)


def job_argv(spec: dict[str, t.Any]) -> list[str]:
    """The command with a leading ``python``/``python3`` replaced by ``spec["python"]``."""
    argv = list(spec["command"])
    if spec.get("python") and argv[0] in ("python", "python3"):
        argv[0] = spec["python"]
    return argv


# --- exit records -------------------------------------------------------------


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def final_state(exit_rec: dict[str, t.Any], cancelled: bool) -> JobState:
    """Terminal state from an ``exit_code`` record and the cancel marker."""
    if cancelled:
        return JobState.CANCELLED
    if exit_rec.get("exit_code") == 0 and not exit_rec.get("signal"):
        return JobState.SUCCEEDED
    return JobState.FAILED


# --- /proc ------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, pgrp, starttime_ticks)`` of a process, or None when it is gone
    (:func:`remote_payload.procfs.stat`)."""
    st = procfs.stat(pid)
    return None if st is None else (st.state, st.pgrp, st.start_ticks)


def start_ticks(pid: int) -> int | None:
    st = proc_stat(pid)
    return st[2] if st else None


def proc_alive(pid: int | None, ticks: int | None) -> bool:
    """True when ``pid`` runs, is not a zombie, and (if known) started at ``ticks``."""
    if not pid:
        return False
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return ticks is None or st[2] == ticks


def proc_cmdline(pid: int) -> list[str]:
    return procfs.cmdline(pid)


def group_members(pgid: int | None, min_ticks: int | None = None) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``.

    ``min_ticks`` filters out processes older than the job, so a recycled pgid
    never makes an unrelated process look like part of it.
    """
    if not pgid:
        return []
    pids = []
    for pid in procfs.pids():
        st = proc_stat(pid)
        if st is None or st[1] != pgid or st[0] in ("Z", "X"):
            continue
        if min_ticks is not None and st[2] < min_ticks:
            continue
        pids.append(pid)
    return sorted(pids)


def marked_processes(job_id: str, min_ticks: int | None = None) -> list[int]:
    """Live pids whose environment carries ``OPSCTL_JOB_ID=<job_id>``.

    The wrapper exports it to the job, and every process the job starts inherits it,
    whatever session or process group it moves to (``setsid``, a double fork): that is
    how ``stop`` finds detached children the process group misses. (A process that
    rebuilds its environment from scratch *and* leaves the session is not found; a
    cgroup per job would catch that too.) ``min_ticks`` ignores processes
    older than the job, so a stale marker in an unrelated process never matches.
    """
    needle = f"{JOB_ENV_MARKER}={job_id}".encode()
    me = os.getpid()
    pids = []
    for pid in procfs.pids():
        if pid == me or not procfs.carries(pid, needle):
            continue
        st = proc_stat(pid)
        if st is None or st[0] in ("Z", "X") or (min_ticks is not None and st[2] < min_ticks):
            continue
        pids.append(pid)
    return sorted(pids)


def tree_members(top: int | None, ticks: int | None) -> list[int]:
    """The live processes below the job's first process ``top`` (its pid and its group's
    id), by their parent links, while ``top`` is that very process (started at ``ticks``).

    The job's first process is a child subreaper (:func:`remote_payload.agent.spawn.child_setup`):
    an orphan anywhere below it is re-parented to it, so a process that left the job's
    session, cgroup *and* environment marker (``env -i setsid``, a write to another
    ``cgroup.procs``) is still found here while the job runs.
    """
    if not top or ticks is None or not proc_alive(top, ticks):
        return []
    kids: dict[int, list[int]] = {}
    for pid in procfs.pids():
        st = procfs.stat(pid)
        if st is not None and st.state not in procfs.ENDED_STATES and st.start_ticks >= ticks:
            kids.setdefault(st.ppid, []).append(pid)
    found: list[int] = []
    todo = list(kids.get(top, []))
    while todo and len(found) < MAX_TREE_MEMBERS:
        pid = todo.pop()
        found.append(pid)
        todo += kids.get(pid, [])
    return sorted(found)


#: a job tree larger than this is cut here (the scan stays bounded; the group, the cgroup and
#: the marker still find the rest)
MAX_TREE_MEMBERS = 65536


def marked_by_job(job_ids: t.Collection[str]) -> dict[str, list[int]]:
    """For each of ``job_ids``, the live pids whose environment carries its
    ``OPSCTL_JOB_ID`` marker: one pass over ``/proc`` for all of them (a container may hold
    many job dirs whose records do not parse; :func:`damaged_job_processes`)."""
    wanted = {f"{JOB_ENV_MARKER}={j}".encode(): j for j in job_ids}
    found: dict[str, list[int]] = {j: [] for j in job_ids}
    if not wanted:
        return found
    me = os.getpid()
    for pid in procfs.pids():
        if pid == me:
            continue
        hits = [wanted[v] for v in procfs.environ_entries(pid) if v in wanted]
        if not hits:
            continue
        st = proc_stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        for j in hits:
            found[j].append(pid)
    return found


def damaged_job_processes(root: str, job_ids: t.Collection[str]) -> dict[str, list[int]]:
    """The live processes of jobs whose records do not parse (``status.json`` cut short, a
    spec that is no spec): a job is its processes, not its record, so such a job keeps its GPU
    slots and ``stop`` still ends it while any of them lives.

    Found by what does not need the damaged record: the ``OPSCTL_JOB_ID`` marker, the job's
    own cgroup (``opsctl-jobs/<id>``), and the process group of the ``pid`` record where that
    record still parses and names the job's start time (a pgid without one could be reused).
    """
    marked = marked_by_job(job_ids)
    out: dict[str, list[int]] = {}
    for jid in job_ids:
        pgid, ticks, cgroup = damaged_pid_facts(root, jid)
        out[jid] = sorted(set(marked.get(jid, [])) | set(group_members(pgid, ticks) if ticks
                                                          else [])
                          | set(cgroup_members(cgroup, ticks)))
    return out


def damaged_pid_facts(root: str, job_id: str) -> tuple[int | None, int | None, str | None]:
    """``(pgid, start_ticks, cgroup)`` of a job whose records may not parse: each taken only
    when it has its type (the ``pid`` record is read back, never trusted), and the cgroup only
    when it is this job's own; where the ``pid`` record gives none, the job's cgroup is where
    the wrapper makes it (:func:`job_cgroup_create`)."""
    path = job_dir(root, job_id)
    try:
        rec = _side_record(path, PID, {}) or {}
    except jobrecord.DamagedRecord:
        rec = {}

    def whole(x: t.Any) -> int | None:
        return x if isinstance(x, int) and not isinstance(x, bool) and x > 1 else None

    pgid, ticks = whole(rec.get("pgid")), whole(rec.get("start_ticks"))
    cgroup = rec.get("cgroup")
    if not (_valid_cgroup(cgroup) and os.path.basename(str(cgroup)) == job_id):
        mount = cgroup2_mount()
        cgroup = os.path.join(mount, JOB_CGROUP_PARENT, job_id) if mount else None
    return (pgid if ticks else None), ticks, cgroup


# --- the job's cgroup (where a writable cgroup2 hierarchy exists) ------------------------


def cgroup2_mount() -> str | None:
    """Where the cgroup2 hierarchy is mounted (``/sys/fs/cgroup`` or, hybrid, ``.../unified``)."""
    text = (procfs.read("self", "mountinfo") or b"").decode("utf-8", "replace")
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split(" ")
        if right.split(" ", 1)[0] == "cgroup2" and len(fields) > 4:
            return fields[4]
    return None


def job_cgroup_create(job_id: str) -> str | None:
    """A cgroup for the job's processes: no process can leave it by ``setsid``, a double fork
    or a scrubbed environment. None (the environment marker still applies) where there is no
    writable cgroup2, e.g. a container without cgroup delegation."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    path = os.path.join(mount, JOB_CGROUP_PARENT, job_id)
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
            return None
    except OSError:
        return None
    return path


def _valid_cgroup(path: t.Any) -> bool:
    return isinstance(path, str) and os.path.basename(os.path.dirname(path)) == JOB_CGROUP_PARENT


def cgroup_members(path: str | None, min_ticks: int | None = None) -> list[int]:
    if not _valid_cgroup(path):
        return []
    try:
        pids = [int(x) for x in boundedread.read_regular(
            os.path.join(str(path), "cgroup.procs"), limits.cap("PROC_FILE_BYTES")).split()]
    except (OSError, ValueError):
        return []
    live = []
    for pid in pids:
        st = proc_stat(pid)
        if st is not None and st[0] not in ("Z", "X") and (min_ticks is None or st[2] >= min_ticks):
            live.append(pid)
    return sorted(live)


def cgroup_remove(path: str | None) -> None:
    """Remove the job's cgroup once it is empty (a busy one stays: it holds survivors)."""
    if _valid_cgroup(path):
        with contextlib.suppress(OSError):
            os.rmdir(str(path))


def prune_job_cgroups() -> None:
    """Empty job cgroups left by wrappers that died (rmdir fails on a busy one: kept)."""
    mount = cgroup2_mount()
    parent = os.path.join(mount, JOB_CGROUP_PARENT) if mount else None
    for name in os.listdir(parent) if parent and os.path.isdir(parent) else []:
        cgroup_remove(os.path.join(str(parent), name))


def job_processes(job_id: str, pgid: int | None, min_ticks: int | None,
                  cgroup: str | None = None, seen: t.Mapping[int, int] | None = None
                  ) -> list[int]:
    """Every live process of the job: its process group, its cgroup, the marked ones, every
    process below its first (:func:`tree_members`), and those of ``seen`` ({pid: start
    ticks}: found below it earlier) that still run."""
    return sorted(set(group_members(pgid, min_ticks)) | set(marked_processes(job_id, min_ticks))
                  | set(cgroup_members(cgroup, min_ticks)) | set(tree_members(pgid, min_ticks))
                  | set(still_running(seen)))


def still_running(seen: t.Mapping[int, int] | None) -> list[int]:
    """The pids of ``seen`` ({pid: start ticks}) that are still those very processes."""
    return [p for p, ticks in (seen or {}).items() if proc_alive(p, ticks)]


def remember_tree(seen: dict[int, int], top: int | None, ticks: int | None) -> None:
    """Add the processes below the job's first one to ``seen`` (their start ticks): once that
    first process has ended, its orphans are re-parented away and the tree no longer leads
    to them."""
    for p in tree_members(top, ticks):
        st = start_ticks(p)
        if st is not None:
            seen.setdefault(p, st)


#: How many times one signal step scans the job again for processes it started meanwhile.
SIGNAL_SCANS = 5


def _still_the_jobs(job_id: str, pgid: int | None, min_ticks: int | None,
                    cgroup: str | None) -> t.Callable[[int], bool]:
    """Whether a process is (still) one of the job's: live, started no earlier than the job,
    and in its process group, carrying its marker, or in its cgroup."""
    needle = f"{JOB_ENV_MARKER}={job_id}"

    def check(pid: int) -> bool:
        st = proc_stat(pid)
        if st is None or st[0] in ("Z", "X") or (min_ticks is not None and st[2] < min_ticks):
            return False
        if pgid and st[1] == pgid:
            return True
        if procfs.carries(pid, needle):
            return True
        if not _valid_cgroup(cgroup):
            return False
        try:
            procs = boundedread.read_regular(os.path.join(str(cgroup), "cgroup.procs"),
                                             limits.cap("PROC_FILE_BYTES"))
        except OSError:
            return False
        return str(pid).encode() in procs.split()

    return check


def signal_job(job_id: str, pgid: int | None, min_ticks: int | None, sig: int,
               cgroup: str | None = None, seen: t.Mapping[int, int] | None = None) -> list[int]:
    """Send ``sig`` to each of the job's processes (its group, its marked ones, its cgroup's,
    the tree below its first process and those of ``seen`` still running: see
    :func:`job_processes`); returns those signalled.

    Each one goes through :func:`remote_payload.procgroup.signal_if`: held by a pidfd while it
    is checked to still be the job's, so a number reused since the scan (the job's own group
    number included) is never signalled. No group is signalled by number: the job is scanned
    again for what it started meanwhile, up to :data:`SIGNAL_SCANS` times (a fork loop that
    outruns them gets the escalation's next step). The tree is read before each round of
    signals, so a child that left the job's cgroup and scrubbed its environment is still
    found below the job's first process."""
    still = _still_the_jobs(job_id, pgid, min_ticks, cgroup)
    done: set[int] = set()
    sent: list[int] = []
    for _ in range(SIGNAL_SCANS):
        tree = {p: start_ticks(p) for p in {*tree_members(pgid, min_ticks), *still_running(seen)}}
        new = [p for p in job_processes(job_id, pgid, min_ticks, cgroup, seen) if p not in done]
        if not new:
            break
        done.update(new)

        def check(pid: int, tree: dict[int, int | None] = tree) -> bool:
            return still(pid) or (tree.get(pid) is not None and start_ticks(pid) == tree[pid])

        sent += [p for p in new if procgroup.signal_if(p, sig, check)]
    return sorted(sent)


#: How a job's processes are ended, one rule for every path: ``stop`` sends SIGINT first (the
#: trainer checkpoints on it), then SIGTERM, then SIGKILL; what a job leaves behind after
#: it exited, or after its pane went away, gets SIGTERM then SIGKILL.
Escalation = tuple[tuple[signal.Signals, float], ...]
LEFTOVERS_PLAN: Escalation = ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0))
KILL_WAIT_S = 5.0


def stop_plan(grace_s: float, kill_after_s: float) -> Escalation:
    return ((signal.SIGINT, grace_s), (signal.SIGTERM, kill_after_s), (signal.SIGKILL, KILL_WAIT_S))


def escalate(job_id: str, pgid: int | None, min_ticks: int | None, cgroup: str | None,
             plan: Escalation) -> tuple[list[str], list[int]]:
    """Signal the job's processes step by step until none is left: ``(signals sent, survivors)``.

    The one implementation of the INT/TERM/KILL escalation (``stop``, and the wrapper's
    clean-up after the job exits or its pane goes away); an empty cgroup is removed.
    """
    sent: list[str] = []
    seen: dict[int, int] = {}  # found below the job's first process: kept after it ended
    for sig, wait_s in plan:
        remember_tree(seen, pgid, min_ticks)
        if not signal_job(job_id, pgid, min_ticks, sig, cgroup, seen):
            break
        sent.append(sig.name)

        def gone() -> bool:
            remember_tree(seen, pgid, min_ticks)
            return not job_processes(job_id, pgid, min_ticks, cgroup, seen)

        wait_until(gone, wait_s, 0.05)
    left = job_processes(job_id, pgid, min_ticks, cgroup, seen)
    if not left:
        cgroup_remove(cgroup)
    return sent, left


def catches_signal(pid: int, signum: int) -> bool:
    """Whether the process installed a handler for ``signum`` (``SigCgt`` in /proc status)."""
    try:
        return bool(int(procfs.status(pid).get("SigCgt", "0"), 16) >> (signum - 1) & 1)
    except ValueError:
        return False


def is_python(pid: int) -> bool:
    exe_link = procfs.link(pid, "exe")
    if exe_link is not None:
        exe = os.path.basename(exe_link)
    else:
        argv = proc_cmdline(pid)
        exe = os.path.basename(argv[0]) if argv else ""
    return exe.startswith("python")


def wait_until(pred: t.Callable[[], bool], timeout_s: float, interval_s: float = 0.01) -> bool:
    """Poll ``pred`` until true or ``timeout_s``; returns the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


# --- file tails ----------------------------------------------------------------


def read_tail_bytes(path: str, max_bytes: int) -> tuple[bytes, int, bool]:
    """Last ``max_bytes`` of a file: ``(data, file_size, starts_at_file_start)``; a link, a
    FIFO or a device in the job dir is no file of the job's (empty, never waited on)."""
    try:
        return boundedread.read_tail(path, max_bytes)
    except FileNotFoundError:
        return b"", 0, True
    except boundedread.Refused:
        return b"", 0, True


def tail_lines(path: str, n: int) -> tuple[list[str], int]:
    """Last ``n`` lines of a log as a terminal shows them (text after the last ``\\r``)."""
    if n <= 0:
        return [], read_tail_bytes(path, 0)[1]
    want = max(8192, n * 256)
    while True:
        data, size, whole = read_tail_bytes(path, want)
        if whole or data.count(b"\n") > n or want >= 4 * 2**20:
            break
        want *= 4
    lines = data.decode("utf-8", "replace").split("\n")
    if not whole:
        lines = lines[1:]  # the first one is cut
    if lines and lines[-1] == "":
        lines.pop()
    return [ln.rstrip("\r").rsplit("\r", 1)[-1] for ln in lines[-n:]], size


def tail_events(path: str, n: int) -> list[dict[str, t.Any]]:
    import json

    if n <= 0:
        return []
    data, _, whole = read_tail_bytes(path, max(16384, n * 1024))
    rows = data.split(b"\n")
    if not whole:
        rows = rows[1:]
    events = []
    for row in rows:
        if row.strip():
            try:
                events.append(json.loads(row))
            except ValueError:
                continue
    return events[-n:]


# --- reconcile -------------------------------------------------------------------


class JobRecord(t.NamedTuple):
    """What the job dir says, checked against /proc."""

    job_id: str
    path: str
    spec: dict[str, t.Any]
    launch: dict[str, t.Any]
    status: dict[str, t.Any]  # status.json with the reconciled state folded in
    pid: dict[str, t.Any]
    exit: dict[str, t.Any] | None
    state: JobState
    alive: bool
    evidence: list[str]


def load(root: str, job_id: str) -> JobRecord:
    """Read a job dir and reconcile its state (persisting LOST/CANCELLED when the wrapper is gone).

    The evidence also says why a job was cancelled (``replaced by job …``) and when the
    disk it writes to is full (a clear diagnosis instead of a crash).
    """
    rec = _reconcile(root, job_id)
    extra = []
    if rec.state == JobState.CANCELLED:
        reason = cancel_reason(rec.path)
        if reason and not any(reason in e for e in rec.evidence):
            extra.append(f"cancelled: {reason}")
    disk = disk_full_evidence(rec.path)
    if disk:
        extra.append(disk)
    return rec._replace(evidence=[*rec.evidence, *extra]) if extra else rec


def _terminal(status: t.Mapping[str, t.Any]) -> bool:
    try:
        return JobState(status.get("state", JobState.PENDING.value)).is_terminal()
    except ValueError:
        return False


def _reconcile(root: str, job_id: str) -> JobRecord:
    path = job_dir(root, job_id)
    spec = jobrecord.read_spec(path)  # DamagedRecord: the callers set the job dir aside
    launch = _side_record(path, LAUNCH, {}) or {}
    status = jobrecord.read_status(path, {}) or {}  # none yet: a launch is writing the dir
    pid = _side_record(path, PID, {}) or {}
    exit_rec = _side_record(path, EXIT_CODE, None)
    if not (spec or launch or status or pid or exit_rec is not None):
        # none of the records a launch writes first: a launch still writing it (moments), or
        # a directory opsctl never made (a user's, under a jobs/ that is theirs too): never
        # taken for a job, never written into
        try:
            made = os.stat(path).st_mtime
        except OSError:
            made = time.time()
        if time.time() - made >= PENDING_GRACE_S:
            raise jobrecord.DamagedRecord(path, NOT_A_JOB_DIR)
    state = JobState(status.get("state", JobState.PENDING.value))
    evidence = list(status.get("evidence") or [])

    def record(st: JobState, alive: bool, ev: list[str]) -> JobRecord:
        return JobRecord(job_id, path, spec, launch, status, pid, exit_rec, st, alive, ev)

    if state.is_terminal():
        return record(state, proc_alive(pid.get("pid"), pid.get("start_ticks")), evidence)
    if state == JobState.QUEUED:  # no process yet; it waits in the queue (it never expires)
        return record(state, False, evidence)
    cancelled = os.path.exists(os.path.join(path, CANCEL))
    if not pid:
        # the wrapper has not recorded a start yet (launch waits for it)
        age = time.time() - float(launch.get("created_at") or time.time())
        crashed = os.path.exists(os.path.join(path, WRAPPER_ERROR))
        if age < PENDING_GRACE_S and not crashed:
            return record(state, False, evidence)
        return _persist(record(state, False, evidence), JobState.LOST, [
            f"the wrapper recorded no start within {PENDING_GRACE_S:g}s of launch",
            *_lost_evidence(path, pid, launch)])
    wrapper_ok = _wrapper_alive(pid, path)
    child_ok = proc_alive(pid.get("pid"), pid.get("start_ticks"))
    if exit_rec is None and wrapper_ok and not child_ok and not status.get("restarting"):
        # the child just died and the wrapper is recording it: the first status
        # after a crash must already say FAILED, so wait for the record briefly
        exit_path = os.path.join(path, EXIT_CODE)
        wait_until(lambda: os.path.exists(exit_path), EXIT_RECORD_WAIT_S)
        exit_rec = read_json(exit_path)
        status = _status_or(path, status)
        state = JobState(status.get("state", state.value))
        evidence = list(status.get("evidence") or [])
        if state.is_terminal():
            return record(state, False, evidence)
    if exit_rec is not None:
        # the wrapper recorded the exit but not yet the final status.json: it writes that
        # next, with the evidence of the end (leftovers reaped, why), so wait for it briefly
        # rather than report the end without its evidence
        if wrapper_ok:
            wait_until(lambda: _terminal(_status_or(path, {})), EXIT_RECORD_WAIT_S)
            status = _status_or(path, status)
            if _terminal(status):
                return record(JobState(status["state"]), False, list(status.get("evidence") or []))
        return record(final_state(exit_rec, cancelled), False, evidence)
    if wrapper_ok:
        return record(state, True, evidence)
    if child_ok:
        return record(state, True, [*evidence, f"wrapper pid {pid.get('wrapper_pid')} is gone "
                                    f"but job pid {pid.get('pid')} still runs; its output is "
                                    "no longer recorded"])
    why = _lost_evidence(path, pid, launch)
    if cancelled:
        return _persist(record(state, False, evidence), JobState.CANCELLED,
                        [*why, "cancel was requested; the exit status is unknown"])
    return _persist(record(state, False, evidence), JobState.LOST, why)


def _side_record(path: str, name: str, default: t.Any) -> t.Any:
    """``launch.json``, ``pid``, ``exit_code`` of a job dir, read back (bounded, never a FIFO).

    Raises:
        jobrecord.DamagedRecord: it does not parse, or is no JSON object.
    """
    where = os.path.join(path, name)
    try:
        doc = read_json(where, default)
    except (ValueError, OSError) as exc:
        raise jobrecord.DamagedRecord(where, str(exc)[:200]) from None
    if doc is not None and doc is not default and not isinstance(doc, dict):
        raise jobrecord.DamagedRecord(where, "not a JSON object")
    return doc


def _status_or(path: str, previous: dict[str, t.Any]) -> dict[str, t.Any]:
    """The job's status.json read again (the wrapper rewrites it); ``previous`` when there is
    none or it does not parse (the wrapper writes with rename: that is a moment's state)."""
    try:
        return jobrecord.read_status(path, previous) or previous
    except jobrecord.DamagedRecord:
        return previous


def _wrapper_alive(rec: dict[str, t.Any], path: str) -> bool:
    wpid = rec.get("wrapper_pid")
    if not proc_alive(wpid, rec.get("wrapper_start_ticks")):
        return False
    # pid and start time match; the cmdline names the job dir (belt and braces)
    return any(path in a for a in proc_cmdline(int(wpid))) if wpid else False


def _lost_evidence(path: str, pid: dict[str, t.Any], launch: dict[str, t.Any]) -> list[str]:
    why = []
    if pid:
        why.append(f"wrapper pid {pid.get('wrapper_pid')} is gone")
        why.append(f"job pid {pid.get('pid')} (pgid {pid.get('pgid')}) is gone")
    else:
        why.append("the wrapper never recorded a job pid")
    why.append(f"no {EXIT_CODE} file in {path}")
    try:
        tail = boundedread.read_tail(os.path.join(path, WRAPPER_ERROR), 1 << 16)[0]
        last = tail.decode("utf-8", "replace").strip().splitlines()[-1:]
        why.append(f"the wrapper crashed: {last[0] if last else '?'} (see {WRAPPER_ERROR})")
    except OSError:
        pass
    hup = read_json(os.path.join(path, HANGUP))
    if hup:
        why.append(f"wrapper got SIGHUP at {hup.get('at')}: {hup.get('why')}")
    if launch.get("tmux_session"):
        why.append(f"tmux session {launch['tmux_session']} on socket "
                   f"{launch.get('tmux_socket')} was its home")
    return why


def _persist(rec: JobRecord, new: JobState, why: list[str]) -> JobRecord:
    """Record a terminal state decided by the agent (the wrapper is gone; nobody else writes)."""
    if not wire.can_transition(rec.state, new):
        return rec._replace(evidence=why)
    now = time.time()
    status = dict(rec.status)
    status["state"] = new.value
    status["ended_at"] = status.get("ended_at") or now
    status["evidence"] = why
    status["transitions"] = [*status.get("transitions", []), [new.value, now, "reconciled by agent"]]
    try:
        write_json_atomic(os.path.join(rec.path, STATUS), status)
    except OSError as exc:  # a full disk: the answer is still right, only not persisted yet
        if not is_disk_full(exc):
            raise
    from remote_payload.agent import jobsecrets

    jobsecrets.remove(rec.path)  # the wrapper that would have removed them is gone
    if new == JobState.LOST and rec.spec.get("notify"):
        from remote_payload.agent import notify

        doc = notify.body(notify.EVENT_LOST, spec=rec.spec, status=status,
                          diagnosis=why[0] if why else None)
        notify.notify_lost(rec.path, rec.spec["notify"], doc)
    return rec._replace(status=status, state=new, alive=False, evidence=why)
