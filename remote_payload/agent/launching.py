"""Starting a job: the steps ``launch`` and a start from the queue share.

The job dir's files (:func:`write_launch_files`), the wrapper in its tmux session
(:func:`start_wrapper`), the launch checks (GPU preflight, doctor rows, torch build), and the
GPU slots a job gets (:func:`gpu_request`, :func:`slot_conflicts`, :func:`set_slots`; the
rules are :mod:`remote_payload.agent.jobqueue`'s). :func:`start_queued` starts a queued job
through these same steps, so notify, restart policy, time limit and preflight apply as for
any launch; :func:`advance_queue` is what ``launch``, the queue verbs, ``status``/``jobs``
and each job's wrapper call to move the queue on.
"""

from __future__ import annotations

import os
import sys
import time
import typing as t

from remote_payload import wire
from remote_payload.agent import jobqueue as queue
from remote_payload.agent import jobstore as jobs
from remote_payload.agent.common import AgentFailure, read_json, write_json_atomic
from remote_payload.wire import ErrorType, JobState

LAUNCH_WAIT_S = 5.0


def write_launch_files(path: str, spec: dict[str, t.Any], *, socket: str, payload: str,
                       replaced: str | None, secrets: t.Any, check: dict[str, t.Any] | None,
                       state: JobState = JobState.PENDING, rank: float | None = None) -> None:
    """Write a new job's spec, launch facts, first status (PENDING, or QUEUED for the queue,
    with its ``rank``: its place in the queue) and output log; a failure (a full disk) leaves
    no half-made job dir behind."""
    from remote_payload.agent import gpus, tmux

    now = time.time()
    job_id = spec["job_id"]
    try:
        write_json_atomic(os.path.join(path, jobs.SPEC), spec, mode=jobs.PRIVATE_MODE)
        write_json_atomic(os.path.join(path, jobs.LAUNCH), mode=jobs.PRIVATE_MODE, obj={
            "created_at": now, "tmux_socket": socket, "tmux_session": tmux.session_name(job_id),
            "payload_dir": payload, "argv": jobs.job_argv(spec), "agent_python": sys.executable,
            "base_env": base_env(), "replaced": replaced,
        })
        status: dict[str, t.Any] = {
            "job_id": job_id, "name": spec["name"], "state": state.value,
            "created_at": now, "healthy": False,
            "transitions": [[state.value, now, "launched" if state == JobState.PENDING
                             else "queued"]],
        }
        if rank is not None:
            status[queue.RANK] = rank
        write_json_atomic(os.path.join(path, jobs.STATUS), status)
        open(os.path.join(path, jobs.OUTPUT), "ab").close()
        if secrets:
            from remote_payload.agent import jobsecrets

            jobsecrets.store(path, secrets)
        if check is not None:
            write_json_atomic(os.path.join(path, gpus.PREFLIGHT_FILE), check)
    except OSError:  # e.g. a full disk: no half-made job dir is left to look PENDING forever
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        raise


def start_wrapper(root: str, path: str, spec: dict[str, t.Any], socket: str) -> None:
    """Start the job's wrapper in its tmux session and wait for its first state.

    Raises:
        AgentFailure: ``TmuxFailed`` or ``LaunchFailed`` (the job is then FAILED or LOST).
    """
    from remote_payload.agent import tmux

    job_id = spec["job_id"]
    session = tmux.session_name(job_id)
    payload = (read_json(os.path.join(path, jobs.LAUNCH), {}) or {}).get("payload_dir") \
        or payload_dir()
    jobs.prune_job_cgroups()  # empty ones of wrappers that died
    wrapper_argv = ["env", f"PYTHONPATH={payload}", sys.executable, "-m",
                    "remote_payload.agent.wrapper", path]
    try:
        for dead in tmux.dead_sessions(socket):  # finished jobs' panes; their output.log stays
            tmux.kill_session(socket, dead)
        tmux.start_session(socket, session, wrapper_argv, cwd=spec["workdir"])
    except tmux.TmuxError as exc:
        fail_launch(path, f"tmux refused to start the session: {exc.stderr}")
        raise AgentFailure(ErrorType.TmuxFailed, str(exc), job_id=job_id, socket=socket) from None

    started = jobs.wait_until(lambda: wrapper_started(path), LAUNCH_WAIT_S)
    if not started:
        pane = tmux.PaneCapture(socket, session, 30).result()
        fail_launch(path, f"the wrapper recorded no start within {LAUNCH_WAIT_S:g}s")
        raise AgentFailure(ErrorType.LaunchFailed,
                           f"job {job_id}: the wrapper did not start within {LAUNCH_WAIT_S:g}s",
                           job_id=job_id, pane_tail=pane)
    rec = jobs.load(root, job_id)
    if rec.state == JobState.LOST:  # the wrapper crashed before starting the job
        pane = tmux.PaneCapture(socket, session, 30).result()
        raise AgentFailure(ErrorType.LaunchFailed, f"job {job_id}: the wrapper crashed",
                           job_id=job_id, evidence=rec.evidence, pane_tail=pane)


def refuse_busy_gpus(check: dict[str, t.Any], force: bool) -> None:
    """GpusBusy with doctor's ``leftover-gpu-processes`` row (one definition of the check)."""
    if check["busy"] and not force:
        from remote_payload.agent import doctor

        row = doctor.leftovers_row(check)
        raise AgentFailure(ErrorType.GpusBusy, f"GPUs this job needs are in use: {row['evidence']}",
                           busy=check["busy"], needed=check["needed"], row=row)


def refuse_failing_rows(root: str, needed: list[int] | None, force: bool) -> list[dict[str, str]]:
    """The launch's doctor rows (device nodes, /dev/shm, free disk); the first failing one
    refuses the launch unless ``force`` (deploy --force)."""
    from remote_payload.agent import doctor

    rows = doctor.launch_rows(root, needed)
    bad = [r for r in rows if r["status"] == "fail"]
    if bad and not force:
        row = bad[0]
        raise AgentFailure(ErrorType.PreflightFailed,
                           f"doctor check {row['name']} failed: {row['reason']}"
                           + (f" [{row['evidence']}]" if row["evidence"] else "")
                           + (f"; fix: {row['fix']}" if row["fix"] else ""),
                           row=row, rows=bad)
    return rows


def torch_build(root: str) -> tuple[dict[str, str], str | None]:
    """Cache env vars and python of the current torch build (docs/contracts.md).

    Raises
    ------
    AgentFailure
        ``TorchEnvError`` when a build exists but cannot be read: running the job
        on another torch or without its compile cache would hide the problem.
    """
    import importlib

    try:
        torchenv = importlib.import_module("remote_payload.agent.torchenv")
    except ModuleNotFoundError as exc:
        if exc.name == "remote_payload.agent.torchenv":  # not shipped: plain python jobs only
            return {}, None
        raise
    try:
        return dict(torchenv.job_env(root)), torchenv.current_python(root)
    except Exception as exc:
        raise AgentFailure(ErrorType.TorchEnvError, f"cannot read the current torch build under {root}: "
                           f"{type(exc).__name__}: {exc}", root=root) from None


def bind_to_payload(root: str, workdir: str) -> str:
    """A workdir inside ``<root>/payload`` (a symlink the next deploy switches) becomes the
    resolved ``payloads/<digest>`` dir, so the job keeps the code it started with."""
    link = os.path.join(root, "payload")
    if workdir == link or workdir.startswith(link + os.sep):
        return os.path.realpath(workdir)
    return workdir


def payload_dir() -> str:
    """The directory holding the ``remote_payload`` package the agent runs from, resolved
    (``payloads/<digest>``, not the ``payload`` symlink): a job and its wrapper are bound
    to the code they started with, and the payload store keeps it while they live."""
    import remote_payload

    return os.path.dirname(os.path.dirname(os.path.realpath(remote_payload.__file__)))


def base_env() -> dict[str, str]:
    """The job's starting env: the agent's (what `pct exec` gives), minus tmux and our PYTHONPATH."""
    drop = {"TMUX", "TMUX_PANE", "PYTHONPATH", wire.ENV_TMUX_SOCKET}
    return {k: v for k, v in os.environ.items() if k not in drop}


def fail_launch(path: str, why: str) -> None:
    now = time.time()
    status = read_json(os.path.join(path, jobs.STATUS), {}) or {}
    status.update(state=JobState.FAILED.value, ended_at=now, evidence=[why])
    status["transitions"] = [*status.get("transitions", []), [JobState.FAILED.value, now, why]]
    write_json_atomic(os.path.join(path, jobs.STATUS), status)


def wrapper_started(path: str) -> bool:
    """The wrapper wrote its first state (after the pid file) or an exit record."""
    if os.path.exists(os.path.join(path, jobs.EXIT_CODE)) or os.path.exists(
            os.path.join(path, jobs.WRAPPER_ERROR)):
        return True
    st = read_json(os.path.join(path, jobs.STATUS), {}) or {}
    return bool(st.get("state", JobState.PENDING.value) != JobState.PENDING.value)


# --- GPU slots (the rules are remote_payload/agent/jobqueue.py's) ----------------------------


def gpu_request(spec: dict[str, t.Any], slots: int | None) -> wire.GpuRequest:
    """The spec's ``gpus`` checked against the container's slot count.

    Raises:
        AgentFailure: ``BadSpec`` (a count with no known slot count, an index past it).
    """
    request = spec.get("gpus")
    if isinstance(request, int) and not isinstance(request, bool) and not slots:
        raise AgentFailure(ErrorType.BadSpec, f"gpus {request}: a count needs the container's GPU "
                           "count; set `gpus:` for this container in the inventory", field="gpus")
    try:
        return wire.validate_gpu_request(request, slots or None)
    except ValueError as exc:
        raise AgentFailure(ErrorType.BadSpec, str(exc), field="gpus") from None


def slot_conflicts(request: wire.GpuRequest, total: int, holders: dict[str, t.Any]
                    ) -> tuple[bool, list[int] | None, list[str]]:
    """``(fits, slots it gets, live jobs in its way)``; an unknown slot count takes a list as is."""
    if isinstance(request, list) and not total:
        total = wire.MAX_GPU_SLOTS
    fits, got = queue.assign(request, total, holders)
    if fits:
        return True, got, []
    want = list(range(request)) if isinstance(request, int) else request
    return False, None, [j for j, h in holders.items() if queue.conflicts(want, h)]


def set_slots(spec: dict[str, t.Any], got: list[int] | None, request: wire.GpuRequest) -> None:
    """Record the job's slots in its spec and give it ``CUDA_VISIBLE_DEVICES`` (its slots)."""
    spec["gpus"] = request
    spec["gpu_slots"] = got
    if got is not None:
        spec["env"] = {**spec["env"], "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in got)}


def holder_state(root: str, job_id: str) -> str:
    """A live job's state for a refusal; a job whose records do not parse still runs (it holds
    its slots: :func:`remote_payload.agent.jobqueue.damaged_holders`) and is named so."""
    from remote_payload.agent import jobrecord

    try:
        return jobs.load(root, job_id).state.value
    except jobrecord.DamagedRecord as exc:
        return f"running with a damaged record ({exc.path}: {exc.reason})"


def in_the_way_message(root: str, first: str, request: wire.GpuRequest) -> str:
    state = holder_state(root, first)
    if request is None:
        return f"job {first} is {state}; stop it or launch with --replace"
    return (f"job {first} is {state} on GPUs this job needs ({request}); stop it, launch with "
            "--replace, or queue this job (`opsctl queue add`)")


def opsctl_job_pids(root: str, holders: t.Iterable[str]) -> list[int]:
    """The processes of opsctl's live jobs: never leftovers for the GPU preflight."""
    pids: list[int] = []
    for jid in holders:
        try:
            rec = jobs.load(root, jid)
        except (AgentFailure, ValueError, OSError):
            continue
        pids += jobs.job_processes(jid, rec.pid.get("pgid"), rec.pid.get("start_ticks"),
                                   rec.pid.get("cgroup"))
    return pids


def start_queued(root: str, job_id: str, slots: list[int] | None, socket: str) -> None:
    """Start a queued job on ``slots`` (``queue.advance`` holds the queue lock): the launch
    path of ``launch`` from the preflight on, so notify, restart, limits and checks apply.

    Raises:
        AgentFailure: the preflight refused (``GpusBusy``, ``PreflightFailed``), the torch
            build is unreadable, or the wrapper did not start.
    """
    from remote_payload.agent import gpus, jobrecord

    path = jobs.job_dir(root, job_id)
    try:  # a job starts only from QUEUED: never twice, never one that ended or runs
        status = jobrecord.read_status(path)
        queued = status is not None and status["state"] == JobState.QUEUED.value
        spec = jobrecord.read_queued_spec(path) if queued else {}
    except jobrecord.DamagedRecord as exc:
        raise AgentFailure(ErrorType.QueueRefused, f"job {job_id}: {exc}; not started",
                           job_id=job_id, why="damaged record") from None
    if status is None or status["state"] != JobState.QUEUED.value \
            or not wire.can_transition(JobState.QUEUED, JobState.PENDING):
        state = status["state"] if status is not None else None
        raise AgentFailure(ErrorType.QueueRefused, f"job {job_id} is {state}, not QUEUED; "
                           "not started", job_id=job_id, state=state, why="not queued")
    need = spec.get("torch_build")
    if need is not None:  # its playbook's torch: (advance started it only with nothing live)
        switch_build(root, need, job_id)
    build_env, build_python = torch_build(root)  # the build current when it starts
    spec["env"] = {**build_env, **(spec.get("env") or {})}
    if build_python and not spec.get("python"):
        spec["python"] = build_python
    set_slots(spec, slots, spec.get("gpus"))
    holders = queue.live_holders(root)
    needed = gpus.needed_gpus(spec)
    check = gpus.preflight(needed, opsctl_job_pids(root, holders))
    refuse_busy_gpus(check, False)
    check["rows"] = refuse_failing_rows(root, needed, False)
    check["forced"] = False
    now = time.time()
    launch_rec = read_json(os.path.join(path, jobs.LAUNCH), {}) or {}
    launch_rec.update(created_at=now, argv=jobs.job_argv(spec))
    status.pop(queue.RANK, None)
    status.update(state=JobState.PENDING.value, started_from_queue_at=now)
    status["transitions"] = [*(status.get("transitions") or []),
                             [JobState.PENDING.value, now, "started from the queue"]]
    write_json_atomic(os.path.join(path, jobs.SPEC), spec, mode=jobs.PRIVATE_MODE)
    write_json_atomic(os.path.join(path, jobs.LAUNCH), launch_rec, mode=jobs.PRIVATE_MODE)
    write_json_atomic(os.path.join(path, gpus.PREFLIGHT_FILE), check)
    write_json_atomic(os.path.join(path, jobs.STATUS), status)
    jobs.set_current_job(root, job_id)
    start_wrapper(root, path, spec, launch_rec.get("tmux_socket") or socket)


def switch_build(root: str, build: str, job_id: str) -> None:
    """Make ``build`` (installed by ``queue add``) the current torch build for a queued job.

    Raises:
        AgentFailure: ``TorchEnvError`` when it is not installed (any more), ``TorchEnvBusy``
            when a swap runs.
    """
    from remote_payload.agent.torchenv import layout as tl

    lay = tl.Layout(root)
    if not queue.wire_build_ok(build) or build not in tl.list_builds(lay):
        raise AgentFailure(ErrorType.TorchEnvError, f"torch build {build!r} that job {job_id} "
                           "needs is not installed in the container (`opsctl envs`)", root=root)
    with tl.locked(lay):
        previous = tl.current_build(lay)
        if previous == build:
            return
        tl.switch_current(lay, build)
        tl.append_history(lay, {"time": time.time(), "from": previous, "to": build,
                                "action": "switch", "result": "ok", "log_path": None,
                                "seconds": 0.0, "by": f"queue: job {job_id}"})


def advance_queue(root: str, socket: str, *, slots: int | None = None,
                  blocking: bool = True) -> dict[str, t.Any]:
    """``queue.advance`` with this module's start path; ``blocking=False`` (``status``,
    ``jobs``): skip when another process holds the queue lock (it is advancing already)."""
    return queue.advance(root, lambda jid, got: start_queued(root, jid, got, socket),
                         slots=slots, blocking=blocking)
