"""``opsctl deploy``: ship the payload, make the torch build and cache current, launch, watch.

One path, decided by the playbook alone:

1. payload: shipped first when ``--force-payload`` or when the playbook has torch work (a
   ``torch:`` build or a ``cache:`` policy) — that work runs agent verbs from the payload;
2. torch work (:func:`_prepare_torch`), only when the playbook asks for it; then the
   playbook's ``files:`` (:mod:`.files`; rsync sends only what changed);
3. launch. When the payload was not shipped in step 1 the launch carries its digest and
   the agent refuses a different installed payload, so an unchanged re-deploy is one round
   trip; a refusal ships the payload and launches again (nothing was touched), and so does
   an installed agent of another digest that cannot answer at all (it fails at import).
4. watch until healthy (or terminal, or the playbook's ``timeout_s``).
"""

from __future__ import annotations

import json
import time
import typing as t
from dataclasses import dataclass, field

from opsctl.config import playbook as playbook_mod
from opsctl.config.inventory import HostSpec
from opsctl.config.playbook import Playbook
from opsctl.errors import (
    AgentError,
    ConfigError,
    Interrupted,
    JobFailed,
    JobUnhealthy,
    OpsctlError,
    RemoteCommandFailed,
)
from opsctl.ops import torch as torch_ops
from opsctl.ops import watch
from opsctl.ops.jobs import Target
from opsctl.remote.agent_client import NoPayload, PayloadResult
from opsctl.state import last_target as target_mod
from remote_payload import procgroup, wire
from remote_payload.wire import ErrorType, JobState
from remote_payload.wire_shapes import StatusDoc

Progress = t.Callable[[str], None]


def default_playbook(spec: HostSpec, ctid: int) -> str:
    """The container's ``playbook:`` from the inventory (what the bundled trainer runs there).

    Raises:
        ConfigError: the inventory names no playbook for that container.
    """
    container = spec.target_spec(ctid)
    if container is None or container.playbook is None:
        names = ", ".join(playbook_mod.available_names())
        field = "target.playbook" if spec.direct else f"containers.{ctid}.playbook"
        raise ConfigError(f"no --playbook given and the inventory names none for "
                          f"{spec.target_label(ctid)}", hint=f"pass --playbook (available: "
                                                             f"{names}) or set {field} in the inventory")
    return container.playbook


def load_playbook(tgt: Target, name: str | None) -> Playbook:
    """``--playbook`` (a path or a name), else the container's ``playbook:`` in the inventory.

    Raises:
        ConfigError: no such playbook, an invalid one, or none named for the container.
    """
    return playbook_mod.load(name if name is not None else default_playbook(tgt.host, tgt.ctid))


def needs_torch_work(book: Playbook) -> bool:
    """Whether :func:`_prepare_torch` has remote work for ``book`` (it checks the same fields)."""
    return book.torch is not None or book.cache in ("clear", "seed")


@dataclass
class DeployReport:
    target: str
    job_id: str
    playbook: str
    payload: PayloadResult
    outcome: str  # healthy | terminal | timeout | launched
    status: StatusDoc
    elapsed_s: float
    steps: list[dict[str, t.Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, t.Any]:
        return {
            "target": self.target, "job_id": self.job_id, "playbook": self.playbook,
            "payload": self.payload.__dict__, "outcome": self.outcome,
            "elapsed_s": round(self.elapsed_s, 3), "steps": self.steps,
            "status": self.status,
        }


def collect_secrets(book: Playbook, env_file: str | None = None,
                    environ: t.Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the playbook's ``secrets``: from ``env_file`` first, else the environment.

    Raises:
        ConfigError: a secret is in neither, or too short to redact (the name, never the value).
    """
    import os

    from opsctl.config import envfile

    environ = os.environ if environ is None else environ
    from_file = envfile.load(env_file) if env_file is not None else {}
    values, missing = {}, []
    for name in book.secrets:
        value = from_file.get(name, environ.get(name))
        if value is None:
            missing.append(name)
            continue
        if len(value.encode()) < wire.SECRET_MIN_LEN or "\0" in value:
            raise ConfigError(f"playbook {book.name}: secret {name} is shorter than "
                              f"{wire.SECRET_MIN_LEN} bytes (or has a NUL byte): too short to "
                              "redact from the job's output")
        values[name] = value
    for name, value in book.credential_env().items():  # the playbook's own value, routed
        if len(value.encode()) < wire.SECRET_MIN_LEN or "\0" in value:
            raise ConfigError(f"playbook {book.name}: env {name} holds a credential, which is "
                              f"sent as a secret, and is shorter than {wire.SECRET_MIN_LEN} "
                              "bytes (or has a NUL byte): too short to redact from the job's "
                              "output", hint="a credential this short cannot be masked: use a "
                              f"longer one, or leave {name} out of env")
        values[name] = value
    if missing:
        where = f"--env-file {env_file} or the environment" if env_file else "the environment"
        raise ConfigError(f"playbook {book.name}: secret(s) {', '.join(missing)} not set in {where}",
                          hint="export them (or put NAME=value lines in a file for --env-file)")
    return values


def deploy(tgt: Target, book: Playbook, *, replace: bool = False, wait: bool = True,
           poll_s: float = watch.DEFAULT_POLL_S, on_update: watch.OnUpdate | None = None,
           on_step: Progress | None = None, force_payload: bool = False,
           force_gpus: bool = False, secrets: dict[str, str] | None = None) -> DeployReport:
    """Ship the payload, prepare the torch env, launch, and watch until healthy or failed.

    ``secrets``: the playbook's secret values (:func:`collect_secrets`, read before anything
    remote happens); they go to the agent on stdin only.

    Raises:
        JobFailed: the job ended FAILED/CANCELLED/LOST before becoming healthy.
        JobUnhealthy: still not healthy after the playbook's ``timeout_s``.
        Interrupted: Ctrl-C, SIGTERM or SIGHUP; says what was already done, and how to stop
            a job it launched.
        (and transport/container/agent errors from the steps)
    """
    start = time.monotonic()
    steps, step = step_recorder(on_step)

    def ship(force: bool) -> PayloadResult:
        step("payload")
        result = tgt.agent.ensure_payload(force=force)
        step("payload-done", sent=result.sent, digest=result.digest[:12])
        return result

    job_id = book.new_job_id()
    if secrets is None:
        secrets = collect_secrets(book)
    spec = book.job_spec(job_id, root=tgt.host.root, replace=replace,
                         notify=tgt.host.notify_urls(tgt.ctid),
                         target={"host": tgt.host.label, "ct": tgt.ctid})
    try:
        status, pay = _ship_and_launch(tgt, book, spec, step, steps, ship, replace=replace,
                                       force_payload=force_payload, on_step=on_step,
                                       force_gpus=force_gpus, secrets=secrets)
    except (KeyboardInterrupt, procgroup.Terminated) as exc:
        raise interrupted_deploy(tgt, job_id, steps, signum_of(exc)) from None
    target_mod.save(target_mod.LastTarget(tgt.name, tgt.ctid, job_id,
                                          address=tgt.host.ssh_label()))
    outcome = "launched"
    if wait:
        step("watch")
        try:
            result = watch.wait(tgt.agent, job_id, until="healthy", timeout_s=book.timeout_s,
                                poll_s=poll_s, on_update=on_update)
        except (KeyboardInterrupt, procgroup.Terminated) as exc:
            signum = signum_of(exc)
            raise Interrupted(f"{tgt.label}: deploy {how(signum)} while watching: job {job_id} "
                              "was launched and keeps running; to stop it: "
                              f"{stop_command(tgt, job_id)}",
                              hint=f"opsctl status  ·  {stop_command(tgt, job_id)}",
                              signum=signum) from None
        status, outcome = result.status, result.reason
    if status["state"] in (JobState.FAILED, JobState.LOST) or outcome == "timeout":
        status = with_host_events(tgt, status)
    report = DeployReport(tgt.label, job_id, book.name, pay, outcome, status,
                          time.monotonic() - start, steps)
    check_outcome(report)
    return report


def _ship_and_launch(tgt: Target, book: Playbook, spec: dict[str, t.Any],
                     step: t.Callable[..., None], steps: list[dict[str, t.Any]],
                     ship: t.Callable[[bool], PayloadResult], *, replace: bool,
                     force_payload: bool, on_step: Progress | None,
                     force_gpus: bool, secrets: dict[str, str]) -> tuple[StatusDoc, PayloadResult]:
    job_id = spec["job_id"]
    pay: PayloadResult | None = None
    if force_payload or needs_torch_work(book):
        if not replace and book.gpus is None:  # with gpus: it may run beside the live job
            step("check")
            refuse_if_running(tgt)  # a refused deploy touches nothing: no payload, no prepare
        pay = ship(force_payload)
        if needs_torch_work(book):
            step("prepare")
            _prepare_torch(tgt, book, steps, on_step, replace)
    if book.files:  # the playbook's files: before launch; rsync sends only what changed
        from opsctl.ops import files as files_mod

        if not replace and pay is None and book.gpus is None:
            step("check")
            refuse_if_running(tgt)  # never change a running job's files, then be refused
        step("files")
        pushed = files_mod.push_playbook_files(tgt, book)
        step("files-done", files=sum(r.files for r in pushed), bytes=sum(r.bytes for r in pushed))
    status: StatusDoc | None = None
    if pay is None:  # launch checks the installed payload's digest: one round trip
        from opsctl.remote import payload as payload_mod

        manifest = payload_mod.build_manifest()
        step("launch", job_id=job_id, payload_digest=manifest.digest[:12])
        try:
            status = _launch(tgt, spec, replace, force_gpus, secrets, payload_digest=manifest.digest)
            pay = PayloadResult(False, manifest.digest, len(manifest.files), 0, 0.0)
            step("payload-done", sent=False, digest=manifest.digest[:12], checked_by="launch")
        except NoPayload:
            pay = ship(True)
        except AgentError as exc:
            # PayloadMismatch: nothing was touched (a live job without --replace is refused
            # before the digest check); UsageError: an older agent without the flag
            if exc.remote_type == ErrorType.AgentCrashed:
                pay = _reship_damaged(tgt, manifest.digest, exc, ship)
            elif exc.remote_type in (ErrorType.PayloadMismatch, ErrorType.UsageError):
                pay = ship(exc.remote_type == ErrorType.PayloadMismatch)
            else:
                raise
        except RemoteCommandFailed as exc:
            if type(exc) is not RemoteCommandFailed:  # a deadline, not a reply that never came
                raise
            pay = _reship_damaged(tgt, manifest.digest, exc, ship)
    if status is None:
        step("launch", job_id=job_id)
        status = _launch(tgt, spec, replace, force_gpus, secrets)
    return status, pay


def _reship_damaged(tgt: Target, digest: str, exc: RemoteCommandFailed,
                    ship: t.Callable[[bool], PayloadResult]) -> PayloadResult:
    """The installed agent could not answer ``launch`` (it crashed, or it fails at import:
    e.g. a payload shipped from a half-edited tree). Nothing was launched. When it is not
    this opsctl's payload, ship this one (the caller launches again); when it is, shipping
    the same files would not help: the error stands, with what repairs a damaged copy.

    Raises:
        RemoteCommandFailed: ``exc``, when the installed payload is this very digest.
    """
    if tgt.agent.remote_digest() != digest:
        return ship(True)
    exc.hint = exc.hint or "if the installed copy is damaged: opsctl deploy --force-payload"
    raise exc


def refuse_if_running(tgt: Target) -> None:
    """Raise the agent's own ``JobAlreadyRunning`` refusal when the current job is live.

    Raises:
        AgentError: ``JobAlreadyRunning`` (the same error ``launch`` would give).
    """
    try:
        doc = tgt.agent.call("jobs", "--limit", "1", timeout=30)  # the newest, and the live ones
    except NoPayload:
        return  # no agent there, so no job it launched
    current = doc["current"]
    row = next((r for r in doc["jobs"] if r["job_id"] == current), None)
    state = row.get("state") if row is not None else None
    if current and state and not JobState(state).is_terminal():
        raise AgentError(f"{tgt.label}: launch: job {current} is {state}; stop it or launch with "
                         "--replace", remote_type=ErrorType.JobAlreadyRunning,
                         fields={"job_id": current, "state": state},
                         hint="stop it first (`opsctl stop`) or deploy with --replace")


def step_recorder(on_step: t.Callable[[str], None] | None
                  ) -> tuple[list[dict[str, t.Any]], t.Callable[..., None]]:
    """A deploy's step list (each ``{"step", "t", ...}``, seconds from now) and the function
    that appends to it and tells ``on_step`` (progress lines). Shared with ``deploy --nodes``."""
    start = time.monotonic()
    steps: list[dict[str, t.Any]] = []

    def step(name: str, **info: t.Any) -> None:
        steps.append({"step": name, "t": round(time.monotonic() - start, 3), **info})
        if on_step is not None:
            on_step(name)

    return steps, step


def signum_of(exc: BaseException) -> int | None:
    """The signal that ended the run: SIGTERM or SIGHUP (``procgroup.Terminated``); None for
    Ctrl-C (``KeyboardInterrupt``)."""
    return exc.signum if isinstance(exc, procgroup.Terminated) else None


def how(signum: int | None) -> str:
    """``interrupted`` (Ctrl-C) or ``terminated by SIGTERM``/``SIGHUP``: the words of a
    signal's message."""
    import signal

    return "interrupted" if signum is None else f"terminated by {signal.Signals(signum).name}"


def stop_command(tgt: Target, job_id: str) -> str:
    """The exact command that stops job ``job_id`` on ``tgt`` (a line to copy and run)."""
    import shlex

    return shlex.join(["opsctl", "stop", *tgt.flags, "--job", job_id])


def interrupted_deploy(tgt: Target, job_id: str, steps: list[dict[str, t.Any]],
                       signum: int | None = None) -> Interrupted:
    """Ctrl-C, SIGTERM or SIGHUP (``signum``) during a deploy: make sure job ``job_id`` is
    never launched late, and say what was already done (the old job untouched, being stopped,
    or replaced) and, for a job that was launched, the command that stops it.

    The agent's ``abort`` verb records the abort under the same lock ``launch`` takes to
    create the job, so its answer is exact: either the launch in flight will refuse, or
    the new job already exists and is reported as such. (The signal handler ended this run's
    ssh children first; ``abort`` goes over a fresh one.)
    """
    done = [s["step"] for s in steps if not s["step"].endswith("-done")]
    where = f"{tgt.label}: deploy {how(signum)} during {done[-1] if done else 'start'}"
    unsure = (f"job {job_id} may still be launched; if it is, stop it with "
              f"{stop_command(tgt, job_id)}")
    try:
        doc = tgt.agent.call("abort", "--job", job_id, timeout=30)
    except (KeyboardInterrupt, procgroup.Terminated):
        return Interrupted(f"{where}; interrupted again before the container answered: {unsure}",
                           hint="opsctl status", signum=signum)
    except OpsctlError as exc:
        if isinstance(exc, NoPayload):
            return Interrupted(f"{where}; nothing was launched (no payload installed yet)",
                               signum=signum)
        return Interrupted(f"{where}; could not confirm the abort ({exc.message}): {unsure}",
                           hint="opsctl status", signum=signum)
    old, old_state = doc.get("old_job"), doc.get("old_state")
    old_part = ""
    if old and doc["old_cancel_requested"]:
        old_part = f"job {old} had already been sent the stop signal (now {old_state})"
    elif old:
        old_part = f"job {old} was not touched (still {old_state})"
    if doc.get("launched"):
        msg = f"{where}; job {job_id} had already been launched (now {doc.get('state')})"
        msg += f" and {old_part}" if old_part else ""
        return Interrupted(f"{msg}; to stop it: {stop_command(tgt, job_id)}",
                           hint=f"{stop_command(tgt, job_id)}  (if you did not want it)",
                           signum=signum)
    shipped = any(s["step"] == "payload-done" and s.get("sent") for s in steps)
    payload_note = " (the new payload is installed)" if shipped else ""
    msg = f"{where}; job {job_id} was not launched and will not be{payload_note}"
    return Interrupted(msg + (f"; {old_part}" if old_part else ""), signum=signum)


def _launch(tgt: Target, spec: dict[str, t.Any], replace: bool, force_gpus: bool,
            secrets: dict[str, str], payload_digest: str | None = None) -> StatusDoc:
    args = ["--spec-json", json.dumps(spec)]
    stdin = None
    if spec.get("secrets"):
        args.append("--secrets-stdin")
        stdin = json.dumps(secrets).encode()
    if replace:
        args.append("--replace")
    if force_gpus:
        args.append("--force-gpus")
    container = tgt.host.target_spec(tgt.ctid)
    if container is not None and container.gpus and spec.get("gpus") is not None:
        args += ["--slots", str(container.gpus)]  # a count of GPUs needs the container's count
    if payload_digest is not None:
        args += ["--payload-digest", payload_digest]
    return tgt.agent.call("launch", *args, timeout=60, stdin=stdin)


def with_host_events(tgt: Target, st: StatusDoc) -> StatusDoc:
    """``st`` with the host kernel's Xid/OOM entries of the job's window first in its
    diagnosis (the agent in the container cannot read the host's log); a log that could not
    be read is an ``info`` entry at the end, never in front of the job's own diagnosis."""
    from opsctl.ops import doctor

    extra = doctor.kernel_diagnosis(tgt, st)
    if not extra:
        return st
    found = [d for d in extra if d["severity"] != "info"]
    notes = [d for d in extra if d["severity"] == "info"]
    return {**st, "diagnosis": [*found, *st["diagnosis"], *notes]}


def check_outcome(report: DeployReport) -> None:
    st = report.status
    if watch.is_terminal(st) and st["state"] != "SUCCEEDED":
        why = f"exit code {st['exit_code']}" if st["exit_code"] is not None else (st["signal"] or "")
        first = st["diagnosis"][0]["summary"] if st["diagnosis"] else \
            (st["output_tail"][-1] if st["output_tail"] else "")
        err = JobFailed(f"{report.target}: job {report.job_id} {st['state']}"
                        f"{' (' + why + ')' if why else ''}{': ' + first if first else ''}",
                        hint="opsctl status  (pane tail, diagnosis) · opsctl logs  (full output)",
                        log_path=st["output_log"], report=report)
        raise err
    if report.outcome == "timeout":
        err2 = JobUnhealthy(f"{report.target}: job {report.job_id} not healthy after "
                            f"{report.elapsed_s:.0f} s (state {st['state']})",
                            hint="opsctl status  ·  opsctl stacks (is it stuck?)", log_path=st["output_log"],
                            report=report)
        raise err2


# --- torch build and compile cache, before the launch ------------------------------------


def _prepare_torch(tgt: Target, book: Playbook, steps: list[dict[str, t.Any]],
                   progress: Progress | None, replace: bool) -> None:
    """The playbook's torch build current and its cache policy applied (before the launch).

    Idempotent: a build that is already current and has the playbook's ``requirements`` is
    not touched (one that lacks some is built again with them, by the agent's rule), and
    ``cache: seed`` does
    nothing when the current build's cache already holds a mega-cache. A running job blocks
    a build switch or a cache change; with ``replace`` it is stopped first (only then).
    The launch needs nothing back: the agent uses ``envs/current``'s python and the build's
    cache env by itself.
    """
    if book.torch is not None:
        t0 = time.monotonic()
        want = torch_ops.builds_table(tgt).resolve(book.torch.variant, version=book.torch.version).name
        current = tgt.agent.call("envs", "--history", "0", timeout=60)["current"]
        if current == want and not book.requirements:
            steps.append({"step": "torch", "build": want, "action": "noop", "seconds": 0.0})
        else:
            spec = book.torch

            def do_swap(install_only: bool = False) -> t.Mapping[str, t.Any]:
                return torch_ops.swap(tgt, spec.variant, version=spec.version, requirements=book.requirements,
                            install_only=install_only, progress=progress)

            # with a job running, the new build is installed and verified *before* the job is
            # stopped: a failed download or verification leaves the job running (nothing lost).
            # The current build itself is never rebuilt under a live job (the agent refuses):
            # requirements it lacks are installed only once the job is stopped (--replace).
            rep = _unless_running(tgt, replace, progress, do_swap,
                                  before_stop=None if current == want
                                  else (lambda: do_swap(install_only=True)))
            steps.append({"step": "torch", "build": rep["build"], "action": rep.get("action"),
                          "requirements": list(book.requirements),
                          "seconds": round(time.monotonic() - t0, 2)})
    if book.cache == "clear":
        rep2 = _unless_running(tgt, replace, progress,
                               lambda: tgt.agent.call("cache-clear", timeout=120))
        steps.append({"step": "cache-clear", "freed_bytes": rep2["freed_bytes"]})
    elif book.cache == "seed":
        info = tgt.agent.call("cache-info", timeout=120)
        if any(c["current"] and c["mega_cache"] for c in info["caches"]):
            steps.append({"step": "cache-seed", "action": "already seeded"})
        else:
            try:
                rep3 = _unless_running(tgt, replace, progress, lambda: torch_ops.cache_seed(tgt, book))
            except AgentError as exc:
                if exc.remote_type == ErrorType.JobRunning:
                    raise
                # seeding only saves compile time: the job still launches (and compiles cold)
                steps.append({"step": "cache-seed", "error": exc.message, "log_path": exc.log_path})
                if progress:
                    progress(f"cache seed failed, launching with a cold cache: {exc.message}")
            else:
                steps.append({"step": "cache-seed", "speedup": rep3.get("speedup"),
                              "reuse_proven": rep3.get("reuse_proven")})


R = t.TypeVar("R")


def _unless_running(tgt: Target, replace: bool, progress: Progress | None,
                    action: t.Callable[[], R], before_stop: t.Callable[[], t.Any] | None = None) -> R:
    """Run ``action``; if a running job blocks it and ``replace`` was asked, stop that job once.

    ``before_stop`` runs first (while the job still runs): whatever can fail without the
    job's help fails before the job is stopped.

    Raises:
        AgentError: ``JobRunning`` without ``replace`` (with a hint), or the action's own error.
    """
    try:
        return action()
    except AgentError as exc:
        if exc.remote_type != ErrorType.JobRunning:
            raise
        job = exc.fields.get("job_id")
        if not replace:
            exc.hint = (f"job {job} is running: `opsctl stop` it, or deploy with --replace "
                        "(it is stopped only if the torch build or cache must change)")
            raise
    if before_stop is not None:
        before_stop()
    if progress:
        progress(f"stopping job {job} (--replace) before changing the torch build/cache")
    tgt.agent.call("stop", "--job", str(job), "--grace", "30", timeout=90)
    return action()
