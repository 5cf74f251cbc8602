"""One ``status`` call through a live multiplexer, with no YAML, pydantic or paramiko on the way.

Why: `opsctl status` is what people and scripts poll; with the mux warm the remote part is a
``pct exec`` that opsctl cannot make faster, so the rest had to shrink: the inventory
(PyYAML + pydantic, ~60 ms) and the reply models (pydantic, ~50 ms) made `status --json` 1.10×
a bare ``ssh … pct exec 200 -- true`` instead of beating it (README, Speed).

The fast lane opens only when the target resolves from :mod:`opsctl.config.targetcache` and a
mux for the host answers; it sends exactly the command the full path sends
(:func:`opsctl.remote.transport.prepare`, :func:`opsctl.remote.agent_client.agent_argv`), so
the remote deadlines and the mux's host-key binding are the same. Nothing sent yet (no cache
entry, no mux, ``OPSCTL_MUX=0``): :func:`fetch` returns None and the caller takes the full path.
Once the command ran, any answer but a plain successful reply is finished by the full path's
own code on the *same* result (:func:`_finish`): errors, exit codes and saved logs are the
full path's, and nothing runs twice.
"""

from __future__ import annotations

import time
import typing as t
from dataclasses import dataclass

from opsctl.config import last_target, targetcache
from opsctl.remote import leanreply, transport
from opsctl.remote import mux_client as mux
from opsctl.remote.agent_client import agent_argv, agent_step

if t.TYPE_CHECKING:
    from opsctl.remote.models import JobStatus

#: The remote deadline of one ``status`` call (the full path's too: :func:`.watch.fetch_status`).
STATUS_TIMEOUT_S = 30.0


def status_args(job_id: str | None, lines: int) -> list[str]:
    """The ``status`` verb's arguments (both paths)."""
    return ["--lines", str(lines), *(["--job", job_id] if job_id else [])]


@dataclass(frozen=True)
class Answer:
    """A status from the fast lane: the ``--json`` document, or (``model=True``) the model."""

    label: str  # "<host> ct <ctid>", as Target.label
    doc: dict[str, t.Any] | None = None
    status: JobStatus | None = None

    def document(self) -> dict[str, t.Any]:
        """``JobStatus.model_dump(mode="json")``, whichever way it was read."""
        if self.doc is not None:
            return self.doc
        if self.status is None:  # pragma: no cover - fetch always sets one
            raise ValueError("an Answer without a status")
        return self.status.model_dump(mode="json")


def fetch(host: str | None, ctid: int | None, job_id: str | None, lines: int, *,
          model: bool = False, accept_new_host_key: bool = False) -> Answer | None:
    """The job's status through a live mux; None when the fast lane is closed (nothing sent).

    ``model``: return the validated :class:`JobStatus` (the human view) instead of the
    ``--json`` document.

    Raises:
        as the full path (``ops.jobs.open_target`` + ``watch.fetch_status``).
    """
    last = last_target.resolve(host, ctid)
    if last.ctid < 100 or not mux.enabled():
        return None
    spec = targetcache.lookup(last.host)
    if spec is None:
        return None
    step = agent_step("status")
    pct = transport.pct_argv(last.ctid, agent_argv(spec.root, "status", *status_args(job_id, lines)),
                             timeout=STATUS_TIMEOUT_S)
    argv, command = transport.prepare(spec, pct, timeout=STATUS_TIMEOUT_S, step=step)
    start = time.monotonic()
    reply = mux.call(spec, command, stdin=None, on_stdout=None, on_stderr=None,
                     local_deadline=transport.local_deadline(STATUS_TIMEOUT_S), argv=argv, what=step)
    if reply is None:
        return None
    result = transport.CommandResult(tuple(argv), command, reply.rc, reply.stdout, reply.stderr,
                                     time.monotonic() - start, via="mux")
    label = f"{spec.label} ct {last.ctid}"
    if result.rc == 0:
        try:
            data = leanreply.reply_data(result.stdout)
            if model:
                from opsctl.remote.models import JobStatus

                return Answer(label, status=JobStatus.model_validate(data))
            return Answer(label, doc=leanreply.normalize(data, leanreply.cached_shape("JobStatus")))
        except leanreply.Unsure:
            pass
    return _finish(last.host, last.ctid, result, accept_new_host_key=accept_new_host_key)


def _finish(host: str, ctid: int, result: transport.CommandResult, *,
            accept_new_host_key: bool) -> Answer:
    """The full path's reading of a status command that already ran."""
    from opsctl.ops import jobs
    from opsctl.remote.models import JobStatus

    step = agent_step("status")
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        checked = tgt.remote.check_deadline(result, timeout=STATUS_TIMEOUT_S, step=step)
        checked = tgt.remote.check_pct_result(ctid, checked, step=step)
        status = JobStatus.model_validate(tgt.agent.answer("status", checked))
    return Answer(tgt.label, status=status)
