"""``opsctl queue``: the container's job queue: add, list, remove, reorder; and
``deploy`` of a pipeline playbook, which queues every step at once.

The queue lives in the container (``remote_payload/agent/jobqueue.py``): once a job is queued
the container starts it when its dependency succeeded and its GPUs are free, with no client
connected. Here: ship the payload and the playbook's files, build the launch specs (as
``deploy`` does), and send them in one ``queue-add`` call (specs and secrets on stdin), so a
pipeline's steps are queued all or none.
"""

from __future__ import annotations

import json
import typing as t
from dataclasses import dataclass, field

from opsctl.config.pipeline import Pipeline, resolve
from opsctl.config.playbook import Playbook
from opsctl.errors import ConfigError, Interrupted
from opsctl.ops import torch as torch_ops
from opsctl.ops.deploy import collect_secrets, how, signum_of, stop_command
from opsctl.ops.jobs import Target
from remote_payload import procgroup, wire
from remote_payload.wire_shapes import BootHookDoc, QueueDoc, QueueRmDoc

Progress = t.Callable[[str], None]


@dataclass(frozen=True)
class QueuedStep:
    """One job to queue: its playbook and what it waits for (a job id, or an earlier step)."""

    book: Playbook
    after: str | int | None = None  # a job id (or unique prefix), or the index of an earlier step
    name: str | None = None  # the pipeline step's name


@dataclass
class QueueAddReport:
    target: str
    jobs: list[dict[str, t.Any]]  # {"job_id", "playbook", "step", "after"} per queued job
    started: list[str]
    cancelled: list[str]
    queue: QueueDoc
    notes: list[str] = field(default_factory=list)
    boot_hook: BootHookDoc | None = None  # the container's boot hook: systemd unit, crontab line or none

    def to_dict(self) -> dict[str, t.Any]:
        return {"target": self.target, "jobs": self.jobs, "started": self.started,
                "cancelled": self.cancelled, "queue": self.queue, "notes": self.notes,
                "boot_hook": self.boot_hook}


def slots(tgt: Target) -> int:
    """The container's GPU count from the inventory (0: not given)."""
    spec = tgt.host.target_spec(tgt.ctid)
    return spec.gpus if spec is not None else 0


def _slot_args(tgt: Target) -> list[str]:
    n = slots(tgt)
    return ["--slots", str(n)] if n else []


def batch_ids(books: t.Sequence[Playbook]) -> list[str]:
    """A new job id per playbook, distinct within the batch (a pipeline's steps share a name
    and a second; an id drawn twice is drawn again, so no step ever waits for itself). The
    agent checks them against the container's existing job dirs."""
    ids: list[str] = []
    for book in books:
        jid = book.new_job_id()
        while jid in ids:
            jid = book.new_job_id()
        ids.append(jid)
    return ids


def add(tgt: Target, steps: t.Sequence[QueuedStep], *, secrets: dict[str, str] | None = None,
        on_step: Progress | None = None) -> QueueAddReport:
    """Queue ``steps`` in the container, in order, in one call (all or none).

    Raises:
        AgentError: the agent refused (``BadSpec``, ``QueueRefused``, ``JobExists``).
        Interrupted: Ctrl-C, SIGTERM or SIGHUP; says which job ids may have been queued and
            the commands that take them out.
        ConfigError: a secret is missing.
    """
    from opsctl.ops import files as files_mod

    def step(name: str) -> None:
        if on_step is not None:
            on_step(name)

    count = slots(tgt)
    for s in steps:  # checked here, before anything is sent (the agent checks it again)
        try:
            request = wire.validate_gpu_request(s.book.gpus, count or None)
        except ValueError as exc:
            raise ConfigError(f"{tgt.label}: {s.name or s.book.name}: {exc}") from None
        unfit = wire.gpu_request_unfit(request, count)
        if unfit is not None:  # it could never start, and would hold back every job behind it
            raise ConfigError(f"{tgt.label}: {s.name or s.book.name}: {unfit}",
                              hint=f"set containers.{tgt.ctid}.gpus in the inventory, or leave "
                              "gpus out (the whole container)")
    if secrets is None:
        secrets = {}
        for s in steps:
            secrets.update(collect_secrets(s.book))
    notes = [f"{s.name or s.book.name}: cache: is not applied by the queue (deploy or "
             "`opsctl cache` does it)" for s in steps if s.book.cache in ("clear", "seed")]
    builds: dict[int, str] = {}  # step index -> the torch build its playbook names
    for i, s in enumerate(steps):
        if s.book.torch is not None:
            builds[i] = torch_ops.builds_table(tgt).resolve(
                s.book.torch.variant, version=s.book.torch.version).name
    ids = batch_ids([s.book for s in steps])
    specs = []
    for i, s in enumerate(steps):
        spec = s.book.job_spec(ids[i], root=tgt.host.root, notify=tgt.host.notify_urls(tgt.ctid),
                               target={"host": tgt.host.label, "ct": tgt.ctid})
        spec["after"] = ids[s.after] if isinstance(s.after, int) else s.after
        if i in builds:  # the agent switches to it when it starts the job, with nothing live
            spec["torch_build"] = builds[i]
        specs.append(spec)
    stage = "payload"
    try:
        step("payload")
        tgt.agent.ensure_payload()
        installed: set[str] = set()
        for i, s in enumerate(steps):  # installed now (install-only: allowed while jobs run)
            if i in builds and builds[i] not in installed and s.book.torch is not None:
                stage = f"installing torch build {builds[i]}"
                step("torch")
                torch_ops.swap(tgt, s.book.torch.variant, version=s.book.torch.version,
                               requirements=s.book.requirements, install_only=True,
                               progress=on_step)
                installed.add(builds[i])
        for s in steps:
            if s.book.files:
                stage = "files"
                step("files")
                files_mod.push_playbook_files(tgt, s.book)
        stage = "queue"
        step("queue")
        names = {n for s in steps for n in s.book.secret_names()}
        body = json.dumps({"specs": specs, "secrets": {k: v for k, v in secrets.items()
                                                       if k in names} or None}).encode()
        reply = tgt.agent.call("queue-add", "--specs-stdin", *_slot_args(tgt), timeout=120,
                               stdin=body)
    except (KeyboardInterrupt, procgroup.Terminated) as exc:
        raise interrupted_add(tgt, stage, ids, [sp["after"] for sp in specs],
                              signum_of(exc)) from None
    jobs = [{"job_id": jid, "playbook": s.book.name, "step": s.name, "after": spec["after"]}
            for jid, s, spec in zip(reply["added"], steps, specs, strict=True)]
    hook = reply["boot_hook"]
    if hook["warning"]:
        notes.append(hook["warning"])
    return QueueAddReport(tgt.label, jobs, reply["started"], reply["cancelled"], reply["queue"],
                          notes, hook)


def interrupted_add(tgt: Target, stage: str, ids: t.Sequence[str],
                    afters: t.Sequence[str | None], signum: int | None) -> Interrupted:
    """Ctrl-C, SIGTERM or SIGHUP (``signum``) during ``queue add``: what it queued (nothing
    before the ``queue`` stage; during it, the container queues the batch whole or not at
    all) and the exact commands that take it out again. ``stop`` of a queued job removes it
    and of a started one stops it; either way the steps that wait for it are cancelled, so one
    command per step that waits for nothing in the batch ends the whole batch."""
    where = f"{tgt.label}: queue add {how(signum)} during {stage}"
    if stage != "queue":
        return Interrupted(f"{where}: nothing is queued", signum=signum,
                           hint="opsctl envs  (shows the torch builds installed)"
                           if stage.startswith("installing") else None)
    batch = set(ids)
    roots = [jid for jid, after in zip(ids, afters, strict=True) if after not in batch]
    shown = ", ".join(ids) if len(ids) <= 3 else f"{ids[0]} … {ids[-1]}"
    commands = " ; ".join(stop_command(tgt, jid) for jid in roots[:MAX_SHOWN_COMMANDS])
    more = (f" (and the same for {len(roots) - MAX_SHOWN_COMMANDS} more steps that wait for "
            "nothing in the batch; `opsctl queue` lists them)"
            if len(roots) > MAX_SHOWN_COMMANDS else "")
    waits = len(ids) - len(roots)
    them = "it" if len(roots) == 1 else "them"
    cancels = f"; the {waits} steps that wait for {them} are cancelled with {them}" if waits else ""
    return Interrupted(f"{where} of {len(ids)} jobs ({shown}): the container queues them all or "
                       f"none; to take them out: {commands}{more}{cancels}",
                       hint=f"opsctl queue {' '.join(tgt.flags)}  (shows them if "
                            "they are queued)", signum=signum)


#: an interrupted ``queue add`` shows at most this many stop commands (a wide pipeline)
MAX_SHOWN_COMMANDS = 4


def add_pipeline(tgt: Target, pipe: Pipeline, *, on_step: Progress | None = None,
                 secrets: dict[str, str] | None = None) -> QueueAddReport:
    """``deploy`` of a pipeline: every step queued at once, each after the step it names.

    Raises:
        ConfigError: a step's playbook is missing or invalid (before anything remote).
    """
    resolved = resolve(pipe)
    return add(tgt, [QueuedStep(r.book, r.after, r.name) for r in resolved], secrets=secrets,
               on_step=on_step)


def listing(tgt: Target) -> QueueDoc:
    """The queue, first to start first, and which job holds which GPU slots."""
    return tgt.agent.call("queue", *_slot_args(tgt), timeout=120)


def remove(tgt: Target, job_id: str) -> QueueRmDoc:
    """``queue rm``: the queued job never runs (CANCELLED, ``end_reason: "removed"``).

    Raises:
        AgentError: ``QueueRefused`` for a job that is not queued (a running one: ``stop``).
    """
    return tgt.agent.call("queue-rm", "--job", job_id, *_slot_args(tgt), timeout=120)


def move(tgt: Target, job_id: str, *, before: str | None = None,
         after: str | None = None) -> QueueDoc:
    """``queue move``: reorder (refused when a job would come before its own dependency)."""
    where = ["--before", before] if before is not None else ["--after", str(after)]
    return tgt.agent.call("queue-move", "--job", job_id, *where, *_slot_args(tgt), timeout=120)
