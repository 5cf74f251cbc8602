"""Webhook notifications from the container: a JSON POST per job event to each ``notify`` URL.

Sent from the container side (the job's wrapper, or the agent for a job it finds LOST), so
they arrive while no opsctl client is connected. The standard library's ``urllib.request``
does the POST: the payload runs on the container's python with no extra packages, and a
webhook needs nothing more. Delivery never blocks or fails the job, and one URL never
delays another: each URL has its own queue and thread (:class:`Notifier`), each POST a
short timeout and a few retries within a bounded total time per event (:data:`BUDGET_S`),
and every outcome is one line in the job's ``notify.log``. Every give-up (timeouts, HTTP
errors, the budget spent, a full queue, the wrapper ending first) is a line naming the
event, the URL (scheme, host and port only: :func:`redact`) and the reason. (Why: one
URL that accepted and never answered held every later event, and the answering URL got
nothing, not even ``healthy``.)

Events (``event`` in the body): ``healthy``, ``failed``, ``finished`` (SUCCEEDED or
CANCELLED), ``lost``, ``restart``, ``hang``. Body (docs/contracts.md)::

    {"event": "failed", "job": id, "name": str, "host": str|null, "ct": int|null,
     "state": "FAILED", "diagnosis": str|null, "last_step": int|null, "attempt": int,
     "max_restarts": int|null, "exit_code": int|null, "signal": str|null,
     "end_reason": str|null, "at": float}

A LOST job's wrapper is gone, so the next agent verb that reconciles it sends ``lost`` once
(``notify_lost``, marker ``notify.lost``) from a detached process, so that ``status`` never waits
on a webhook.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
import typing as t
import urllib.error
import urllib.request

from remote_payload import safe_write, wire

LOG = "notify.log"
LOST_MARKER = "notify.lost"  # the agent sent (or is sending) the LOST notification
TIMEOUT_S = 5.0  # one try
TRIES = 3
RETRY_PAUSE_S = 1.0  # doubled after each failed try
BUDGET_S = 20.0  # one event to one URL, every try and pause together: then it is given up
QUEUE_MAX = 32  # events waiting for one URL; one more is given up ("queue full")
DRAIN_S = 15.0  # how long a wrapper that ends waits for its notifications to go out
LOST_DRAIN_S = BUDGET_S + 5.0  # the detached ``lost`` sender has nothing else to do
USER_AGENT = "opsctl-agent"

EVENT_HEALTHY = "healthy"
EVENT_FAILED = "failed"
EVENT_FINISHED = "finished"
EVENT_LOST = "lost"
EVENT_RESTART = "restart"
EVENT_HANG = "hang"


valid_url = wire.valid_notify_url


def _log(job_dir: str, line: str) -> None:
    with contextlib.suppress(OSError):  # a full disk or a planted link costs the log line only
        safe_write.append_text(os.path.join(job_dir, LOG),
                               f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def redact(url: str) -> str:
    """``url`` as a log may show it: scheme, host and port only. A webhook's path or query
    often *is* its secret (Slack's ``/services/T…/B…/X…``, ``?token=``), and a user:password
    too, so none of them reach ``notify.log``; the URL's position in the list tells them apart."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port is not None else ""
        scheme = parts.scheme
    except ValueError:
        return "<unparsable URL>"
    host = f"[{host}]" if ":" in host else host
    rest = "/…" if (parts.path not in ("", "/") or parts.query or parts.fragment) else ""
    return f"{scheme}://{host}{port}{rest}"


def _scrub(text: str, url: str) -> str:
    """``text`` (an exception's words) without any piece of ``url`` that :func:`redact` hides."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        secrets = [url, parts.path, parts.query, parts.fragment, parts.netloc.rpartition("@")[0]]
    except ValueError:
        secrets = [url]
    for piece in sorted((p for p in secrets if len(p) > 1), key=len, reverse=True):
        text = text.replace(piece, "…")
    return text


def post(url: str, body: dict[str, t.Any], job_dir: str, *, tries: int | None = None,
         timeout: float | None = None, pause: float | None = None, budget: float | None = None,
         label: str | None = None, cancelled: threading.Event | None = None) -> bool:
    """POST ``body`` as JSON; True when a 2xx came back. Every outcome goes to ``notify.log``
    (the URL as :func:`redact` shows it, or ``label``), a give-up always with its reason.

    ``budget``: every try, timeout and pause together; then the event is given up.
    ``cancelled``: set by :meth:`Notifier.drain` when it gave up waiting (it logged the
    give-up itself): no more tries, no more lines.
    """
    tries = TRIES if tries is None else tries
    timeout = TIMEOUT_S if timeout is None else timeout
    pause = RETRY_PAUSE_S if pause is None else pause
    budget = BUDGET_S if budget is None else budget
    label = label or redact(url)
    event = body.get("event")
    data = wire.dumps_strict(body, separators=(",", ":")).encode()  # a webhook gets strict JSON
    end = time.monotonic() + budget
    why = "no try was made"
    for n in range(1, tries + 1):
        left = end - time.monotonic()
        if left <= 0:
            why = f"{why}; its {budget:g} s for this event are spent"
            break
        req = urllib.request.Request(url, data=data, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": USER_AGENT})
        try:
            with urllib.request.urlopen(req, timeout=min(timeout, left)) as resp:  # valid_url: http(s) only
                code = resp.status
            if 200 <= code < 300:
                if not (cancelled and cancelled.is_set()):
                    _log(job_dir, f"sent {event} to {label}: HTTP {code}")
                return True
            why = f"HTTP {code}"
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}"
        except Exception as exc:  # URLError, timeout, connection reset...: logged, never raised
            why = _scrub(f"{type(exc).__name__}: {exc}", url)
        if cancelled and cancelled.is_set():
            return False
        _log(job_dir, f"try {n}/{tries}: {event} to {label} failed: {why}")
        if n < tries:
            left = end - time.monotonic()
            if left <= 0:
                why = f"{why}; its {budget:g} s for this event are spent"
                break
            time.sleep(min(pause * 2 ** (n - 1), left))
    else:
        why = f"{why} ({tries} tries)"
    if not (cancelled and cancelled.is_set()):
        _log(job_dir, f"gave up on {event} to {label}: {why}")
    return False


def body(event: str, *, spec: t.Mapping[str, t.Any], status: t.Mapping[str, t.Any],
         diagnosis: str | None = None) -> dict[str, t.Any]:
    """The notification document for ``event`` from the job's spec and status record."""
    target = spec.get("target") or {}
    step = (status.get("last_step") or {}).get("step")
    return {
        "event": event, "job": spec.get("job_id"), "name": spec.get("name"),
        "host": target.get("host"), "ct": target.get("ct"), "state": status.get("state"),
        "diagnosis": diagnosis, "last_step": step, "attempt": status.get("attempt") or 1,
        "max_restarts": (spec.get("restart") or {}).get("max_restarts"),
        "exit_code": status.get("exit_code"), "signal": status.get("signal"),
        "end_reason": status.get("end_reason"), "at": time.time(),
    }


class _Sender:
    """One URL's worker: its own queue and thread, so one URL that never answers delays
    nothing sent to the others; its events go out in order."""

    def __init__(self, url: str, index: int, job_dir: str):
        self.url = url
        self.label = f"webhook {index} ({redact(url)})"
        self.job_dir = job_dir
        self.queue: queue.Queue[dict[str, t.Any] | None] = queue.Queue()
        self.lock = threading.Lock()
        self.pending: list[dict[str, t.Any]] = []  # queued or being sent, oldest first
        self.cancelled = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"notify-{index}", daemon=True)

    def put(self, doc: dict[str, t.Any]) -> None:
        with self.lock:
            if self.cancelled.is_set():
                self._gave_up(doc, "the wrapper is ending")
                return
            if len(self.pending) >= QUEUE_MAX:
                self._gave_up(doc, f"queue full ({QUEUE_MAX} events wait for this URL)")
                return
            self.pending.append(doc)
            if not self.thread.is_alive() and self.thread.ident is None:
                self.thread.start()
        self.queue.put(doc)

    def _gave_up(self, doc: dict[str, t.Any], why: str) -> None:
        _log(self.job_dir, f"gave up on {doc.get('event')} to {self.label}: {why}")

    def _run(self) -> None:
        while True:
            doc = self.queue.get()
            if doc is None:
                return
            try:
                if not self.cancelled.is_set():
                    post(self.url, doc, self.job_dir, label=self.label, cancelled=self.cancelled)
            except Exception as exc:  # a notifier bug must never take the wrapper down
                _log(self.job_dir, f"notifier error for {self.label}: {type(exc).__name__}")
            finally:
                with self.lock:
                    self.pending = [d for d in self.pending if d is not doc]

    def close(self) -> None:
        self.queue.put(None)

    def abandon(self, why: str) -> None:
        """Stop waiting: every event not yet delivered is one give-up line."""
        with self.lock:
            self.cancelled.set()
            left, self.pending = self.pending, []
        for doc in left:
            self._gave_up(doc, why)


class Notifier:
    """The wrapper's sender: one worker per URL (:class:`_Sender`), each posting its own
    queue in order, each event bounded by :data:`BUDGET_S` per URL."""

    def __init__(self, urls: t.Sequence[str], job_dir: str):
        self.urls = [u for u in urls if valid_url(u)]
        self.job_dir = job_dir
        self.senders = [_Sender(u, i, job_dir) for i, u in enumerate(self.urls, 1)]

    def send(self, doc: dict[str, t.Any]) -> None:
        """Queue ``doc`` for every URL; returns at once."""
        for sender in self.senders:
            sender.put(doc)

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Wait (``timeout`` in all, the URLs in parallel) for queued notifications before the
        wrapper exits; what is still undelivered then is one give-up line per event and URL."""
        started = [s for s in self.senders if s.thread.ident is not None]
        for sender in started:
            sender.close()
        end = time.monotonic() + timeout
        for sender in started:
            sender.thread.join(max(0.0, end - time.monotonic()))
        for sender in started:
            if sender.thread.is_alive() or sender.pending:
                sender.abandon(f"still undelivered when the sender ended ({timeout:g} s wait)")


def notify_lost(job_dir: str, urls: t.Sequence[str], doc: dict[str, t.Any]) -> bool:
    """Send ``lost`` once for a job whose wrapper is gone, from a detached process.

    The marker is created exclusively, so two agents reconciling at once send it once.
    Returns whether this call started the sender.
    """
    urls = [u for u in urls if valid_url(u)]
    if not urls:
        return False
    try:
        fd = os.open(os.path.join(job_dir, LOST_MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    os.close(fd)
    import subprocess

    payload = json.dumps({"urls": urls, "body": doc}).encode()
    payload_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": payload_dir}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "remote_payload.agent.notify", job_dir],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        if proc.stdin is None:  # unreachable: stdin=PIPE
            raise OSError("the sender has no stdin pipe")
        proc.stdin.write(payload)
        proc.stdin.close()
    except OSError as exc:
        _log(job_dir, f"could not start the lost notification sender: {exc}")
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python3 -m remote_payload.agent.notify JOB_DIR`` with ``{"urls", "body"}`` on stdin."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python3 -m remote_payload.agent.notify JOB_DIR < request.json\n")
        return 2
    try:
        req = json.loads(sys.stdin.buffer.read() or b"{}")
    except ValueError:
        return 2
    urls = req.get("urls") if isinstance(req, dict) else None
    doc = req.get("body") if isinstance(req, dict) else None
    if not isinstance(urls, list) or not isinstance(doc, dict):
        return 2
    notifier = Notifier(urls, args[0])
    notifier.send(doc)
    notifier.drain(LOST_DRAIN_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
