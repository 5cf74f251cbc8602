"""One ``status`` call with no YAML, pydantic or paramiko on the way: through a live mux, or
for the first command of a session, through the OpenSSH client.

Why: `opsctl status` is what people and scripts poll; the remote part is a ``pct exec`` that
opsctl cannot make faster, so the rest had to shrink: the inventory (PyYAML + pydantic,
~60 ms) and the reply models (pydantic, ~50 ms) made `status --json` 1.10× a bare
``ssh … pct exec 200 -- true``, and without a mux the paramiko import and key exchange made
it 2.2× (README, Speed).

The fast lane opens only when the target resolves from :mod:`opsctl.config.targetcache`;
it sends exactly the command the full path sends (:func:`opsctl.remote.transport.prepare`,
:func:`opsctl.remote.agent_client.agent_argv`), so the remote deadlines are the same. It
goes through a live mux (bound to the verified host key), else (no mux, ``OPSCTL_MUX=0``)
through ``ssh`` (:mod:`opsctl.remote.sshcall`, which trusts only the keys the full path
would accept) and then starts a mux for the next command, as the full path does after a
direct connection. Nothing sent, or ssh itself failed (unknown or changed host key, auth,
network, a ProxyJump): :func:`fetch` returns None and the caller takes the full path, whose
errors say why (a changed key still exits 12 with its message). Once the command ran, any
answer but a plain successful reply is finished by the full path's own code on the *same*
result (:func:`_finish`): errors, exit codes and saved logs are the full path's, and
nothing runs twice.
"""

from __future__ import annotations

import time
import typing as t
from dataclasses import dataclass

from opsctl.config import last_target, targetcache, trace
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
    """The job's status through a live mux or ``ssh``; None when the fast lane is closed
    (nothing sent, or ssh itself failed: the full path then connects and says why).

    ``model``: return the validated :class:`JobStatus` (the human view) instead of the
    ``--json`` document.

    Raises:
        as the full path (``ops.jobs.open_target`` + ``watch.fetch_status``).
    """
    last = last_target.resolve(host, ctid)
    if last.ctid < 100:
        return None
    spec = targetcache.lookup(last.host)
    if spec is None:
        return None
    step = agent_step("status")
    pct = transport.pct_argv(last.ctid, agent_argv(spec.root, "status", *status_args(job_id, lines)),
                             timeout=STATUS_TIMEOUT_S)
    argv, command = transport.prepare(spec, pct, timeout=STATUS_TIMEOUT_S, step=step)
    trace.mark("target")
    deadline = transport.local_deadline(STATUS_TIMEOUT_S)
    result = None
    if mux.enabled():
        start = time.monotonic()
        reply = mux.call(spec, command, stdin=None, on_stdout=None, on_stderr=None,
                         local_deadline=deadline, argv=argv, what=step)
        if reply is not None:
            result = transport.CommandResult(tuple(argv), command, reply.rc, reply.stdout,
                                             reply.stderr, time.monotonic() - start, via="mux")
            trace.mark("mux round trip")
    if result is None:
        from opsctl.remote import sshcall  # not on the warm path: subprocess, hmac, ssh argv

        result = sshcall.run(spec, command, argv, local_deadline=deadline, what=step)
        if result is None:
            return None
        trace.mark("ssh round trip")
        mux.spawn(spec)  # for the next command (a no-op with OPSCTL_MUX=0)
        trace.mark("mux spawn")
    label = f"{spec.label} ct {last.ctid}"
    if result.rc == 0:
        try:
            data = leanreply.reply_data(result.stdout)
            if model:
                from opsctl.remote.models import JobStatus

                return Answer(label, status=JobStatus.model_validate(data))
            doc = leanreply.normalize(data, leanreply.cached_shape("JobStatus"))
            trace.mark("parse")
            return Answer(label, doc=doc)
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
