"""One ``status`` call with no YAML, pydantic or paramiko on the way: through a live mux, or
for the first command of a session, through the OpenSSH client.

Why: `opsctl status` is what people and scripts poll; the remote part is a ``pct exec`` that
opsctl cannot make faster, so the rest had to shrink: the inventory (PyYAML + pydantic,
~60 ms) and the reply models (pydantic, ~50 ms) made `status --json` 1.10× a bare
``ssh … pct exec 200 -- true``, and without a mux the paramiko import and key exchange made
it 2.2× (docs/benchmarks.md).

The fast lane opens only when the target resolves from :mod:`opsctl.config.targetcache`;
it sends exactly the command the full path sends (:func:`opsctl.remote.command.prepare`,
:func:`opsctl.remote.command.agent_argv`), so the remote deadlines are the same. It
goes through a live mux (bound to the verified host key), else (no mux, ``OPSCTL_MUX=0``)
through ``ssh`` (:mod:`opsctl.remote.sshcall`, which trusts only the keys the full path
would accept); the caller then starts a mux for the next command (:func:`keep_warm`, once the
answer is printed, so it takes no CPU from the handshake), as the full path does after a
direct connection. ``ssh`` starts as soon as the command is spelled: what reading the reply
needs (and the caller's ``meanwhile``, e.g. its output modules) loads while it runs.

Nothing sent, or ssh itself failed (unknown or changed host key, auth, network, a
ProxyJump): :func:`fetch` returns None and the caller takes the full path, whose errors say
why (a changed key still exits 12 with its message). Once the command ran, any
answer but a plain successful reply is finished by the full path's own code on the *same*
result (:func:`_finish`): errors, exit codes and saved logs are the full path's, and
nothing runs twice.
"""

from __future__ import annotations

import time
import typing as t

from opsctl.config import last_target, targetcache, trace
from opsctl.config.ctid import MAX_CTID, MIN_CTID
from opsctl.remote import command as cmd
from opsctl.remote import mux_socket

if t.TYPE_CHECKING:
    from opsctl.config.targetcache import CachedHost
    from opsctl.remote.launchrecord import Launched
    from opsctl.remote.leanreply import Shape
    from opsctl.remote.models import JobStatus

#: The remote deadline of one ``status`` call (the full path's too: :func:`.watch.fetch_status`).
STATUS_TIMEOUT_S = 30.0


def status_args(job_id: str | None, lines: int) -> list[str]:
    """The ``status`` verb's arguments (both paths)."""
    return ["--lines", str(lines), *(["--job", job_id] if job_id else [])]


# A NamedTuple, not a dataclass: `dataclasses` imports `inspect`, which the first `status`
# would load before its ssh starts (docs/benchmarks.md).
class Answer(t.NamedTuple):
    """A status from the fast lane: the ``--json`` document, or (``model=True``) the model."""

    label: str  # "<host> ct <ctid>", as Target.label
    doc: dict[str, t.Any] | None = None
    status: JobStatus | None = None
    #: the host reached over ssh, which has no mux yet: :func:`keep_warm` starts one
    cold_host: CachedHost | None = None
    #: the ``ssh`` started for it when no launch record did, and the private known_hosts it
    #: names: what :func:`remember_launch` keeps
    ssh_argv: list[str] | None = None
    known_hosts: str | None = None

    def document(self) -> dict[str, t.Any]:
        """``JobStatus.model_dump(mode="json")``, whichever way it was read."""
        if self.doc is not None:
            return self.doc
        if self.status is None:  # pragma: no cover - fetch always sets one
            raise ValueError("an Answer without a status")
        return self.status.model_dump(mode="json")


def fetch(host: str | None, ctid: int | None, job_id: str | None, lines: int, *,
          model: bool = False, accept_new_host_key: bool = False,
          meanwhile: t.Callable[[], object] | None = None,
          early: Launched | None = None) -> Answer | None:
    """The job's status through a live mux or ``ssh``; None when the fast lane is closed
    (nothing sent, or ssh itself failed: the full path then connects and says why).

    ``model``: return the validated :class:`JobStatus` (the human view) instead of the
    ``--json`` document. ``meanwhile``: run while ``ssh`` waits for the reply (the caller's
    imports); with a mux, before the call. ``early``: the ``ssh`` the launch record started,
    used only where this would start the very same one (:func:`.sshcall.start`), else killed.

    Raises:
        as the full path (``ops.jobs.open_target`` + ``watch.fetch_status``).
    """
    try:
        return _fetch(host, ctid, job_id, lines, model=model,
                      accept_new_host_key=accept_new_host_key, meanwhile=meanwhile, early=early)
    finally:
        if early is not None:
            early.discard()  # not adopted (no-op when it was): a mux, a miss, an error


def _fetch(host: str | None, ctid: int | None, job_id: str | None, lines: int, *, model: bool,
           accept_new_host_key: bool, meanwhile: t.Callable[[], object] | None,
           early: Launched | None) -> Answer | None:
    last = last_target.resolve(host, ctid)
    if not MIN_CTID <= last.ctid <= MAX_CTID:  # the full path says why (opsctl.config.ctid)
        return None
    spec = targetcache.lookup(last.host)
    if spec is None:
        return None
    step = cmd.agent_step("status")
    pct = cmd.pct_argv(last.ctid, cmd.agent_argv(spec.root, "status", *status_args(job_id, lines)),
                       timeout=STATUS_TIMEOUT_S)
    argv, command = cmd.prepare(spec, pct, timeout=STATUS_TIMEOUT_S, step=step)
    deadline = cmd.local_deadline(STATUS_TIMEOUT_S)
    trace.mark("target")
    result = None
    shape: Shape | None = None
    reading: _Meanwhile | None = None

    def ready_to_read() -> Shape | None:  # what reading the reply needs, loaded
        return reading.result() if reading else _prepare_reading(model, meanwhile)

    if mux_socket.maybe_live(spec):
        from opsctl.remote import mux_client as mux

        if early is not None:
            early.discard()  # a mux came up since the record was kept: it takes the call
        # the human view's readers and output (pydantic, rich: ~150 ms) load in a thread while
        # this one waits on the mux socket; the --json ones (~10 ms) after, not worth a thread
        if model:
            reading = _Meanwhile(lambda: _prepare_reading(model, meanwhile))
        start = time.monotonic()
        reply = mux.call(spec, command, stdin=None, on_stdout=None, on_stderr=None,
                         local_deadline=deadline, argv=argv, what=step)
        if reply is not None:
            result = cmd.CommandResult(tuple(argv), command, reply.rc, reply.stdout, reply.stderr,
                                       time.monotonic() - start, via="mux")
            trace.mark("mux round trip")
            shape = ready_to_read()
            trace.mark("imports" if reading is None else "imports (waited for)")
    cold_host = None
    ssh_argv = known_hosts = None
    if result is None:
        from opsctl.remote import sshcall  # not on the warm path: subprocess, hmac, ssh argv

        call = sshcall.start(spec, command, argv, local_deadline=deadline, what=step, early=early)
        if call is None:
            return None
        with call:
            trace.mark("ssh adopted" if call.adopted else "ssh start")
            shape = ready_to_read()
            trace.mark("imports while ssh runs")
            result = call.result()
        if result is None:
            return None
        trace.mark("ssh wait")
        cold_host = spec
        if not call.adopted:
            ssh_argv, known_hosts = call.ssh_argv, call.known_hosts
    label = f"{spec.label} ct {last.ctid}"
    if result.rc == 0:
        from opsctl.remote import leanreply

        try:
            data = leanreply.reply_data(result.stdout)
            if model:
                from opsctl.remote.models import JobStatus

                return Answer(label, status=JobStatus.model_validate(data), cold_host=cold_host,
                              ssh_argv=ssh_argv, known_hosts=known_hosts)
            if shape is None:
                raise leanreply.Unsure("JobStatus has no shape")
            doc = leanreply.normalize(data, shape)
            trace.mark("parse")
            return Answer(label, doc=doc, cold_host=cold_host, ssh_argv=ssh_argv,
                          known_hosts=known_hosts)
        except leanreply.Unsure:
            pass
    return _finish(last.host, last.ctid, result, accept_new_host_key=accept_new_host_key)


class _Meanwhile:
    """``fn()`` in a daemon thread, started now; :meth:`result` joins it and returns what it
    returned (or raises what it raised). Only imports run there: the GIL is free while the
    calling thread waits on a socket, so they cost the round trip nothing on a remote host."""

    def __init__(self, fn: t.Callable[[], Shape | None]):
        import threading

        self.value: Shape | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.value = fn()
            except BaseException as exc:  # re-raised in the caller's thread
                self.error = exc

        self.thread = threading.Thread(target=run, name="status-imports", daemon=True)
        self.thread.start()

    def result(self) -> Shape | None:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value


def _prepare_reading(model: bool, meanwhile: t.Callable[[], object] | None) -> Shape | None:
    """Load what reading the reply needs, then run the caller's ``meanwhile``; the
    ``JobStatus`` shape for the ``--json`` document (None: ``model``, or no shape).
    """
    shape = None
    if model:
        from opsctl.remote import models  # noqa: F401  (pydantic: the human view validates)
    else:
        from opsctl.remote import leanreply

        try:
            shape = leanreply.cached_shape("JobStatus")
        except leanreply.Unsure:
            shape = None
    if meanwhile is not None:
        meanwhile()
    return shape


def keep_warm(answer: Answer) -> None:
    """Start a mux for the host ``answer`` reached over ssh, for the next command (a no-op
    when it came through a mux, or with ``OPSCTL_MUX=0``); call it once the answer is out."""
    if answer.cold_host is not None and mux_socket.enabled():
        from opsctl.remote import mux_client as mux

        mux.spawn(answer.cold_host)


def _finish(host: str, ctid: int, result: cmd.CommandResult, *,
            accept_new_host_key: bool) -> Answer:
    """The full path's reading of a status command that already ran."""
    from opsctl.ops import jobs
    from opsctl.remote.models import JobStatus

    step = cmd.agent_step("status")
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        checked = tgt.remote.check_deadline(result, timeout=STATUS_TIMEOUT_S, step=step)
        checked = tgt.remote.check_pct_result(ctid, checked, step=step)
        status = JobStatus.model_validate(tgt.agent.answer("status", checked))
    return Answer(tgt.label, status=status)


def remember_launch(words: list[str], answer: Answer) -> None:
    """Keep the launch record of a status that started its own ``ssh`` (:mod:`.launchrecord`),
    with what that argv was derived from; call it once the answer is out."""
    if answer.ssh_argv is None or answer.known_hosts is None or answer.cold_host is None:
        return
    import sys

    from opsctl.remote import launchrecord

    spec = answer.cold_host
    code = [m.__file__ for name, m in list(sys.modules.items())
            if (name == "opsctl" or name.startswith("opsctl.")) and getattr(m, "__file__", None)]
    files = [str(p) for p in targetcache.stamp_paths()] + [
        str(targetcache.path()), str(last_target.path()), str(spec.known_hosts_path()),
        answer.known_hosts, *t.cast(list[str], code)]
    sock = mux_socket.socket_path(spec, create=False) if mux_socket.enabled() else None
    launchrecord.store(words, answer.ssh_argv, files, None if sock is None else str(sock))
