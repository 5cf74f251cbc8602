"""The operations behind the CLI: deploy, status, logs, stop. Each returns a report.

Kept free of click and rich so tests and other tools can call them directly.
"""

from __future__ import annotations

import base64
import time
import typing as t
from dataclasses import dataclass, field

from opsctl import inventory as inventory_mod
from opsctl import target as target_mod
from opsctl import watch
from opsctl.agent_client import Agent, NoPayload, PayloadResult
from opsctl.errors import (
    AgentError,
    ConfigError,
    Interrupted,
    JobFailed,
    JobUnhealthy,
    OpsctlError,
)
from opsctl.inventory import HostSpec
from opsctl.models import JobStatus, LogsChunk, StopResult
from opsctl.transport import Remote
from remote_payload.wire import JobState

if t.TYPE_CHECKING:
    from opsctl.playbook import Playbook


@dataclass
class Target:
    """A resolved host + container, with its connection and agent."""

    name: str  # what the user typed (inventory name or address)
    host: HostSpec
    ctid: int
    remote: Remote
    agent: Agent

    @property
    def label(self) -> str:
        return f"{self.host.label} ct {self.ctid}"

    def close(self) -> None:
        self.remote.close()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_target(host: str | None, ctid: int | None, *, accept_new_host_key: bool = False) -> Target:
    """Resolve flags (or the remembered target) to a :class:`Target`; connects lazily.

    Raises:
        ConfigError: unknown host, no target, or a container id the host does not list.
    """
    last = target_mod.resolve(host, ctid)
    inv = inventory_mod.load()
    spec = inv.resolve(last.host)
    if last.ctid < 100:
        raise ConfigError(f"container id {last.ctid} is not valid: Proxmox ids start at 100")
    remote = Remote(spec, accept_new_host_key=accept_new_host_key)
    return Target(last.host, spec, last.ctid, remote, Agent(remote, last.ctid, spec.root))


def default_playbook(host: str, ctid: int | None) -> str:
    """The container's ``playbook:`` from the inventory (what the bundled trainer runs there).

    Raises:
        ConfigError: no --ct, or the inventory names no playbook for that container.
    """
    spec = inventory_mod.load().resolve(host)
    if ctid is None:
        raise ConfigError("deploy needs --ct (the container id)")
    container = spec.containers.get(ctid)
    if container is None or container.playbook is None:
        from opsctl import playbook

        names = ", ".join(playbook.available_names())
        raise ConfigError(f"no --playbook given and the inventory names none for {spec.label} "
                          f"ct {ctid}", hint=f"pass --playbook (available: {names}) or set "
                                              f"containers.{ctid}.playbook in the inventory")
    return container.playbook


# --- deploy ---------------------------------------------------------------------------


@dataclass
class DeployReport:
    target: str
    job_id: str
    playbook: str
    payload: PayloadResult
    outcome: str  # healthy | terminal | timeout | launched
    status: JobStatus
    elapsed_s: float
    steps: list[dict[str, t.Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, t.Any]:
        return {
            "target": self.target, "job_id": self.job_id, "playbook": self.playbook,
            "payload": self.payload.__dict__, "outcome": self.outcome,
            "elapsed_s": round(self.elapsed_s, 3), "steps": self.steps,
            "status": self.status.model_dump(mode="json"),
        }


PrepareHook = t.Callable[..., dict[str, t.Any]]  # (target, playbook, steps, progress=) -> overrides


def deploy(tgt: Target, book: Playbook, *, replace: bool = False, wait: bool = True,
           poll_s: float = watch.DEFAULT_POLL_S, on_update: watch.OnUpdate | None = None,
           on_step: t.Callable[[str], None] | None = None, force_payload: bool = False,
           prepare: PrepareHook | None = None, force_gpus: bool = False) -> DeployReport:
    """Ship the payload, prepare the torch env, launch, and watch until healthy or failed.

    ``prepare`` (torch build + compile cache, issue 3) returns the launch spec
    overrides (``python``, extra ``env``).

    Raises:
        JobFailed: the job ended FAILED/CANCELLED/LOST before becoming healthy.
        JobUnhealthy: still not healthy after the playbook's ``timeout_s``.
        Interrupted: Ctrl-C before the job was launched; says what was already done.
        (and transport/container/agent errors from the steps)
    """
    start = time.monotonic()
    steps: list[dict[str, t.Any]] = []

    def step(name: str, **info: t.Any) -> None:
        steps.append({"step": name, "t": round(time.monotonic() - start, 3), **info})
        if on_step is not None:
            on_step(name)

    job_id = book.new_job_id()
    try:
        status, pay = _ship_and_launch(tgt, book, job_id, step, steps, replace=replace,
                                       force_payload=force_payload, prepare=prepare,
                                       on_step=on_step, force_gpus=force_gpus)
    except KeyboardInterrupt:
        raise interrupted_deploy(tgt, job_id, steps) from None
    target_mod.save(target_mod.LastTarget(tgt.name, tgt.ctid, job_id))
    outcome = "launched"
    if wait:
        step("watch")
        try:
            result = watch.wait(tgt.agent, job_id, until="healthy", timeout_s=book.timeout_s,
                                poll_s=poll_s, on_update=on_update)
        except KeyboardInterrupt:
            raise Interrupted(f"{tgt.label}: deploy interrupted while watching: job {job_id} was "
                              "launched and keeps running",
                              hint=f"opsctl status  ·  opsctl stop --job {job_id}") from None
        status, outcome = result.status, result.reason
    report = DeployReport(tgt.label, job_id, book.name, pay, outcome, status,
                          time.monotonic() - start, steps)
    check_outcome(report)
    return report


def _ship_and_launch(tgt: Target, book: Playbook, job_id: str, step: t.Callable[..., None],
                     steps: list[dict[str, t.Any]], *,
                     replace: bool, force_payload: bool, prepare: PrepareHook | None,
                     on_step: t.Callable[[str], None] | None,
                     force_gpus: bool) -> tuple[JobStatus, PayloadResult]:
    status: JobStatus | None = None
    pay: PayloadResult | None = None
    force = force_payload
    if not force_payload and prepare is None:
        # Unchanged-payload fast path: launch refuses unless the installed payload has our
        # digest, so an unchanged re-deploy is one round trip instead of two.
        from opsctl import payload as payload_mod

        manifest = payload_mod.build_manifest()
        step("launch", job_id=job_id, payload_digest=manifest.digest[:12])
        spec = book.job_spec(job_id, root=tgt.host.root, replace=replace)
        try:
            status = _launch(tgt, spec, replace, force_gpus, payload_digest=manifest.digest)
            pay = PayloadResult(False, manifest.digest, len(manifest.files), 0, 0.0)
            step("payload-done", sent=False, digest=manifest.digest[:12], checked_by="launch")
        except NoPayload:
            force = True
        except AgentError as exc:
            # PayloadMismatch: nothing was touched; UsageError: an older agent without the flag
            if exc.remote_type not in ("PayloadMismatch", "UsageError"):
                raise
            force = exc.remote_type == "PayloadMismatch"
    if status is None or pay is None:
        if not replace:
            step("check")
            refuse_if_running(tgt)  # a refused deploy touches nothing: no payload, no prepare
        step("payload")
        pay = tgt.agent.ensure_payload(force=force)
        step("payload-done", sent=pay.sent, digest=pay.digest[:12])
        overrides: dict[str, t.Any] = {}
        if prepare is not None:
            step("prepare")
            overrides = prepare(tgt, book, steps, progress=on_step, replace=replace)
        spec = book.job_spec(job_id, root=tgt.host.root, replace=replace,
                             python=overrides.get("python"), extra_env=overrides.get("env"))
        step("launch", job_id=job_id)
        status = _launch(tgt, spec, replace, force_gpus)
    return status, pay


def refuse_if_running(tgt: Target) -> None:
    """Raise the agent's own ``JobAlreadyRunning`` refusal when the current job is live.

    Raises:
        AgentError: ``JobAlreadyRunning`` (the same error ``launch`` would give).
    """
    try:
        doc = tgt.agent.call("jobs", timeout=30)
    except NoPayload:
        return  # no agent there, so no job it launched
    current = doc.get("current")
    row = next((r for r in doc.get("jobs", []) if r.get("job_id") == current), None)
    state = (row or {}).get("state")
    if current and state and not JobState(state).is_terminal():
        raise AgentError(f"{tgt.label}: launch: job {current} is {state}; stop it or launch with "
                         "--replace", remote_type="JobAlreadyRunning",
                         fields={"job_id": current, "state": state},
                         hint="stop it first (`opsctl stop`) or deploy with --replace")


def interrupted_deploy(tgt: Target, job_id: str, steps: list[dict[str, t.Any]]) -> Interrupted:
    """Ctrl-C during a deploy: make sure job ``job_id`` is never launched late, and say what
    was already done (the old job untouched, being stopped, or replaced).

    The agent's ``abort`` verb records the abort under the same lock ``launch`` takes to
    create the job, so its answer is exact: either the launch in flight will refuse, or
    the new job already exists and is reported as such.
    """
    done = [s["step"] for s in steps if not s["step"].endswith("-done")]
    where = f"{tgt.label}: deploy interrupted during {done[-1] if done else 'start'}"
    try:
        doc = tgt.agent.call("abort", "--job", job_id, timeout=30)
    except KeyboardInterrupt:
        return Interrupted(f"{where}; interrupted again before the container answered: "
                           f"job {job_id} may still be launched", hint="opsctl status")
    except OpsctlError as exc:
        if isinstance(exc, NoPayload):
            return Interrupted(f"{where}; nothing was launched (no payload installed yet)")
        return Interrupted(f"{where}; could not confirm the abort ({exc.message}): job {job_id} "
                           "may still be launched", hint="opsctl status")
    old, old_state = doc.get("old_job"), doc.get("old_state")
    old_part = ""
    if old and doc.get("old_cancel_requested"):
        old_part = f"job {old} had already been sent the stop signal (now {old_state})"
    elif old:
        old_part = f"job {old} was not touched (still {old_state})"
    if doc.get("launched"):
        msg = f"{where}; job {job_id} had already been launched (now {doc.get('state')})"
        return Interrupted(msg + (f" and {old_part}" if old_part else ""),
                           hint=f"opsctl stop --job {job_id}  (if you did not want it)")
    shipped = any(s["step"] == "payload-done" and s.get("sent") for s in steps)
    payload_note = " (the new payload is installed)" if shipped else ""
    msg = f"{where}; job {job_id} was not launched and will not be{payload_note}"
    return Interrupted(msg + (f"; {old_part}" if old_part else ""))


def _launch(tgt: Target, spec: dict[str, t.Any], replace: bool, force_gpus: bool,
            payload_digest: str | None = None) -> JobStatus:
    import json

    args = ["--spec-json", json.dumps(spec)]
    if replace:
        args.append("--replace")
    if force_gpus:
        args.append("--force-gpus")
    if payload_digest is not None:
        args += ["--payload-digest", payload_digest]
    return JobStatus.model_validate(tgt.agent.call("launch", *args, timeout=60))


def check_outcome(report: DeployReport) -> None:
    st = report.status
    if st.terminal and st.state.value != "SUCCEEDED":
        why = f"exit code {st.exit_code}" if st.exit_code is not None else (st.signal or "")
        first = st.diagnosis[0].summary if st.diagnosis else (st.output_tail[-1] if st.output_tail else "")
        err = JobFailed(f"{report.target}: job {report.job_id} {st.state.value}"
                        f"{' (' + why + ')' if why else ''}{': ' + first if first else ''}",
                        hint="opsctl status  (pane tail, diagnosis) · opsctl logs  (full output)",
                        log_path=st.output_log)
        err.report = report  # type: ignore[attr-defined]
        raise err
    if report.outcome == "timeout":
        err2 = JobUnhealthy(f"{report.target}: job {report.job_id} not healthy after "
                            f"{report.elapsed_s:.0f} s (state {st.state.value})",
                            hint="opsctl status  ·  opsctl stacks (is it stuck?)", log_path=st.output_log)
        err2.report = report  # type: ignore[attr-defined]
        raise err2


# --- logs / stop ------------------------------------------------------------------------


def read_logs(tgt: Target, job_id: str | None, offset: int,
              max_bytes: int = 1 << 20) -> tuple[bytes, LogsChunk]:
    args = ["--offset", str(offset), "--max-bytes", str(max_bytes)]
    if job_id:
        args += ["--job", job_id]
    chunk = LogsChunk.model_validate(tgt.agent.call("logs", *args, timeout=30))
    return base64.b64decode(chunk.data_b64), chunk


def follow_logs(tgt: Target, job_id: str | None, write: t.Callable[[bytes], None], *,
                follow: bool, offset: int = 0, poll_s: float = 1.0) -> LogsChunk:
    """Stream output.log from ``offset``; with ``follow`` until the job ends.

    Bound to one job: without ``job_id`` the first chunk names the current job and
    every later read asks for it by id, so another job launched meanwhile is never
    spliced into this stream.
    """
    while True:
        data, chunk = read_logs(tgt, job_id, offset)
        job_id = chunk.job_id
        if data:
            write(data)
        offset = chunk.next_offset
        if not chunk.eof:
            continue
        if not follow or chunk.terminal:
            return chunk
        time.sleep(poll_s)


def stop(tgt: Target, job_id: str | None, grace_s: float) -> StopResult:
    args = ["--grace", f"{grace_s:g}"]
    if job_id:
        args += ["--job", job_id]
    return StopResult.model_validate(tgt.agent.call("stop", *args, timeout=grace_s + 30))
